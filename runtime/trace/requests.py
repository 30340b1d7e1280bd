"""Requests and their targets: what a trace's body asks for, and where in the forward it is served.

A :class:`Target` is one site (a module boundary, an interface call, an operation, a method or a
function call) and how to get and put the value there (access path, view, copy); a :class:`Request`
is one save, edit or capture of a target, in body order; :class:`Box` holds a saved non-tensor and
:class:`Expr` a computation over values of the same forward. The tracer (``nnatlas.trace.tracer``) groups the
requests by site, installs the sites and serves them.
"""

from __future__ import annotations

import functools
import inspect
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from ..errors import InputError, NnatlasError, OutOfOrderError


class SiteKey(NamedTuple):
    """Where requests are served: one mechanism (``kind``: pre, post, call_in, call_out, op, method_in,
    method_out, fn_args, fn_output, fn_step, fn_steps) on one module (``module``: its id), and what in it:
    ``name`` is the interface of a call (of an operation: the interface call it is inside, None for the
    module's own forward), the method, or the function group; ``op``, ``occurrence`` and ``side`` are an
    operation's. A plain tuple of the same six fields finds the same requests (the op sites build one
    per call, which is cheaper)."""

    kind: str
    module: int
    name: str | None = None
    op: str | None = None
    occurrence: int = 0
    side: str | None = None
# the trace whose forward runs in this context, as its own dict: [batch, seq] of each dims module's
# current call (for views that name them); a hook that finds another dict here (another thread's or
# context's forward of the same model) leaves the call alone
RUNNING_TRACE: ContextVar[dict[int, tuple[int, int]] | None] = ContextVar("nnatlas_running_trace", default=None)
FN_SITES = ("fn_args", "fn_output", "fn_step", "fn_steps")
PER_CALL_SITES = ("fn_step",)  # sites that fire once per token of a call: tracer.iter picks the token
# the sides of a site whose values a module (or function) receives: the only ones that can be the
# caller's own tensors (``input_ids``, or ``inputs_embeds`` handed on as the first block's input)
INPUT_SIDES = frozenset({"input", "inputs", "args", "fn_args"})


# ---- reading and writing inside a payload --------------------------------------------------

def get_item(x: Any, a: Any) -> Any:
    if isinstance(a, str) and not isinstance(x, Mapping):
        return getattr(x, a)
    return x[a]


def set_item(x: Any, a: Any, new: Any) -> Any:
    """``x`` with element ``a`` replaced; tuples are rebuilt, mappings and tensors edited."""
    if isinstance(x, tuple):
        items = list(x)
        items[a] = new
        return type(x)(items) if type(x) is tuple else type(x)(*items)
    if isinstance(x, list):
        items = list(x)
        items[a] = new
        return items
    if isinstance(x, torch.Tensor):
        x[a] = new
        return x
    if isinstance(x, Mapping):
        x[a] = new  # type: ignore[index]
        return x
    setattr(x, a, new)
    return x


_FIRST_PARAMS: dict[type, list[str]] = {}


def forward_params(module: torch.nn.Module) -> list[str]:
    """The named parameters of the class's forward, without ``self`` (a trace may have put a
    wrapper on the instance, and accelerate puts one there for good: neither says the names)."""
    cls = type(module)
    if cls not in _FIRST_PARAMS:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]
        _FIRST_PARAMS[cls] = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                    p.KEYWORD_ONLY)]
    return _FIRST_PARAMS[cls]


