"""A value handle: one value of one host (``model.layers[3].self_attn.attention_queries``). A handle reads
nothing by itself: inside a trace, ``.save()``, assignment and in-place edits record requests that the forward
serves; arithmetic on it builds a deferred expression (:mod:`nnatlas.tree.lazy`)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..errors import InputError, NnatlasError, Unavailable
from ..inputs.validate import check_edit
from ..spec import HostSpec, ReadPoint, ValueSpec
from ..trace.placeholders import Placeholder, placeholder
from ..trace.protocols import WrappedModel
from ..trace.requests import Box, Request, Target
from ..trace.tracer import Tracer
from .lazy import _Lazy, _lazy_attr, _node


class ValueRoot(WrappedModel, Protocol):
    """What a value handle uses of the model at the root of its tree (:class:`nnatlas.AtlasModel`, a layer above):
    the open trace, config entries, and each value's site and availability."""

    @property
    def _tracer(self) -> Tracer | None: ...

    def _config_value(self, name: str) -> Any: ...

    def _active_tracer(self, label: str) -> Tracer: ...

    def _target(self, value: Value, edit: bool = False) -> Target: ...

    def _why_unavailable(self, value: Value, edit: bool = False) -> Unavailable | None: ...


class ValueHost(Protocol):
    """What a value handle uses of its host (:class:`nnatlas.tree.hosts.Host`): its model, native module, label
    and the specs that apply there (the values a derived value reads are found on it by name)."""

    @property
    def _model(self) -> ValueRoot: ...

    @property
    def _module(self) -> torch.nn.Module: ...

    @property
    def _label(self) -> str: ...

    def _specs(self) -> list[HostSpec]: ...


_HOLDER_DTYPES = {"long": torch.long, "bool": torch.bool}
# an empty tensor of each holder dtype: ``new()`` of one is the cheapest fresh tensor to make (a third of
# ``torch.Tensor()``'s time), with its own storage and version counter
_EMPTY = {dtype: torch.empty(0, dtype=dtype) for dtype in (torch.float32, *_HOLDER_DTYPES.values())}


def _placeholder(kind: Any, label: str) -> Any:
    """What ``save()`` returns: a tensor whose ``.data`` the forward points at the value (a
    :class:`~nnatlas.trace.placeholders.Placeholder` until the block ends), or a :class:`Box` for a value that is not one."""
    return Box(label) if kind is Box else placeholder(_EMPTY[kind], label)


class Value(_Lazy):
    """A handle on one value of one host: save it, assign it, edit it in place."""

    _host: ValueHost
    _name: str
    _spec: ValueSpec | None
    _read: ReadPoint
    _extra: tuple[Any, ...]

    def __init__(self, host: ValueHost, name: str, spec: ValueSpec | None, read: ReadPoint, extra: tuple[Any, ...] = ()):
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
        fast = d.get("_fast_save")
        if fast is not None and not local:
            # saved before: (target, empty holder or None for a Box, path, scoped, call, quick, the model's __dict__)
            target, empty, parts, scoped, call, quick, md = fast
            tracer = md["_tracer"] or d["_host"]._model._active_tracer(self.label)
            if parts is not None:  # the path from the host must still lead to the same module
                node: torch.nn.Module | None = d["_host"]._module
                for part in parts:
                    node = node._modules.get(part)  # type: ignore[union-attr]  # (None ends the walk)
                    if node is None:
                        break
            if (parts is None or node is target.module) and (scoped is None or self._available(tracer, scoped)):
                holder: Any
                if empty is not None:  # (placeholder(), inlined)
                    holder = empty.new()
                    holder.__class__ = Placeholder
                    holder.__dict__["_nnatlas_label"] = target.label
                    if quick and not tracer.requests and not tracer.current_step:
                        # a plain save while the body has asked nothing else: recorded without a request (the
                        # tracer makes it one when the block ends, unless it replays the trace: nnatlas.trace.replay)
                        tracer._quick += (target, holder)
                        tracer.seq += 1
                        return holder
                else:
                    holder = Box(target.label)
                seq = tracer.seq
                tracer.requests.append(Request(seq, target.label, "save", target, holder, tracer.current_step,
                                               tracer.current_call if call is None else call))
                tracer.seq = seq + 1
                return holder
        host = d["_host"]
        model = host._model
        tracer = model._tracer or model._active_tracer(self.label)
        if local:
            return self._save_local(tracer)
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
                               None if target.per_call else target.call,
                               # a plain save of the site's first call (what the tracer's short paths serve)
                               kind is not Box and not target.per_call and target.call == 0 and not target.special
                               and not target.copy, model.__dict__)
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
        return _lazy_attr(self._node(), name, self._host._model._tracer)

    def _owner(self) -> Tracer | None:
        return self._host._model._tracer

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
