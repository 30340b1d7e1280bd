"""The mechanisms a read point compiles to, installed for one forward and always removed.

- module boundary: a forward pre-hook (with kwargs) or forward hook on the native module;
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


def _registries(interface: str) -> list[Any]:
    """The registries a routing function of ``interface`` is entered in (the first is the interface's own)."""
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


def acquire_attention(impl: str) -> str:
    return acquire("attention", impl)


def release_attention(name: str) -> None:
    release("attention", name)


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