@dataclass
class Target:
    """A resolved read: the site it fires at, and how to find the value in that site's payload."""

    label: str
    site: SiteKey
    module: torch.nn.Module
    side: str
    param: str | None
    access: tuple[Any, ...]
    view: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    extra: tuple[Any, ...] = ()
    # the module whose call gives [batch, seq] to views that name them (the model), and where they land
    dims_module: torch.nn.Module | None = None  # whose call gives ``batch`` / ``seq`` to the view
    layout: str | None = None  # the value's declared layout (a tensor layout), for the messages of bad edits
    copy: bool = False  # a save keeps a copy; an edit is a copy put in the native's place (a buffer the forward overwrites)
    reached: Any = None  # a call condition (adapter.Condition) checked against the inputs before the forward
    call: int = 0  # which firing of the site serves it (the K-th call of a method)
    at: str = ""  # the spec line of the value (a view that does not fit names it)
    per_call: bool = field(default=False, init=False)  # fires once per token of a call (tracer.iter picks which)
    fn_site: bool = field(default=False, init=False)  # at a module-level function (fn: read point)
    _pidx: tuple[int, str | None] | None = field(default=None, init=False, repr=False, compare=False)
    sharded: ClassVar[bool] = False  # a target on a tensor-parallel model (nnatlas.parallel.tensor_parallel.ShardedTarget)

    get: Callable[[Any], Any] = field(init=False, repr=False, compare=False)  # payload -> the served value

    def __post_init__(self) -> None:
        self.per_call = self.site.kind in PER_CALL_SITES
        self.fn_site = self.site.kind in FN_SITES
        self.get = self._getter()

    def _getter(self) -> Callable[[Any], Any]:
        """``served(native(payload))``, specialised once for the common shapes of a read (an output,
        an element of it, a forward argument by position or name), the general path otherwise."""
        access = self.access
        plain = not self.view and not self.extra and all(isinstance(a, int) for a in access)
        if plain and self.side in ("output", "fn_output", "inputs") and len(access) <= 1:
            if not access:
                return _same
            a0 = access[0]
            return lambda payload: payload[a0]
        if plain and self.side == "args" and len(access) == 1:  # an argument of an interface call (by position)
            a0 = access[0]
            return lambda payload: payload[0][a0]
        if not self.view and not self.extra and self.side in ("output", "fn_output", "inputs") and len(access) == 1:
            a0 = access[0]
            return lambda payload: get_item(payload, a0)  # (a named output: ``logits``)
        if plain and self.side == "input" and not access:
            idx, name = self._param_index()

            def argument(payload: Any) -> Any:
                args, kwargs = payload
                return args[idx] if idx < len(args) else kwargs.get(name) if name else None
            return argument
        return lambda payload: self.served(self.native(payload))

    def _param_index(self) -> tuple[int, str | None]:
        if self._pidx is None:
            self._pidx = self._find_param()
        return self._pidx

    def _find_param(self) -> tuple[int, str | None]:
        if self.param is None:
            names = forward_params(self.module)
            return 0, names[0] if names else None
        names = forward_params(self.module)
        return (names.index(self.param) if self.param in names else 10**6), self.param

    def _fn_param(self, names: tuple[str, ...]) -> str:
        a0 = self.access[0]
        if isinstance(a0, int):
            if a0 >= len(names):
                raise NnatlasError(f"{self.label}: the function takes {len(names)} named arguments, not {a0 + 1}")
            return names[a0]
        return str(a0)

    def native(self, payload: Any) -> Any:
        side = self.side
        if side == "output" or side == "fn_output" or side == "inputs":
            x = payload
            for a in self.access:
                x = get_item(x, a)
            return x
        if side == "fn_args":
            names, kw = payload
            x = kw.get(self._fn_param(names))
            for a in self.access[1:]:
                x = get_item(x, a)
            return x
        if self.side in ("input", "args"):
            args, kwargs = payload
            if self.side == "input":
                idx, name = self._param_index()
                x = args[idx] if idx < len(args) else kwargs.get(name) if name else None
            else:
                x = args
        elif self.side == "inputs":
            x = payload
        else:
            x = payload
        for a in self.access:
            x = get_item(x, a)
        return x

    def with_native(self, payload: Any, new: Any) -> Any:
        def put(x: Any, path: tuple[Any, ...]) -> Any:
            if not path:
                return new
            return set_item(x, path[0], put(get_item(x, path[0]), path[1:]))

        if self.side == "fn_args":
            names, kw = payload
            pname = self._fn_param(names)
            kw = dict(kw)
            kw[pname] = put(kw.get(pname), self.access[1:])
            return (names, kw)
        if self.side == "input":
            args, kwargs = payload
            idx, name = self._param_index()
            if idx < len(args):
                args = set_item(args, idx, put(args[idx], self.access))
            else:
                kwargs = dict(kwargs)
                kwargs[name] = put(kwargs.get(name), self.access)
            return (args, kwargs)
        if self.side == "args":
            args, kwargs = payload
            return (put(args, self.access), kwargs)
        return put(payload, self.access)

    def _bind(self, a: Any) -> Any:
        if isinstance(a, CallDim):
            assert self.dims_module is not None
            dims = (RUNNING_TRACE.get() or {}).get(id(self.dims_module))
            if dims is None:
                raise NnatlasError(f"{self.label}: the call's {a.name} is not known yet")
            return dims[0] if a.name == "batch" else dims[1]
        if isinstance(a, tuple):
            return tuple(self._bind(x) for x in a)
        return a

    def served(self, native: Any) -> Any:
        if not self.view and not self.extra:
            return native
        x = native
        for name, args in self.view:
            if self.dims_module is not None:
                args = self._bind(args)
            try:
                x = getattr(x, name)(*args)
            except (RuntimeError, IndexError) as e:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                view = f"{name}({', '.join(repr(list(a)) if isinstance(a, tuple) else repr(a) for a in args)})"
                where = f" (the view of {self.at})" if self.at else ""
                raise NnatlasError(f"{self.label}: the view {view}{where} does not fit the tensor it reads, of shape "
                                   f"{list(shape) if isinstance(shape, tuple) else shape}: {str(e).splitlines()[0]}") from e
        for a in self.extra:
            x = get_item(x, a)
        return x

    def grad_view(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """What serves the gradient of the native tensor as the gradient of the served value: the
        value's view and indexing, with ``batch`` / ``seq`` bound now (the backward runs after the call)."""
        steps = tuple((name, self._bind(args) if self.dims_module is not None else args) for name, args in self.view)
        extra = self.extra

        def view(g: torch.Tensor) -> torch.Tensor:
            for name, args in steps:
                g = getattr(g, name)(*args)
            for a in extra:
                g = get_item(g, a)
            return g
        return view

    def replace(self, payload: Any, new: Any) -> Any:
        """Assign a value: written into the tensor the model computed, so every use of it sees the
        edit (``layer_mid`` is both the MLP's input and the residual added after it); a value of
        another shape or type is substituted for the native one instead."""
        native = self.native(payload)
        served = self.served(native)
        if isinstance(served, torch.Tensor) and isinstance(new, torch.Tensor):
            if new.shape == served.shape:
                if new is not served:
                    served.copy_(new)
                return payload
            if self.layout is not None:  # a tensor of the value's layout: broadcast into it, or refuse
                try:
                    served.copy_(new)
                except RuntimeError as e:
                    raise InputError(self.edit_error(f"{self.label} = ...", served, new, e)) from e
                return payload
        if self.view or self.extra:
            shape = tuple(served.shape) if isinstance(served, torch.Tensor) else type(served).__name__
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise NnatlasError(f"{self.label}: assigned a value of shape {got} where the model has {shape}")
        return self.with_native(payload, new)

    def edit_error(self, what: str, current: Any, new: Any, error: BaseException) -> str:
        """The message of an edit the forward's tensor cannot take (a shape that does not broadcast)."""
        got = f"a tensor of shape {list(new.shape)}" if isinstance(new, torch.Tensor) else f"a {type(new).__name__}"
        has = f"shape {list(current.shape)}" if isinstance(current, torch.Tensor) else type(current).__name__
        layout = f" ({self.layout})" if self.layout else ""
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"{what}: {got} does not fit the value's {has}{layout}: {first}"


def _editable(target: Target, payload: Any) -> Any:
    """Under ``grad=True``, an edit of a tensor that the op which computed it keeps for its own
    backward (a softmax's, a sigmoid's, an exp's output) is made on a copy put in its place where
    the value is read: written in place, the backward would refuse the modified tensor."""
    native = target.native(payload)
    if isinstance(native, torch.Tensor) and native.grad_fn is not None and hasattr(native.grad_fn, "_saved_result"):
        return target.with_native(payload, native.clone())
    return payload


def _same(x: Any) -> Any:
    return x


def _seq(r: Request) -> int:
    return r.seq


@dataclass(frozen=True)
class CallDim:
    """``batch`` or ``seq`` in a view: the current call's, from the model's input ids (or embeddings)."""

    name: str


# ---- requests ------------------------------------------------------------------------------

class Box:
    """A saved value that is not a tensor (a size, a tuple, a state that may be None): ``.value``."""

    __slots__ = ("value", "filled", "label")

    def __init__(self, label: str):
        self.value: Any = None
        self.filled = False
        self.label = label

    def __repr__(self) -> str:
        return f"Box({self.value!r})" if self.filled else f"Box(<{self.label}: not computed yet>)"

    def __getitem__(self, k: Any) -> Any:
        return self.value[k]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.value)

    def __len__(self) -> int:
        return len(self.value)

    def __eq__(self, other: object) -> bool:
        return bool(self.value == (other.value if isinstance(other, Box) else other))

    __hash__ = None  # type: ignore[assignment]


