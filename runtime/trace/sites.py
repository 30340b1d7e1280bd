"""The mechanisms a read point compiles to, installed for one forward and always removed.

- module boundary: a wrapper of the native module's ``forward``, on the instance for one trace
  (``SiteInstaller._wrap_forward``: it sees the call's args, kwargs and output as forward hooks would,
  without sending the module down torch's slow hook path);
- interface call: transformers' attention and experts interfaces, routed per module through a ContextVar;
- operation: the torch callables of the op's name swapped for a dispatcher (``nnatlas.trace.op_scopes``,
  which shares this module's refcounted patcher);
- module-level function: a global of the modeling module swapped for a dispatcher.

Each site receives the native payload, lets the tracer serve its requests (which may edit
it), and hands the possibly replaced payload back to the model.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, cast

import torch

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
        self.acquire_all(((key, install, label),))

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


PATCHES = SharedPatches()  # keys: ("registry", interface, name), ("op", id(holder), attr), ("fn", id(globals), name)

_ROUTES: ContextVar[dict[tuple[str, int], Callable[..., Any]] | None] = ContextVar("nnatlas_routes", default=None)
PREFIX = "nnatlas_"
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

    route.__name__ = f"{PREFIX}{interface}_router"
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
    PATCHES.acquire_all(entry)


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
    PATCHES.release(("registry", interface, _looked_up(interface, impl)))


def registered_names() -> set[str]:
    """The registry entries ("attention:sdpa", "experts:grouped_mm", ...) a trace routes now (empty outside a trace)."""
    return set(PATCHES.labels("registry"))


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

    dispatch.__name__ = f"{PREFIX}{name}"
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

    PATCHES.acquire(("fn", id(namespace), name), install, f"{namespace.get('__name__', '?')}.{name}")


def release_function(namespace: dict[str, Any], name: str) -> None:
    PATCHES.release(("fn", id(namespace), name))


def original_function(namespace: dict[str, Any], name: str) -> Callable[..., Any]:
    """The function itself, not the dispatcher a running trace put in its place."""
    fn = namespace[name]
    return getattr(fn, "_nnatlas_original", fn)  # type: ignore[no-any-return]


def patched_functions() -> list[str]:
    """The globals nnatlas has swapped right now (empty outside a trace)."""
    return PATCHES.labels("fn")


# ---- route_kernels: which families run their kernels token by token ----------------------

_KERNEL_ROUTES: ContextVar[dict[str, str] | None] = ContextVar("nnatlas_kernel_routes", default=None)


def kernel_route(family: str) -> str | None:
    routes = _KERNEL_ROUTES.get()
    return routes.get(family) if routes else None
