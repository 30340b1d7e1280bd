"""The mechanisms a read point compiles to, installed for one forward and always removed.

- module boundary: a forward pre-hook (with kwargs) or forward hook on the native module;
- interface call: transformers' attention interface, routed per module through a ContextVar;
- operation: a ``TorchFunctionMode`` active only while one call (or one host forward) runs.

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

# ---- the attention interface ---------------------------------------------------------------

_ROUTES: ContextVar[dict[int, Callable[..., Any]] | None] = ContextVar("nnatlas_attention_routes", default=None)
_PREFIX = "nnatlas_"
_registry_lock = threading.Lock()
_registry_users: dict[str, int] = {}


def _original(impl: str, module: torch.nn.Module) -> Callable[..., Any]:
    if impl == "eager":
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise RuntimeError(f"{type(module).__name__}'s module has no eager_attention_forward")
        return fn  # type: ignore[no-any-return]
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[impl]  # type: ignore[no-any-return]


def _router(impl: str) -> Callable[..., Any]:
    def attention(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        routes = _ROUTES.get()
        handler = routes.get(id(module)) if routes else None
        original = _original(impl, module)
        if handler is None:
            return original(module, *args, **kwargs)
        return handler(original, module, args, kwargs)

    attention.__name__ = f"{_PREFIX}{impl}"
    return attention


def acquire_attention(impl: str) -> str:
    """Register the routing attention function for ``impl`` (refcounted); returns its name."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    name = f"{_PREFIX}{impl}"
    with _registry_lock:
        if _registry_users.get(name, 0) == 0:
            AttentionInterface.register(name, _router(impl))
            # without a mask function of its own the model silently drops the causal mask
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[impl])
        _registry_users[name] = _registry_users.get(name, 0) + 1
    return name


def release_attention(name: str) -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    with _registry_lock:
        _registry_users[name] -= 1
        if _registry_users[name] == 0:
            del _registry_users[name]
            AttentionInterface._global_mapping.pop(name, None)
            AttentionMaskInterface._global_mapping.pop(name, None)


def registered_names() -> set[str]:
    """The nnatlas entries now in transformers' registries (empty outside a trace)."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    keys = set(AttentionInterface._global_mapping) | set(AttentionMaskInterface._global_mapping)
    return {k for k in keys if k.startswith(_PREFIX)}


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

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name not in self.wanted:
            return func(*args, **kwargs)
        k = self.counts.get(name, 0)
        self.counts[name] = k + 1
        args, kwargs = self.serve(name, k, "input", (args, kwargs))
        out = func(*args, **kwargs)
        return self.serve(name, k, "output", out)