@dataclass(eq=False, slots=True)
class Request:
    seq: int
    label: str
    action: str  # save | capture | setitem | replace | derived
    target: Target | None
    payload: Any = None
    step: int = 0
    call: int = 0  # which firing of the site within the step; -1: every firing (a per-token site outside tracer.iter)
    readonly: bool = False
    done: bool = False
    owner: Request | None = None
    deps: list[Request] | None = None  # a derived value's inputs
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    value: Any = None  # what a capture holds
    ordered: bool = True  # derived values and their inputs are served whenever the forward reaches them
    grad_into: GradInto | None = None  # a save under grad=True: where its backward hooks write (save_with_grad)


def fill(holder: Any, value: Any, label: str, grad: bool = False) -> None:
    if isinstance(holder, Box):
        holder.value, holder.filled = value, True
        return
    if not isinstance(value, torch.Tensor):
        raise NnatlasError(
            f"{label} is a {type(value).__name__}, not a tensor: save an element of it (for example "
            f"{label}[0]), or read a standard value")
    if grad and value.requires_grad:  # a value computed from saved ones (a derived value): its own node
        _alias(holder, value)
        holder.retain_grad()
        return
    holder.data = value  # set_data: shares value's storage, keeps none of its autograd history


def _alias(holder: torch.Tensor, value: torch.Tensor) -> None:
    """Make ``holder`` (the tensor the body got) an autograd view of ``value``: the same storage, and a
    backward from it reaches the forward's graph (``swap_tensors`` gives the holder object the view's
    whole state; the view made for it is dropped)."""
    torch.utils.swap_tensors(holder, value.view_as(value))


