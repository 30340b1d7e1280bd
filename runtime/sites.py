"""The mechanisms a read point compiles to, installed for one forward and always removed.

- module boundary: a wrapper of the native module's ``forward``, on the instance for one trace
  (``SiteInstaller._wrap_forward``: it sees the call's args, kwargs and output as forward hooks would,
  without sending the module down torch's slow hook path);
- interface call: transformers' attention and experts interfaces, routed per module through a ContextVar;
- operation: the torch callables of the op's name swapped for a dispatcher that counts calls only
  while an op scope (one call, or one module's own forward) of this context runs; while a child
  module of that module runs, calls pass through uncounted (``depth``). A name with nothing to swap
  is counted by a ``TorchFunctionMode`` active only while the scope runs.

Each site receives the native payload, lets the tracer serve its requests (which may edit
it), and hands the possibly replaced payload back to the model.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, cast

import torch
from torch.overrides import TorchFunctionMode

# ---- transformers' function interfaces: attention and experts ------------------------------
#
# Both interfaces dispatch on a string in the module's config through a registry:
# ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)`` and
# ``ALL_EXPERTS_FUNCTIONS.get_interface(config._experts_implementation, <the class's own forward>)``.
# For one forward, a trace puts a router under the *same* name in the registry (refcounted: two
# traces share one entry) and never touches a config, so model code that compares the name
# (``config._attn_implementation == "sdpa"``) takes the same branch inside a trace as outside. The
# router hands a call of a module the running trace routes (``_ROUTES``) to the handler the trace
# registered for it, with what the registry held under the name (where it held nothing, as for
# "eager", what ``get_interface`` would have returned: the caller's eager function) as the
# original; every other call goes straight to that original. The last trace out puts the entry
# back exactly as it was (or removes it).

# ---- shared places: one refcounted patcher for every registry entry, torch callable and global ----
#
# A place every trace in the process shares (a registry entry, an attribute of a torch module or
# class, a global of a modeling module) is changed by the first trace that needs it, through an
# ``install() -> undo`` function, and put back by the last one out.

@dataclass
class _Held:
    users: int
    undo: Callable[[], None]
    label: str


class SharedPatches:
    """The places one kind of patch has changed now, each with its users and its undo."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, _Held] = {}

    def acquire(self, key: Hashable, install: Callable[[], Callable[[], None]], label: str = "") -> None:
        """Count one more user of the place ``key``; the first runs ``install()`` (which returns the undo)."""
        with self._lock:
            held = self._held.get(key)
            if held is None:
                self._held[key] = _Held(1, install(), label)
            else:
                held.users += 1

    def acquire_all(self, entries: tuple[tuple[Hashable, Callable[[], Callable[[], None]], str], ...]) -> None:
        """``acquire`` of each (key, install, label), under one hold of the lock; all or none (an
        install that raises releases those this call acquired)."""
        with self._lock:
            done: list[Hashable] = []
            try:
                for key, install, label in entries:
                    held = self._held.get(key)
                    if held is None:
                        self._held[key] = _Held(1, install(), label)
                    else:
                        held.users += 1
                    done.append(key)
            except BaseException:
                self._release(reversed(done))
                raise

    def release(self, key: Hashable) -> None:
        """One user fewer; the last runs the undo."""
        with self._lock:
            self._release((key,))

    def release_all(self, keys: tuple[Hashable, ...]) -> None:
        """``release`` of each key (in reverse order), under one hold of the lock."""
        with self._lock:
            self._release(reversed(keys))

    def _release(self, keys: Any) -> None:
        for key in keys:
            held = self._held[key]
            held.users -= 1
            if held.users == 0:
                del self._held[key]
                held.undo()

    def labels(self, kind: str) -> list[str]:
        """What of ``kind`` (a key's first element) is patched now (empty outside a trace)."""
        with self._lock:
            return [h.label for key, h in self._held.items() if isinstance(key, tuple) and key[0] == kind]


