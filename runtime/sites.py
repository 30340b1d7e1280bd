"""The mechanisms a read point compiles to, installed for one forward and always removed.

- module boundary: a wrapper of the native module's ``forward``, on the instance for one trace
  (``Tracer._wrap_forward``: it sees the call's args, kwargs and output as forward hooks would,
  without sending the module down torch's slow hook path);
- interface call: transformers' attention and experts interfaces, routed per module through a ContextVar;
- operation: a ``TorchFunctionMode`` active only while one call (or one module's own forward) runs;
  while a child module of that module runs, the mode passes calls through uncounted (``depth``).

Each site receives the native payload, lets the tracer serve its requests (which may edit
it), and hands the possibly replaced payload back to the model.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# ---- transformers' function interfaces: attention and experts ------------------------------
#
# Both interfaces dispatch on a string in the module's config (``_attn_implementation``,
# ``_experts_implementation``) through a registry. For one forward, a trace registers a routing
# function under ``nnatlas_<impl>`` (refcounted: two traces share one entry), points the configs
# of the modules it reads at it, and the router hands each call to the handler the trace
# registered for that module in a ContextVar, or to the original function. Everything is
# undone in the trace's ``finally``.

_ROUTES: ContextVar[dict[tuple[str, int], Callable[..., Any]] | None] = ContextVar("nnatlas_routes", default=None)
_PREFIX = "nnatlas_"
_registry_lock = threading.Lock()
_registry_users: dict[tuple[str, str], int] = {}


_REGISTRIES: dict[str, list[Any]] = {}


def _registries(interface: str) -> list[Any]:
    """The registries a routing function of ``interface`` is entered in (the first is the interface's own)."""
    found = _REGISTRIES.get(interface)
    if found is None:
        found = _REGISTRIES[interface] = _find_registries(interface)
    return found


def _find_registries(interface: str) -> list[Any]:
    if interface == "attention":
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface

        return [AttentionInterface, AttentionMaskInterface]
    if interface == "experts":
        from transformers.integrations.moe import ExpertsInterface

        return [ExpertsInterface]
    raise KeyError(f"unknown interface '{interface}'")


CONFIG_ATTRIBUTE = {"attention": "_attn_implementation", "experts": "_experts_implementation"}


def _original(interface: str, impl: str | None, module: torch.nn.Module) -> Callable[..., Any]:
    if interface == "experts":
        if impl in (None, "eager"):
            # "eager" is the class's own forward, which the experts decorator wraps
            for klass in type(module).__mro__:
                fwd = klass.__dict__.get("forward")
                if fwd is not None and hasattr(fwd, "__wrapped__"):
                    return fwd.__wrapped__  # type: ignore[no-any-return]
            raise RuntimeError(f"{type(module).__name__} does not dispatch through the experts interface")
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        return ALL_EXPERTS_FUNCTIONS[impl]  # type: ignore[no-any-return]
    if impl == "eager":
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise RuntimeError(f"{type(module).__name__}'s module has no eager_attention_forward")
        return fn  # type: ignore[no-any-return]
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[impl]  # type: ignore[no-any-return]


def _router(interface: str, impl: str | None) -> Callable[..., Any]:
    def route(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        routes = _ROUTES.get()
        handler = routes.get((interface, id(module))) if routes else None
        original = _original(interface, impl, module)
        if handler is None:
            return original(module, *args, **kwargs)
        return handler(original, module, args, kwargs)

    route.__name__ = f"{_PREFIX}{interface}_{impl}"
    return route


def routed_name(interface: str, impl: str | None) -> str:
    return f"{_PREFIX}{impl}" if interface == "attention" else f"{_PREFIX}{interface}_{impl or 'eager'}"


def acquire(interface: str, impl: str | None) -> str:
    """Register the routing function of ``interface`` for ``impl`` (refcounted); returns its name."""
    name = routed_name(interface, impl)
    key = (interface, name)
    with _registry_lock:
        if _registry_users.get(key, 0) == 0:
            own, *others = _registries(interface)
            own.register(name, _router(interface, impl))
            if interface == "attention":
                # without a mask function of its own the model silently drops the causal mask
                from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

                for reg in others:
                    reg.register(name, ALL_MASK_ATTENTION_FUNCTIONS[impl])
        _registry_users[key] = _registry_users.get(key, 0) + 1
    return name


def release(interface: str, name: str) -> None:
    key = (interface, name)
    with _registry_lock:
        _registry_users[key] -= 1
        if _registry_users[key] == 0:
            del _registry_users[key]
            for reg in _registries(interface):
                reg._global_mapping.pop(name, None)


def registered_names() -> set[str]:
    """The nnatlas entries now in transformers' registries (empty outside a trace)."""
    keys: set[str] = set()
    for interface in CONFIG_ATTRIBUTE:
        for reg in _registries(interface):
            keys |= set(reg._global_mapping)
    return {k for k in keys if k.startswith(_PREFIX)}


def set_implementation(config: Any, interface: str, value: str | None) -> None:
    """Point ``config`` (only this config, not its sub-configs) at an implementation of ``interface``."""
    attr = CONFIG_ATTRIBUTE[interface]
    internal = f"{attr}_internal"
    if hasattr(config, internal):
        setattr(config, internal, value)
    else:
        setattr(config, attr, value)


# ---- operations inside a forward -----------------------------------------------------------

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


# ---- module-level functions a host's forward calls -----------------------------------------
#
# A kernel such as transformers' ``torch_chunk_gated_delta_rule`` is a global of the modeling
# module, looked up by the forward at call time. While a trace runs, that global is swapped for a
# dispatcher (refcounted across traces and threads); the dispatcher asks two ContextVars which host
# module's forward is running (set by that host's forward hooks) and whether this trace routes
# that host's calls of the function. Anyone else calling the global gets the original untouched;
# the last trace to finish puts the original back.

_FN_ROUTES: ContextVar[dict[tuple[int, str], Callable[..., Any]] | None] = ContextVar("nnatlas_fn_routes", default=None)
_FN_HOST: ContextVar[int | None] = ContextVar("nnatlas_fn_host", default=None)
_fn_lock = threading.Lock()
_fn_users: dict[tuple[int, str], list[Any]] = {}  # (id(globals dict), name) -> [count, original, globals]


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
    key = (id(namespace), name)
    with _fn_lock:
        entry = _fn_users.get(key)
        if entry is None:
            original = namespace.get(name)
            if original is None or not callable(original):
                raise RuntimeError(f"the modeling module has no function '{name}' to read at")
            namespace[name] = _fn_dispatcher(name, original)
            _fn_users[key] = [1, original, namespace]
        else:
            entry[0] += 1


def release_function(namespace: dict[str, Any], name: str) -> None:
    key = (id(namespace), name)
    with _fn_lock:
        entry = _fn_users[key]
        entry[0] -= 1
        if entry[0] == 0:
            namespace[name] = entry[1]
            del _fn_users[key]


def original_function(namespace: dict[str, Any], name: str) -> Callable[..., Any]:
    """The function itself, not the dispatcher a running trace put in its place."""
    fn = namespace[name]
    return getattr(fn, "_nnatlas_original", fn)  # type: ignore[no-any-return]


def patched_functions() -> list[str]:
    """The globals nnatlas has swapped right now (empty outside a trace)."""
    with _fn_lock:
        return [f"{entry[2].get('__name__', '?')}.{key[1]}" for key, entry in _fn_users.items()]


# ---- route_kernels: which families run their kernels token by token ----------------------

_KERNEL_ROUTES: ContextVar[dict[str, str] | None] = ContextVar("nnatlas_kernel_routes", default=None)


def kernel_route(family: str) -> str | None:
    routes = _KERNEL_ROUTES.get()
    return routes.get(family) if routes else None