def save_with_grad(target: Target, r: Request, payload: Any, value: Any) -> None:
    """A save under ``trace(grad=True)``: the holder is an autograd view of the value, and a hook on the
    native tensor the forward goes on with (the one every later use reads) writes its gradient, seen
    through the value's view, into ``holder.grad`` (summed like autograd's own). No copy is made.

    The hook reaches the holder through the request's ``GradInto``, which holds it weakly: the holder
    is a view in the forward's graph, and a hook of that graph holding it strongly would be a cycle
    through autograd's C++ nodes, which Python's collector cannot see (every grad trace's graph
    stayed alive). Once the caller drops the saved tensor, nothing is written and the graph goes."""
    holder = r.payload
    if type(holder) is not torch.Tensor or not isinstance(value, torch.Tensor) or not value.requires_grad:
        fill(holder, value, r.label)
        return
    into = r.grad_into
    if into is None:
        into = r.grad_into = GradInto()
    else:  # a site that fires again fills the same holder (a per-token step outside tracer.iter)
        into.ref = None  # (swap_tensors refuses a tensor with a weak reference: taken again below)
    _alias(holder, value)
    into.ref = weakref.ref(holder)
    native = target.native(payload)
    if isinstance(native, torch.Tensor) and native.requires_grad and native is not value:
        view = target.grad_view()
    else:
        native, view = value, _same
    base = native._base
    if base is not None and base.requires_grad:
        # the tensor read is a view of one the forward also uses directly (Mamba's scan gets
        # x.transpose(1, 2) while x_proj reads x): a hook on the view would see only the view's uses;
        # the base's sees them all, and the view's elements are read off its gradient
        view = functools.partial(grad_through_base, base=Geometry(base), native=Geometry(native), then=view)
        native = base
    native.register_hook(functools.partial(into.add, view))