_PATCHES = SharedPatches()  # keys: ("registry", interface, name), ("op", id(holder), attr), ("fn", id(globals), name)

_ROUTES: ContextVar[dict[tuple[str, int], Callable[..., Any]] | None] = ContextVar("nnatlas_routes", default=None)
_PREFIX = "nnatlas_"
_NOTHING: Any = object()  # a registry held no entry under the name


def _registry(interface: str) -> dict[Any, Callable[..., Any]]:
    """The mapping of transformers' registry of ``interface`` that every instance of it reads."""
    if interface == "attention":
        from transformers.modeling_utils import AttentionInterface

        return cast("dict[Any, Callable[..., Any]]", AttentionInterface._global_mapping)
    if interface == "experts":
        from transformers.integrations.moe import ExpertsInterface

        return cast("dict[Any, Callable[..., Any]]", ExpertsInterface._global_mapping)
    raise KeyError(f"unknown interface '{interface}'")


CONFIG_ATTRIBUTE = {"attention": "_attn_implementation", "experts": "_experts_implementation"}


def eager_attention(module: torch.nn.Module) -> Callable[..., Any]:
    """The eager attention function of ``module``'s family (its modeling module's ``eager_attention_forward``)."""
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise RuntimeError(f"{type(module).__name__}'s module has no eager_attention_forward")
    return fn  # type: ignore[no-any-return]


_EAGER_OF_CALLER: dict[CodeType, str | None] = {}  # a forward's code -> the eager global it names (None: none, or several)


def caller_eager_attention(module: torch.nn.Module, caller: FrameType) -> Callable[..., Any]:
    """The default the calling forward passes ``get_interface`` (what it runs when "eager" has no
    registry entry): the one ``*eager_attention_forward`` global it names (a few families name their
    own, e.g. llama4's ``vision_eager_attention_forward``), else the family's ``eager_attention_forward``;
    looked up in the globals at each call, as the forward does (the name is found once per code)."""
    code = caller.f_code
    if code in _EAGER_OF_CALLER:
        name = _EAGER_OF_CALLER[code]
    else:
        names = [n for n in code.co_names if n.endswith("eager_attention_forward") and callable(caller.f_globals.get(n))]
        name = _EAGER_OF_CALLER[code] = names[0] if len(names) == 1 else None
    return caller.f_globals[name] if name is not None else eager_attention(module)


def _experts_eager(module: torch.nn.Module) -> Callable[..., Any]:
    """The class's own forward, which transformers' experts decorator wraps (its ``get_interface`` default)."""
    for klass in type(module).__mro__:
        fwd = klass.__dict__.get("forward")
        if fwd is not None and hasattr(fwd, "__wrapped__"):
            return fwd.__wrapped__  # type: ignore[no-any-return]
    raise RuntimeError(f"{type(module).__name__} does not dispatch through the experts interface")


def attention_implementation(config: Any) -> str | None:
    """The attention implementation a config names."""
    return getattr(config, "_attn_implementation", None)


