"""Operations inside a forward: ``op:NAME#K`` read points, counted in op scopes and served there.

The torch callables of an op's name are swapped (refcounted in ``sites``' shared patcher, like the
registry entries and globals) for a dispatcher that counts calls only while an op scope (one
interface call, or one module's own forward) of this context runs; while a child module of that
module runs, calls pass through uncounted (``depth``). A name with nothing to swap is counted by a
``TorchFunctionMode`` active only while the scope runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from contextvars import ContextVar, Token
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .sites import PATCHES, PREFIX

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
    dispatch.__qualname__ = f"{PREFIX}op.{name}"
    dispatch._nnatlas_original = original  # type: ignore[attr-defined]
    return dispatch


def _reaches(frame: Any, entry: Any) -> bool:
    """Whether a call from ``frame`` is a call of the scope entered at ``entry``: walking up, ``entry``
    comes before any frame of a torch function that dispatches __torch_function__ (or the stack ends
    with neither: a scope whose entry frame is not on this stack takes the call)."""
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
    caller = sys._getframe(2)
    counting = [s for s in live if _reaches(caller, s.entry)]
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
    PATCHES.acquire_all(swaps)
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
    PATCHES.release_all(tuple(key for key, _, _ in _SWAPS[name]))


def patched_ops() -> list[str]:
    """The torch callables nnatlas has swapped right now (empty outside a trace)."""
    return PATCHES.labels("op")


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
