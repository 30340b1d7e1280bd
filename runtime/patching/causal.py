"""The causal limit: a patch at position p changes nothing before p, in any block. Where every block's only
memory of earlier positions is its attention's keys and values (the corrupt run's cache holds one plain
key/value layer per block, nothing else), a patched run reuses the corrupt run's keys and values for the
positions before its first patch and computes only the positions from there on; the logits before it are the
corrupt run's.

Decided on the corrupt run itself: its forward with ``use_cache=True`` must return a ``DynamicCache`` of
``DynamicLayer``\\ s (full attention: no sliding window, no recurrent or convolution state, no layer sharing
another's), one per block, each holding every position. Anything else (a hybrid's DeltaNet or Mamba state,
a sliding window's cut keys) computes every position, as before.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..inputs.validate import accepted_kwargs
from ..model import AtlasModel


class Past:
    """The corrupt run's keys and values for every block, and its logits, at batch 1."""

    def __init__(self, cache: Any, logits: torch.Tensor, name: str):
        self.cache, self.logits, self.name = cache, logits, name  # name: the forward's keyword for it

    def inputs(self, corrupt: dict[str, Any], start: int, rows: int) -> dict[str, Any]:
        """The forward's inputs for ``rows`` rows of the corrupt prompt from position ``start`` on, with the
        keys and values of the positions before it (a copy: the forward appends to it)."""
        cache = copy.deepcopy(self.cache)
        seq = int(corrupt["input_ids"].shape[1])
        cache.crop(start - seq)
        cache.batch_repeat_interleave(rows)
        ids = corrupt["input_ids"][:, start:].repeat(rows, 1)
        return {"input_ids": ids, self.name: cache, "use_cache": True}

    def logits_before(self, start: int, rows: int) -> torch.Tensor:
        return self.logits[:, :start].expand(rows, -1, -1)


def past(model: AtlasModel, corrupt: dict[str, Any]) -> tuple[Past | None, str]:
    """The corrupt run's keys and values where the limit is sound (else None), and why not."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    accepted = accepted_kwargs(model._module)
    ids = corrupt.get("input_ids")
    import inspect

    named = inspect.signature(type(model._module).forward).parameters
    name = "cache" if "cache" in named else "past_key_values"  # (transformers 5.24 renames it, the old name warns)
    if accepted is not None and not {name, "use_cache"} <= accepted:
        return None, "its forward takes no cache of keys and values"
    if not isinstance(ids, torch.Tensor) or set(corrupt) - {"input_ids", "attention_mask", "use_cache"}:
        return None, "its inputs are more than token ids"
    if any(hasattr(m, "rope_deltas") for m in model._module.modules()):
        # (Qwen2-VL's M-RoPE keeps the position deltas of its last forward, rope_deltas, and a forward given a cache
        # adds them: a cached forward after an image prompt would be shifted where the loop's plain one is not)
        return None, "it keeps the position deltas of an earlier forward (rope_deltas) for a forward given a cache"
    with torch.no_grad():
        out = model._runner()(**{**corrupt, "use_cache": True})
    cache, logits = getattr(out, "cache", None) or getattr(out, "past_key_values", None), getattr(out, "logits", None)
    seq = int(ids.shape[1])
    if type(cache) is not DynamicCache or len(cache.layers) != len(model.layers):
        return None, f"its cache is {type(cache).__name__}, not one key/value layer per block"
    if any(type(layer) is not DynamicLayer or layer.get_seq_length() != seq for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        return None, f"its cache layers ({', '.join(kinds)}) are not all full attention keys and values"
    if not isinstance(logits, torch.Tensor) or logits.shape[1] != seq:
        return None, "its forward returns no logits for every position"
    return Past(cache, logits, name), ""
