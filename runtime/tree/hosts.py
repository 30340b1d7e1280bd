"""The standard-name tree a researcher navigates: hosts, host lists and value handles.

``model.layers[3].self_attn`` is a :class:`Host` (a native module under its standard name);
``model.layers[3].self_attn.attention_queries`` is a :class:`Value` handle. A handle reads
nothing by itself: inside a trace, ``.save()``, assignment and in-place edits record
requests that the forward serves.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import torch

from ..errors import InputError, NnatlasError, Unavailable, UnknownName
from ..inputs.validate import check_edit
from ..spec import HostSpec, ReadPoint, ValueSpec, pattern_of  # noqa: F401 (loading's)
from ..trace.placeholders import Placeholder, placeholder
from ..trace.protocols import WrappedModel
from ..trace.requests import Box, Expr, Request, Target
from ..trace.tracer import Tracer
from . import foreign_names


class ModelRoot(WrappedModel, Protocol):
    """What a host and a value handle use of the model at the root of their tree (:class:`nnatlas.AtlasModel`,
    a layer above): the specs that apply at a path, child hosts, config entries, the open trace, and each
    value's site and availability."""

    @property
    def _tracer(self) -> Tracer | None: ...

    def _specs_for(self, pattern: str, index: int | None) -> list[HostSpec]: ...

    def _value_spec(self, pattern: str, index: int | None, name: str) -> ValueSpec | None: ...

    def _host(self, module: torch.nn.Module, label: str, pattern: str) -> Host | HostList: ...

    def _config_value(self, name: str) -> Any: ...

    def _explain_missing(self, host: Host, name: str) -> None: ...

    def _active_tracer(self, label: str) -> Tracer: ...

    def _target(self, value: Value, edit: bool = False) -> Target: ...

    def _why_unavailable(self, value: Value, edit: bool = False) -> Unavailable | None: ...


BOUNDARIES = {
    "input": ReadPoint("module", "input", "the module's own input", side="input"),
    "inputs": ReadPoint("module", "inputs", "the module's own inputs (args, kwargs)", side="inputs"),
    "output": ReadPoint("module", "output", "the module's own output", side="output"),
}


def step(node: Host | HostList | None, part: str) -> Host | HostList | None:
    """The child a part of a spec path names: ``mlp``, or ``self_attn[1]``, the item of a list child; None
    where there is none (no such child, or an index past the list's end)."""
    if node is None:
        return None
    name, bracket, index = part.partition("[")
    found = node._child(name)
    if not bracket:
        return found
    index = index.rstrip("]")
    if not isinstance(found, HostList) or not index.isdigit() or int(index) >= len(found):
        return None
    return found[int(index)]


