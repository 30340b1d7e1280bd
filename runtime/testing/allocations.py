"""Allocations: the bytes of the new storages aten ops produce while it is active (the zero-copy tests,
``bench/memory.py``)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class Allocations(TorchDispatchMode):
    """Bytes of the new storages aten ops produce while active (an output that shares its storage
    with an input, a view or ``detach``, counts nothing); the allocator reusing freed memory
    does not hide an allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        fresh: set[int] = set()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in inputs and ptr not in fresh:
                    fresh.add(ptr)
                    self.bytes += storage.nbytes()
        return out
