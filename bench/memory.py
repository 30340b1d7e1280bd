"""Saving makes no copies: what the trace allocates beyond the plain forward, and storage sharing.

``Allocations`` counts the bytes of every new storage an aten op produces (views and detach
produce none), so ``traced - plain`` is what the trace itself allocated: 0 when saving copies
nothing. ``shared_storage``
checks, in one forward, that each saved layer output lives in the very storage a plain forward
hook sees the model compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nnatlas.model import AtlasModel
from nnatlas.testing.suite import Allocations

from .workloads import value_module


def allocated(fn: Callable[[], Any]) -> tuple[int, Any]:
    with Allocations() as mode:
        result = fn()
    return mode.bytes, result


def saved_bytes(values: list[Any]) -> int:
    """Bytes of the distinct storages the saved tensors look into."""
    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel():
            s = v.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def shared_storage(model: AtlasModel, inputs: dict[str, torch.Tensor], values: list[Any]) -> tuple[int, int]:
    """(saved layer outputs sharing storage with what a plain hook captured, number saved)."""
    captured: dict[int, torch.Tensor] = {}
    handles = []
    for i, v in enumerate(values):
        module = value_module(v)

        def hook(mod: Any, args: Any, out: Any, i: int = i, v: Any = v) -> None:
            x = out
            for a in v._read.access:
                x = getattr(x, a) if isinstance(a, str) else x[a]
            captured[i] = x

        handles.append(module.register_forward_hook(hook))
    try:
        with model.trace(inputs):
            saved = [v.save() for v in values]
    finally:
        for h in handles:
            h.remove()
    same = sum(1 for i, s in enumerate(saved)
               if s.untyped_storage().data_ptr() == captured[i].untyped_storage().data_ptr()
               and s.data_ptr() == captured[i].data_ptr())
    return same, len(saved)