def _router(interface: str, held: Callable[..., Any], name: str | None) -> Callable[..., Any]:
    """The function put under ``name`` in ``interface``'s registry: a call of a module the running trace
    routes goes to its handler, as ``handler(original, module, args, kwargs, name, caller)`` (``caller``:
    the frame of the forward that called the interface, see :func:`caller_eager_attention`)."""
    def route(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if held is not _NOTHING:
            original = held
        elif interface == "attention":
            original = caller_eager_attention(module, sys._getframe(1))
        else:
            original = _experts_eager(module)
        routes = _ROUTES.get()
        handler = routes.get((interface, id(module))) if routes else None
        if handler is None:
            return original(module, *args, **kwargs)
        return handler(original, module, args, kwargs, name, sys._getframe(1))

    route.__name__ = f"{_PREFIX}{interface}_router"
    return route


def _looked_up(interface: str, impl: str | None) -> str | None:
    """The key ``get_interface(impl, ...)`` reads (attention drops a ``paged|`` prefix, bar ``paged|eager``'s)."""
    if interface == "attention" and impl is not None and impl.startswith("paged|") and impl != "paged|eager":
        return impl.removeprefix("paged|")
    return impl


_ROUTERS: dict[tuple[str, str | None], tuple[tuple[Hashable, Callable[[], Callable[[], None]], str], ...]] = {}


def acquire(interface: str, impl: str | None) -> None:
    """Put the router of ``interface`` under the name ``impl`` is looked up by (refcounted). A name
    with no entry other than eager's (None's) is left alone: transformers refuses it, as outside a trace."""
    entry = _ROUTERS.get((interface, impl))
    if entry is None:
        key = _looked_up(interface, impl)
        entry = _ROUTERS[(interface, impl)] = ((("registry", interface, key), _route_install(interface, key),
                                                f"{interface}:{key}"),)
    _PATCHES.acquire_all(entry)


def _route_install(interface: str, key: str | None) -> Callable[[], Callable[[], None]]:
    def install() -> Callable[[], None]:
        mapping = _registry(interface)
        held = mapping.get(key, _NOTHING)
        if held is _NOTHING and key not in ("eager", None):
            return lambda: None
        mapping[key] = _router(interface, held, key)

        def undo() -> None:
            if held is _NOTHING:
                del mapping[key]
            else:
                mapping[key] = held
        return undo
    return install


def release(interface: str, impl: str | None) -> None:
    _PATCHES.release(("registry", interface, _looked_up(interface, impl)))


def registered_names() -> set[str]:
    """The registry entries ("attention:sdpa", "experts:grouped_mm", ...) a trace routes now (empty outside a trace)."""
    return set(_PATCHES.labels("registry"))


# ---- operations inside a forward -----------------------------------------------------------
#
# ``op:NAME#K`` is the K-th call named NAME within a scope: one interface call, or one module's own
# forward (its children's forwards excluded). Two mechanisms count the same calls:
#
# - swapped callables (the fast path): for the trace's duration, every torch-level callable that a
#   TorchFunctionMode would see under NAME (``torch.NAME``, ``torch.nn.functional.NAME``,
#   ``torch._C._nn.NAME``, ``torch.Tensor.NAME`` and the Tensor operators that dispatch as NAME, e.g.
#   ``a * b`` as ``mul``) is replaced by a dispatcher, refcounted across traces and threads like the
#   fn: globals below. The dispatcher passes straight through unless an op scope of this context
#   (``_OP_SCOPES``, set by the trace's call handler or the host's forward wrapper) wants NAME. Only the scope's calls
#   pay anything; code outside a scope runs at native speed bar one Python call per swapped name.
# - ``OpMode``, a TorchFunctionMode (the fallback, for a name with no Python attribute to swap, or
#   for every name when ``FORCE_OP_MODE`` is set): every torch call in the scope goes through Python.
#
# A mode sees only the outermost torch-level call: inside a Python-level torch function that
# dispatches ``__torch_function__`` (``F.softmax`` calling ``Tensor.softmax``, ``Tensor.split`` calling
# ``torch.split``) it is popped, so the nested calls are not counted. The dispatcher counts the same
# calls: a call is the scope's only if no frame between it and the scope's entry frame runs a
# function that calls ``handle_torch_function`` (checked only for calls the scope wants).

class OpMode(TorchFunctionMode):
    """Counts torch calls by name while active and hands the requested ones to ``serve``.

    ``serve(name, k, "input", (args, kwargs))`` may return replaced (args, kwargs);
    ``serve(name, k, "output", out)`` may return a replaced output.
    """

    def __init__(self, wanted: set[str], serve: Callable[[str, int, str, Any], Any]):
        super().__init__()
        self.wanted = wanted
        self.serve = serve
        self.counts: dict[str, int] = {}
        self.depth = 0  # > 0 while a child module's forward runs: its calls are not this scope's

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.depth or name not in self.wanted:
            return func(*args, **kwargs)
        k = self.counts.get(name, 0)
        self.counts[name] = k + 1
        args, kwargs = self.serve(name, k, "input", (args, kwargs))
        out = func(*args, **kwargs)
        return self.serve(name, k, "output", out)


FORCE_OP_MODE = False  # tests set it to serve every op: read point through OpMode, the reference
# Swapping a method of ``torch.Tensor`` modifies the class, twice per trace. CPython 3.13 gives a
# class modified MAX_VERSIONS_PER_CLASS (1000) times no new version tag, so that attribute lookups
# on its instances (every tensor) are never cached again for the life of the process (3.11 has no
# such limit; 3.12 is treated like 3.13, to be safe): there, a name with a Tensor method or operator
# among its callables is counted by the OpMode instead.
TENSOR_SWAPS = sys.version_info < (3, 12)


class OpScope:
    """One active scope of swapped op names: its counts, and the frame its calls descend from."""

    __slots__ = ("wanted", "serve", "counts", "depth", "entry", "busy")

    def __init__(self, wanted: set[str], serve: Callable[[str, int, str, Any], Any], entry: Any):
        self.wanted = wanted
        self.serve = serve
        self.counts: dict[str, int] = {}
        self.depth = 0  # > 0 while a child module's forward runs: its calls are not this scope's
        self.entry = entry
        self.busy = False  # True while one of its counted ops runs


_OP_SCOPES: ContextVar[tuple[OpScope, ...]] = ContextVar("nnatlas_op_scopes", default=())
_TARGETS: dict[str, list[tuple[Any, str]]] = {}  # name -> its (holder, attribute) pairs, found once
_NESTS: dict[Any, bool] = {}  # code object -> whether it calls handle_torch_function


# Tensor operators whose TorchFunctionMode name is not their own (``__mul__`` dispatches as ``mul``)
_OPERATORS = ("__add__", "__radd__", "__iadd__", "__sub__", "__isub__", "__mul__", "__rmul__", "__imul__",
              "__truediv__", "__itruediv__", "__div__", "__idiv__", "__floordiv__", "__ifloordiv__", "__mod__",
              "__imod__", "__pow__", "__ipow__", "__matmul__", "__and__", "__iand__", "__or__", "__ior__",
              "__xor__", "__ixor__", "__lshift__", "__ilshift__", "__rshift__", "__irshift__", "__neg__",
              "__pos__", "__abs__", "__invert__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__")
_operator_names: dict[str, tuple[str, ...]] | None = None


def operator_names() -> dict[str, tuple[str, ...]]:
    """Op name -> the Tensor operators a TorchFunctionMode sees under that name (found by calling each
    operator once under a recording mode, so it follows the installed torch)."""
    global _operator_names
    if _operator_names is None:
        seen: dict[str, list[str]] = {}

        class Record(TorchFunctionMode):
            def __init__(self) -> None:
                super().__init__()
                self.names: list[str] = []

            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                self.names.append(getattr(func, "__name__", ""))
                return func(*args, **(kwargs or {}))

        samples = ((lambda: torch.ones(3) * 2, lambda: torch.ones(3)),
                   (lambda: torch.ones(3, dtype=torch.long), lambda: torch.full((3,), 2, dtype=torch.long)),
                   (lambda: torch.ones(3, dtype=torch.bool), lambda: torch.zeros(3, dtype=torch.bool)))
        for op in _OPERATORS:
            fn = getattr(torch.Tensor, op, None)
            if fn is None:
                continue
            for first, second in samples:
                a, b = first(), second()
                rec = Record()
                try:
                    with rec:
                        fn(a) if op in ("__neg__", "__pos__", "__abs__", "__invert__") else fn(a, b)
                except Exception:
                    continue
                if rec.names and rec.names[0] != op and rec.names[0]:
                    seen.setdefault(rec.names[0], []).append(op)
                break
        _operator_names = {k: tuple(v) for k, v in seen.items()}
    return _operator_names


def _op_targets(name: str) -> list[tuple[Any, str]]:
    """Every (holder, attribute) whose callable a TorchFunctionMode sees as ``name``."""
    targets = _TARGETS.get(name)
    if targets is None:
        targets = _TARGETS[name] = _find_targets(name)
    return targets


def _find_targets(name: str) -> list[tuple[Any, str]]:
    targets: list[tuple[Any, str]] = []
    import torch.nn.functional as F

    for holder in (torch, F, torch._C._nn):
        fn = holder.__dict__.get(name)
        if fn is not None and callable(fn) and not isinstance(fn, type) and getattr(fn, "__name__", None) == name:
            targets.append((holder, name))
    fn = getattr(torch.Tensor, name, None)
    if fn is not None and callable(fn) and not isinstance(fn, type) and getattr(fn, "__name__", None) == name:
        targets.append((torch.Tensor, name))
    targets.extend((torch.Tensor, op) for op in operator_names().get(name, ()))
    if not TENSOR_SWAPS and any(holder is torch.Tensor for holder, _ in targets):
        return []  # all or nothing: a name half swapped would miss the Tensor method's calls
    return targets


def _op_dispatcher(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        scopes = _OP_SCOPES.get()
        if not scopes:
            return original(*args, **kwargs)
        return _dispatch_scoped(name, original, scopes, args, kwargs)

    dispatch.__name__ = name
    dispatch.__qualname__ = f"{_PREFIX}op.{name}"
    dispatch._nnatlas_original = original  # type: ignore[attr-defined]
    return dispatch


def _dispatch_scoped(name: str, original: Callable[..., Any], scopes: tuple[OpScope, ...],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(scopes) == 1:  # (the common case: one scope open, walked without the lists below)
        s = scopes[0]
        if name not in s.wanted or s.depth or s.busy or not _reaches(sys._getframe(2), s.entry):
            return original(*args, **kwargs)
        k = s.counts.get(name, 0)
        s.counts[name] = k + 1
        args, kwargs = s.serve(name, k, "input", (args, kwargs))
        s.busy = True
        try:
            out = original(*args, **kwargs)
        finally:
            s.busy = False
        return s.serve(name, k, "output", out)
    live = [s for s in scopes if name in s.wanted and not s.depth and not s.busy]
    if not live:
        return original(*args, **kwargs)
    # the scopes this call belongs to: those whose entry frame is reached walking up from the caller
    # before any frame of a torch function that dispatches __torch_function__ (a mode would not see
    # a call nested in one)
    counting: list[OpScope] = []
    frame: Any = sys._getframe(2)
    remaining = len(live)
    while frame is not None:
        for s in live:
            if s.entry is frame:
                counting.append(s)
                remaining -= 1
        if not remaining:
            break
        code = frame.f_code
        nests = _NESTS.get(code)
        if nests is None:
            nests = _NESTS[code] = "handle_torch_function" in code.co_names
        if nests:
            break
        frame = frame.f_back
    else:  # an entry frame not on this stack, and no nesting torch function either: the scope's call
        counting.extend(s for s in live if s not in counting)
    if not counting:
        return original(*args, **kwargs)
    # in the order stacked modes serve a call: the newest scope's input first and its output last;
    # while the op runs, calls nested in it are no scope's (``busy``), as a mode is popped meanwhile
    order = [s for s in reversed(live) if s in counting] if len(counting) > 1 else counting
    ks = []
    for s in order:
        k = s.counts.get(name, 0)
        s.counts[name] = k + 1
        ks.append(k)
        args, kwargs = s.serve(name, k, "input", (args, kwargs))
    for s in order:
        s.busy = True
    try:
        out = original(*args, **kwargs)
    finally:
        for s in order:
            s.busy = False
    for s, k in zip(reversed(order), reversed(ks), strict=True):
        out = s.serve(name, k, "output", out)
    return out


_SWAPS: dict[str, tuple[tuple[Hashable, Callable[[], Callable[[], None]], str], ...]] = {}  # name -> its swaps


def _reaches(frame: Any, entry: Any) -> bool:
    """Whether a call from ``frame`` is a call of the scope entered at ``entry``: walking up, ``entry``
    comes before any frame of a torch function that dispatches __torch_function__ (or the stack ends
    without either: an entry not on this stack, as the general walk in ``_dispatch_scoped`` takes it)."""
    while frame is not None:
        if frame is entry:
            return True
        code = frame.f_code
        nests = _NESTS.get(code)
        if nests is None:
            nests = _NESTS[code] = "handle_torch_function" in code.co_names
        if nests:
            return False
        frame = frame.f_back
    return True


def acquire_op(name: str) -> bool:
    """Swap every callable a mode would see as ``name`` for the dispatcher (refcounted); False when
    there is none to swap (the caller counts that name with an ``OpMode``)."""
    if FORCE_OP_MODE:
        return False
    swaps = _SWAPS.get(name)
    if swaps is None:
        swaps = _SWAPS[name] = tuple((("op", id(holder), attr), _op_swap(name, holder, attr),
                                      f"{getattr(holder, '__name__', '?')}.{attr}") for holder, attr in _op_targets(name))
    if not swaps:
        return False
    _PATCHES.acquire_all(swaps)
    return True


def _op_swap(name: str, holder: Any, attr: str) -> Callable[[], Callable[[], None]]:
    made: list[Callable[..., Any]] = []  # the dispatcher of the original last swapped (made once, not per trace)

    def install() -> Callable[[], None]:
        had = attr in holder.__dict__
        original = getattr(holder, attr)
        if not made or made[0]._nnatlas_original is not original:  # type: ignore[attr-defined]
            made[:] = [_op_dispatcher(name, original)]
        setattr(holder, attr, made[0])

        def undo() -> None:
            if had:
                setattr(holder, attr, original)
            else:
                delattr(holder, attr)
        return undo
    return install


def release_op(name: str) -> None:
    _PATCHES.release_all(tuple(key for key, _, _ in _SWAPS[name]))


def patched_ops() -> list[str]:
    """The torch callables nnatlas has swapped right now (empty outside a trace)."""
    return _PATCHES.labels("op")


class OpSwaps:
    """The swaps of one trace, undone by ``remove()`` (it sits among the trace's hook handles), which
    also puts ``_OP_SCOPES`` back as it was, should a forward have raised inside a scope."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.token: Token[tuple[OpScope, ...]] | None = _OP_SCOPES.set(_OP_SCOPES.get())

    def split(self, names: set[str]) -> tuple[set[str], set[str]]:
        """(the names now swapped, the names an OpMode must count); each name is acquired once per trace."""
        swapped, fallback = set(), set()
        for name in sorted(names):
            if name in self.names or acquire_op(name):
                if name not in self.names:
                    self.names.append(name)
                swapped.add(name)
            else:
                fallback.add(name)
        return swapped, fallback

    def remove(self) -> None:
        names, self.names = self.names, []
        for name in reversed(names):
            release_op(name)
        if self.token is not None:
            _OP_SCOPES.reset(self.token)
            self.token = None


def run_scoped(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], swapped: set[str],
               fallback: set[str], serve: Callable[[str, int, str, Any], Any],
               stack: list[tuple[OpScope | None, OpMode | None]] | None = None) -> Any:
    """``original(*args, **kwargs)`` as one op scope: ``swapped`` names counted by the dispatchers
    (the scope's calls descend from this frame), ``fallback`` names by an OpMode; ``stack`` (when
    given) holds the running (scope, mode) meanwhile, for the depth counters of child modules."""
    scope = token = None
    if swapped:
        scope = OpScope(swapped, serve, sys._getframe())
        token = _OP_SCOPES.set((*_OP_SCOPES.get(), scope))
    mode = OpMode(fallback, serve) if fallback else None
    if stack is not None:
        stack.append((scope, mode))
    try:
        if mode is None:
            return original(*args, **kwargs)
        with mode:
            return original(*args, **kwargs)
    finally:
        if stack is not None:
            stack.pop()
        if scope is not None:
            assert token is not None
            _OP_SCOPES.reset(token)  # (scopes end in the order they began: the one begun last ends first)
            scope.entry = None  # (the frame holds the scope: a cycle through every frame above it, left to the GC)


def push_scope(scope: OpScope) -> None:
    _OP_SCOPES.set((*_OP_SCOPES.get(), scope))


def pop_scope(scope: OpScope) -> None:
    _OP_SCOPES.set(tuple(s for s in _OP_SCOPES.get() if s is not scope))


# ---- module-level functions a host's forward calls -----------------------------------------
#
# A kernel such as transformers' ``torch_chunk_gated_delta_rule`` is a global of the modeling
# module, looked up by the forward at call time. While a trace runs, that global is swapped for a
# dispatcher (refcounted across traces and threads); the dispatcher asks two ContextVars which host
# module's forward is running (set by that host's forward wrapper) and whether this trace routes
# that host's calls of the function. Anyone else calling the global gets the original untouched;
# the last trace to finish puts the original back.

_FN_ROUTES: ContextVar[dict[tuple[int, str], Callable[..., Any]] | None] = ContextVar("nnatlas_fn_routes", default=None)
_FN_HOST: ContextVar[int | None] = ContextVar("nnatlas_fn_host", default=None)


def forward_globals(module: torch.nn.Module) -> dict[str, Any]:
    """The globals the module's forward looks names up in (its class's modeling module)."""
    import inspect

    fwd = inspect.unwrap(type(module).forward)
    return fwd.__globals__  # type: ignore[no-any-return]


def _fn_dispatcher(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        routes = _FN_ROUTES.get()
        host = _FN_HOST.get()
        handler = routes.get((host, name)) if routes and host is not None else None
        if handler is None:
            return original(*args, **kwargs)
        return handler(original, name, args, kwargs)

    dispatch.__name__ = f"{_PREFIX}{name}"
    dispatch.__wrapped__ = original  # type: ignore[attr-defined]
    dispatch._nnatlas_original = original  # type: ignore[attr-defined]
    return dispatch


def acquire_function(namespace: dict[str, Any], name: str) -> None:
    """Swap the global ``name`` of ``namespace`` for the dispatcher (refcounted)."""
    def install() -> Callable[[], None]:
        original = namespace.get(name)
        if original is None or not callable(original):
            raise RuntimeError(f"the modeling module has no function '{name}' to read at")
        namespace[name] = _fn_dispatcher(name, original)

        def undo() -> None:
            namespace[name] = original
        return undo

    _PATCHES.acquire(("fn", id(namespace), name), install, f"{namespace.get('__name__', '?')}.{name}")


def release_function(namespace: dict[str, Any], name: str) -> None:
    _PATCHES.release(("fn", id(namespace), name))


def original_function(namespace: dict[str, Any], name: str) -> Callable[..., Any]:
    """The function itself, not the dispatcher a running trace put in its place."""
    fn = namespace[name]
    return getattr(fn, "_nnatlas_original", fn)  # type: ignore[no-any-return]


def patched_functions() -> list[str]:
    """The globals nnatlas has swapped right now (empty outside a trace)."""
    return _PATCHES.labels("fn")


# ---- route_kernels: which families run their kernels token by token ----------------------

_KERNEL_ROUTES: ContextVar[dict[str, str] | None] = ContextVar("nnatlas_kernel_routes", default=None)


def kernel_route(family: str) -> str | None:
    routes = _KERNEL_ROUTES.get()
    return routes.get(family) if routes else None