class GradInto:
    """Where the backward hooks of one save write its gradient: ``.grad`` of the holder, held weakly
    (``ref``; None while the holder is being filled again); a hook whose holder is gone does nothing."""

    __slots__ = ("ref",)

    def __init__(self) -> None:
        self.ref: weakref.ref[torch.Tensor] | None = None

    def add(self, view: Callable[[torch.Tensor], torch.Tensor], g: torch.Tensor) -> None:
        ref = self.ref
        holder = None if ref is None else ref()
        if holder is None:
            return
        g = view(g)
        with warnings.catch_warnings():  # (reading .grad of a non-leaf that has none warns)
            warnings.simplefilter("ignore")
            before = holder.grad
        holder.grad = g if before is None else before + g


@dataclass(frozen=True)
class Geometry:
    """A tensor's geometry, without the tensor (a backward hook must not keep its storage alive)."""

    size: torch.Size
    stride: tuple[int, ...]
    offset: int

    def __init__(self, t: torch.Tensor):
        object.__setattr__(self, "size", t.size())
        object.__setattr__(self, "stride", t.stride())
        object.__setattr__(self, "offset", t.storage_offset())


def grad_through_base(g: torch.Tensor, base: Geometry, native: Geometry,
                      then: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """The gradient of a view (``native``) read off its base's gradient ``g`` (laid out as the base is)."""
    laid = torch.empty_strided(base.size, base.stride, dtype=g.dtype, device=g.device)
    laid.copy_(g)
    seen = laid.as_strided(native.size, native.stride, native.offset - base.offset)
    return seen if then is None else then(seen)


class Expr:
    """A deferred computation over values of the same forward: ``layers[1].output * 2``."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None = None):
        self.fn, self.args, self.kwargs = fn, args, kwargs or {}

    def evaluate(self, tracer: object, needed_by: str) -> Any:  # (the trace that evaluates it, a layer above)
        def ev(x: Any) -> Any:
            if isinstance(x, Expr):
                return x.evaluate(tracer, needed_by)
            if isinstance(x, Request):
                if not x.done:
                    raise OutOfOrderError(x.label, needed_by,
                                          f"{x.label} is used to compute {needed_by} but does not exist yet")
                return x.value
            if isinstance(x, list | tuple):
                return type(x)(ev(i) for i in x)
            return x
        args, kwargs = ev(self.args), {k: ev(v) for k, v in self.kwargs.items()}
        try:
            return self.fn(*args, **kwargs)
        except NnatlasError:
            raise
        except (RuntimeError, TypeError, ValueError, IndexError) as e:  # torch's own: say which value it computed
            shapes = ", ".join(str(list(a.shape)) for a in args if isinstance(a, torch.Tensor))
            raise InputError(f"{needed_by}: the expression it is computed from failed on tensors of shapes "
                             f"{shapes or '(none)'}: {type(e).__name__}: {e}") from e