def resolve_native(root: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    node: Any = root
    for part in dotted.split("."):
        node = node._modules.get(part) if isinstance(node, torch.nn.Module) else None
        if node is None:
            return None
    return node  # type: ignore[no-any-return]


class Host:
    """A native module under its standard name, with the values its family serves there."""

    _model: ModelRoot
    _module: torch.nn.Module
    _label: str
    _pattern: str
    _index: int | None

    def __init__(self, model: ModelRoot | None, module: torch.nn.Module, label: str, pattern: str,
                 index: int | None = None):
        d = self.__dict__  # (__setattr__ is for assigning values)
        d["_model"] = model if model is not None else self
        d["_module"], d["_label"], d["_pattern"], d["_index"] = module, label, pattern, index
        d["_parent"] = None  # the host this one was reached from (``^.`` reads climb to it)
        d["_kids"] = {}  # name -> (native path, child host): children found once, checked on each use

    # -- what applies here --
    def _block_index(self) -> int | None:
        """The block this host is in: its own index, else its parent's (``layers[3].mlp`` is in
        block 3, so a nested host's ``when`` is decided per block)."""
        if self._index is not None:
            return self._index
        parent = self.__dict__.get("_parent")
        return parent._block_index() if parent is not None else None

    def _specs(self) -> list[HostSpec]:
        return self._model._specs_for(self._pattern, self._block_index())

    def _value_names(self) -> list[str]:
        return [v.name for s in self._specs() for v in s.values]

    def _child(self, name: str) -> Host | HostList | None:
        """The child host ``name`` (a standard name the family renames, or a native child), made
        once and reused while the native path still leads to the same module (a replaced native
        submodule gets a new host)."""
        hit = self._kids.get(name)
        if hit is not None:
            parts, child = hit
            node: Any = self._module
            for part in parts:
                node = node._modules.get(part)
                if node is None:
                    break
            if node is child._module:
                return child  # type: ignore[no-any-return]
        model = self._model
        key = name if self._pattern == "model" else f"{self._pattern}.{name}"
        natives = model._family.rename.get(key)
        for native in natives or (name,):
            found = resolve_native(self._module, native)
            if found is not None:
                made = model._host(found, self._join(name), key)
                made._parent = self
                self._kids[name] = (tuple(native.split(".")), made)
                return made
        return None

    def _join(self, name: str) -> str:
        return name if self._pattern == "model" else f"{self._label}.{name}"

    def _up(self, levels: int, what: str) -> Host:
        """The host ``levels`` above this one (``^.`` in a read point: 1 is the parent)."""
        node: Host = self
        for _ in range(levels):
            parent = node.__dict__["_parent"]
            if parent is None:
                raise NnatlasError(f"{what}: {node._label or 'model'} has no parent host to read '^.' from")
            node = parent
        return node

    def _resolve_module(self, path: tuple[str, ...], what: str) -> torch.nn.Module:
        node: Host | HostList = self
        for part in path:
            if isinstance(node, HostList):  # a list child indexed in the read (input_layernorm.0.output)
                if not part.isdigit() or int(part) >= len(node):
                    raise UnknownName(f"{what}: {node._label} is a list of {len(node)} modules: index it with a "
                                      f"number from 0 to {len(node) - 1} ({'.'.join(path)})")
                node = node[int(part)]
                continue
            nxt = node._child(part)
            if nxt is None:
                parent = self.__dict__["_parent"] if node is self else None
                if parent is not None and parent._child(part) is not None:
                    raise UnknownName(f"{what}: '{part}' is not inside {self._label} ({type(self._module).__name__}): "
                                      f"the read leaves its host; '{part}' is a sibling (a child of "
                                      f"{parent._label or 'model'}): read it as ^.{'.'.join(path)}...")
                raise UnknownName(f"{what}: {self._label or 'model'} has no child module '{part}'")
            node = nxt
        if not isinstance(node, Host):
            raise NnatlasError(f"{what}: {'.'.join(path)} is a list of modules; index it")
        return node._module

    def _standard_names(self) -> list[str]:
        prefix = "" if self._pattern == "model" else f"{self._pattern}."
        kids = [k[len(prefix):] for k in self._model._family.rename if k.startswith(prefix) and "." not in k[len(prefix):]]
        return [*self._value_names(), *kids, *self._module._modules, "input", "inputs", "output"]

    # -- attribute protocol --
    def _config_name(self, name: str) -> str | None:
        """``model.vision.num_heads`` is the family's config entry ``vision_num_heads`` (and
        ``model.vision.vision_hidden_size`` is ``vision_hidden_size``): entries named after a host."""
        if self._index is not None or self._pattern == "model" or "[" in self._pattern:
            return None
        prefix = self._pattern.replace(".", "_") + "_"
        config = self._model._family.config
        for key in (prefix + name, name if name.startswith(prefix) else None):
            if key is not None and key in config:
                return key
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._kids:  # a child found before (names are static: nothing else can claim it since)
            child = self._child(name)
            if child is not None:
                return child
        key = self._config_name(name)
        if key is not None:
            return self._model._config_value(key)
        v = self._model._value_spec(self._pattern, self._block_index(), name)
        if v is not None or name in BOUNDARIES:
            # a handle is made once per host and kept in its __dict__: the next lookup is Python's own
            handle = Value(self, name, v, v.read) if v is not None else Value(self, name, None, BOUNDARIES[name])
            self.__dict__[name] = handle
            return handle
        child = self._child(name)
        if child is not None:
            return child
        if self._model is not self and name in self._model._family.config:
            return self._model._config_value(name)  # every host shows the normalized config: moe.top_k
        self._model._explain_missing(self, name)
        foreign = foreign_names.hint(self, name)  # a TransformerLens or SAE name: say what it stands for
        close = difflib.get_close_matches(name, self._standard_names(), n=4, cutoff=0.5)
        hint = f"; {foreign}" if foreign else f"; nearest: {', '.join(close)}" if close else ""
        raise UnknownName(f"{self._label or 'model'} ({type(self._module).__name__}) has no value or module '{name}'{hint}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        handle = getattr(self, name)
        if not isinstance(handle, Value):
            raise AttributeError(f"{name} is a module, not a value; assign to one of its values")
        handle._assign(value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._standard_names()))

    def __repr__(self) -> str:
        return f"<{self._label or 'model'}: {type(self._module).__name__}>"


H = TypeVar("H", bound=Host)


class HostList(Generic[H]):
    """A ModuleList under its standard name: ``model.layers[i]``."""

    def __init__(self, model: ModelRoot, module: torch.nn.ModuleList, label: str, pattern: str):
        self._model, self._module, self._label, self._pattern = model, module, label, pattern
        self._parent: Host | None = None  # the host holding the list: each block's parent
        self._hosts: dict[int, H] = {}  # index -> host, reused while the list holds the same module

    def __len__(self) -> int:
        return len(self._module)

    def __getitem__(self, i: int) -> H:
        if not isinstance(i, int):
            raise TypeError(f"{self._label}[...] takes one integer index")
        n = len(self._module)
        if not -n <= i < n:
            raise IndexError(f"{self._label}[{i}]: there are {n} ({self._label}[0] to {self._label}[{n - 1}])")
        i %= n
        # a ModuleList keys its modules "0", "1", ... (ModuleList.__getitem__ without its index arithmetic)
        module = self._module._modules[str(i)]
        host = self._hosts.get(i)
        if host is None or host._module is not module:
            # a list inside a block (LongCat-Flash's self_attn: layers[3].self_attn[1]) holds fixed items, each its
            # own spec path (layers[i].self_attn[1]) in the block of its parent; a stack's items are its blocks
            inside = self._parent is not None and self._parent._block_index() is not None
            pattern, index = (f"{self._pattern}[{i}]", None) if inside else (f"{self._pattern}[i]", i)
            host = self._hosts[i] = Host(self._model, module, f"{self._label}[{i}]",  # type: ignore[assignment]
                                         pattern, index)
            host.__dict__["_parent"] = self._parent
        return host  # type: ignore[return-value]

    def __iter__(self) -> Iterator[H]:
        hosts = self._hosts
        for i, module in enumerate(self._module._modules.values()):  # (the order of ModuleList's keys "0", "1", ...)
            host = hosts.get(i)
            yield host if host is not None and host._module is module else self[i]

    def _child(self, name: str) -> None:
        return None

    def __repr__(self) -> str:
        return f"<{self._label}: {len(self)} x {type(self._module[0]).__name__ if len(self) else 'empty'}>"


def _lazy_binop(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[Any, Any], LazyExpr]:
    def method(self: Any, other: Any) -> LazyExpr:
        a, b = self._node(), _node(other)
        return LazyExpr(Expr(op, (b, a) if reflected else (a, b)))
    return method


def _node(x: Any) -> Any:
    if isinstance(x, Value | LazyExpr):
        return x._node()
    if isinstance(x, list | tuple):
        return type(x)(_node(i) for i in x)
    return x


class _Lazy:
    """Arithmetic and torch functions on handles build deferred expressions."""

    def _node(self) -> Any:
        raise NotImplementedError

    __add__ = _lazy_binop(operator.add)
    __radd__ = _lazy_binop(operator.add, True)
    __sub__ = _lazy_binop(operator.sub)
    __rsub__ = _lazy_binop(operator.sub, True)
    __mul__ = _lazy_binop(operator.mul)
    __rmul__ = _lazy_binop(operator.mul, True)
    __truediv__ = _lazy_binop(operator.truediv)
    __rtruediv__ = _lazy_binop(operator.truediv, True)
    __matmul__ = _lazy_binop(operator.matmul)
    __pow__ = _lazy_binop(operator.pow)

    def __neg__(self) -> LazyExpr:
        return LazyExpr(Expr(operator.neg, (self._node(),)))

    # comparisons build masks of the forward's values: ``moe.expert_indices == e``
    __eq__ = _lazy_binop(operator.eq)  # type: ignore[assignment]
    __ne__ = _lazy_binop(operator.ne)  # type: ignore[assignment]
    __lt__ = _lazy_binop(operator.lt)
    __le__ = _lazy_binop(operator.le)
    __gt__ = _lazy_binop(operator.gt)
    __ge__ = _lazy_binop(operator.ge)
    __hash__ = object.__hash__

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> LazyExpr:
        return LazyExpr(Expr(func, _node(tuple(args)), {k: _node(v) for k, v in (kwargs or {}).items()}))


class LazyExpr(_Lazy):
    """A deferred expression over values of the trace (``model.layers[1].output * 2``)."""

    def __init__(self, expr: Expr):
        self._expr = expr

    def _node(self) -> Expr:
        return self._expr

    def __getitem__(self, key: Any) -> LazyExpr:
        return LazyExpr(Expr(operator.getitem, (self._expr, key)))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _lazy_attr(self._expr, name)

    def __repr__(self) -> str:
        return "<deferred expression: computed during the forward>"

    def __bool__(self) -> bool:
        raise NnatlasError("a deferred expression has no truth value while the trace body runs; compute it after "
                           "the trace, or use it as a tensor (masked_fill, where) inside the forward")


def _lazy_attr(node: Any, name: str) -> Any:
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        raise AttributeError(f"tensors have no attribute '{name}'")
    if callable(attr):
        def method(*args: Any, **kwargs: Any) -> LazyExpr:
            return LazyExpr(Expr(lambda t, *a, **k: getattr(t, name)(*a, **k), (node, *_node(args)),
                                 {k: _node(v) for k, v in kwargs.items()}))
        return method
    return LazyExpr(Expr(lambda t: getattr(t, name), (node,)))


_HOLDER_DTYPES = {"long": torch.long, "bool": torch.bool}
# an empty tensor of each holder dtype: ``new()`` of one is the cheapest fresh tensor to make (a third of
# ``torch.Tensor()``'s time), with its own storage and version counter
_EMPTY = {dtype: torch.empty(0, dtype=dtype) for dtype in (torch.float32, *_HOLDER_DTYPES.values())}
_make_subclass = torch.Tensor._make_subclass


def _placeholder(kind: Any, label: str) -> Any:
    """What ``save()`` returns: a tensor whose ``.data`` the forward points at the value (a
    :class:`~nnatlas.trace.placeholders.Placeholder` until the block ends), or a :class:`Box` for a value that is not one."""
    return Box(label) if kind is Box else placeholder(_EMPTY[kind], label)


class Value(_Lazy):
    """A handle on one value of one host: save it, assign it, edit it in place."""

    _host: Host
    _name: str
    _spec: ValueSpec | None
    _read: ReadPoint
    _extra: tuple[Any, ...]

    def __init__(self, host: Host, name: str, spec: ValueSpec | None, read: ReadPoint, extra: tuple[Any, ...] = ()):
        d = self.__dict__  # (__setattr__ refuses: a value is assigned on its host)
        d["_host"], d["_name"], d["_spec"], d["_read"], d["_extra"] = host, name, spec, read, extra

    @property
    def label(self) -> str:
        d = self.__dict__
        label: str | None = d.get("_label")
        if label is None:
            label = f"{self._host._label}.{self._name}" if self._host._label else self._name
            for e in self._extra:
                label += f"[{e!r}]"
            d["_label"] = label
        return label

    def _tracer(self) -> Tracer:
        model = self._host._model
        return model._tracer or model._active_tracer(self.label)

    def _target(self, edit: bool = False) -> Target:
        return self._host._model._target(self, edit)

    def _node(self) -> Request:
        tracer = self._tracer()
        if self._read.kind == "derived":
            return self._derived(tracer, "capture")
        return tracer.add(self.label, "capture", self._target())

    def _derived(self, tracer: Tracer, action: str, holder: Any = None) -> Request:
        spec = self._spec
        assert spec is not None and spec.read.derive is not None
        model = self._host._model
        d = self.__dict__
        plan = d.get("_derive_plan")
        if plan is None:
            # the config entries it reads, and the handles of the values it is derived from: static
            # (a handle is kept on its host), found once; the entries' values are read on each use
            config = model._family.config
            consts = tuple(dep for dep in spec.read.deps if dep in config)
            found = [(dep, getattr(model, dep[len("model."):]) if dep.startswith("model.") else getattr(self._host, dep))
                     for dep in spec.read.deps if dep not in consts]
            plan = d["_derive_plan"] = (consts, tuple((dep, handle, handle.label) for dep, handle in found))
        consts, handles = plan
        derive = spec.read.derive
        if consts:
            base = derive
            values = {c: model._config_value(c) for c in consts}

            def derive(v: Any, base: Any = base, consts: dict[str, Any] = values) -> Any:
                return base({**v, **consts})
        if spec.needs is not None:
            why = model._why_unavailable(self)
            if why is not None:
                raise why
        seq, step = tracer.seq, tracer.current_step
        tracer.seq = seq + 1
        deps: list[Request] = []
        owner = Request(seq, self.label, "derived", None, holder, step, derive=derive, ordered=False, deps=deps)
        requests = tracer.requests
        requests.append(owner)
        for dep, handle, label in handles:  # (Tracer.add, inlined: each input a capture of the owner's seq)
            target = model._target(handle)
            r = Request(seq, label, "capture", target, dep, step,
                        tracer.current_call if target.per_call else target.call, owner=owner, ordered=False)
            deps.append(r)
            requests.append(r)
        return owner

    def save(self, local: bool = False) -> Any:
        """The value, once the forward computed it: a tensor (a view, no copy) or a :class:`Box`.

        On a tensor-parallel model the value is the full one on every rank (gathered from the ranks' shards);
        ``local=True`` gives the rank's own shard, without communication, its ``tp_shard`` naming the sharded
        axis (see :mod:`nnatlas.parallel.tensor_parallel`). On a model that is not sharded it is the whole value."""
        d = self.__dict__
        host = d["_host"]
        model = host._model
        tracer = model._tracer or model._active_tracer(self.label)
        if local:
            return self._save_local(tracer)
        fast = d.get("_fast_save")
        if fast is not None:  # saved before: (target, empty holder or None for a Box, path, scoped, call)
            target, empty, parts, scoped, call = fast
            if parts is not None:  # the path from the host must still lead to the same module
                node: torch.nn.Module | None = host._module
                for part in parts:
                    node = node._modules.get(part)  # type: ignore[union-attr]  # (None ends the walk)
                    if node is None:
                        break
            if (parts is None or node is target.module) and (scoped is None or self._available(tracer, scoped)):
                holder: Any
                if empty is not None:  # (placeholder(), inlined)
                    holder = _make_subclass(Placeholder, empty.new())
                    holder.__dict__["_nnatlas_label"] = target.label
                else:
                    holder = Box(target.label)
                seq = tracer.seq
                tracer.requests.append(Request(seq, target.label, "save", target, holder, tracer.current_step,
                                               tracer.current_call if call is None else call))
                tracer.seq = seq + 1
                return holder
        kind = d.get("_kind")
        if kind is None:
            kind = d["_kind"] = self._holder_kind()  # (static: the value's layout and read point)
        holder = _placeholder(kind, self.label)
        if self._read.kind == "derived":
            self._derived(tracer, "save", holder)
            return holder
        target = model._target(self)
        tracer.add(self.label, "save", target, holder)
        spec = self._spec
        cached = d.get("_cached_target")
        if cached is not None and cached[0] is target and (spec is None or spec.read.kind != "missing"):
            # a value with a load condition keeps whether its condition's module is the target's
            # (an interface call, an operation, a method: the module whose forward it is read in)
            scoped = None if spec is None or spec.needs is None else self._read.kind in ("call", "op", "method")
            d["_fast_save"] = (target, None if kind is Box else _EMPTY[kind],
                               None if cached[1] is None else tuple(cached[1].split(".")), scoped,
                               None if target.per_call else target.call)
        return holder

    def _save_local(self, tracer: Tracer) -> Any:
        """``save(local=True)``: the rank's shard of the value on a tensor-parallel model."""
        if self._read.kind == "derived":
            raise NnatlasError(f"{self.label} is derived from other values: save it whole (save()), or save the "
                               "values it is computed from with local=True")
        kind = self.__dict__.get("_kind")
        if kind is None:
            kind = self.__dict__["_kind"] = self._holder_kind()
        holder = _placeholder(kind, self.label)
        target = self._host._model._target(self)
        if target.sharded:
            local = target.__dict__.get("_local_twin")
            if local is None:
                local = target.__dict__["_local_twin"] = target.local_copy()  # type: ignore[attr-defined]
            target = local
        tracer.add(self.label, "save", target, holder)
        return holder

    def _available(self, tracer: Tracer, scoped: bool) -> bool:
        """Whether this load serves the value, a load condition decided once per trace for each
        (read point, condition, config): the same for every layer's copy of a value. A value it
        does not serve takes the full path (which raises its :class:`Unavailable`)."""
        module = self.__dict__["_fast_save"][0].module if scoped else self._host._module
        spec = self._spec
        assert spec is not None
        key = (id(self._read), id(spec.needs), id(getattr(module, "config", None) or self._host._model.config))
        available = tracer.available
        if available is None:
            available = tracer.available = set()
        elif key in available:
            return True
        if self._host._model._why_unavailable(self) is not None:
            return False
        available.add(key)
        return True

    def _holder_kind(self) -> Any:
        """What a saved value comes back in: :class:`Box` (not a tensor, or maybe None), or a tensor's dtype."""
        whole_inputs = self._read.side == "inputs" and not self._read.access and not self._extra
        spec = self._spec
        if spec is None:
            return Box if whole_inputs else torch.float32
        layout = spec.layout
        if layout.dtype == "object" or layout.optional or whole_inputs:
            return Box
        return _HOLDER_DTYPES.get(layout.dtype, torch.float32)

    def _writable(self) -> None:
        if self._read.kind == "derived":
            raise NnatlasError(f"{self.label} is derived from other values and read-only; edit what it is derived from")
        why = self._spec.readonly_why if self._spec else None
        if why:
            raise NnatlasError(f"{self.label} is read-only: {why}")
        if self._spec is not None and self._spec.edit == "none":
            raise NnatlasError(f"{self.label} is read-only: it records what ran (an edit could reach nothing)")

    def _assign(self, value: Any) -> None:
        self._writable()
        tracer = self._tracer()
        value = check_edit(self, tracer, value)
        tracer.add(self.label, "replace", self._target(edit=True), _node(value))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._writable()
        tracer = self._tracer()
        value = check_edit(self, tracer, value, key, setitem=True)
        tracer.add(self.label, "setitem", self._target(edit=True), (key, _node(value)))

    def __getitem__(self, key: Any) -> Value:
        spec = self._spec
        if spec is not None and spec.layout.dtype != "object" and any(
                isinstance(k, str) for k in (key if isinstance(key, tuple) else (key,))):
            raise InputError(f"{self.label}[{key!r}]: a tensor is indexed by integers, slices, tensors or ..., "
                             f"not a string ({self.label} is {spec.layout.text})")
        return Value(self._host, self._name, self._spec, self._read, (*self._extra, key))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _lazy_attr(self._node(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self.label} is a value; assign it on its host ({self._host._label}.{self._name} = ...)")

    def __bool__(self) -> bool:
        raise NnatlasError(f"{self.label} has no value while the trace body runs; save it and use it after the trace")

    def __repr__(self) -> str:
        layout = f" {self._spec.layout.text}" if self._spec else ""
        return f"<value {self.label}{layout}>"

    def unavailable(self) -> Unavailable | None:
        """Why this load cannot serve the value, or None."""
        return self._host._model._why_unavailable(self)
