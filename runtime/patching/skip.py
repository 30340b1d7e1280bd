"""Blocks a patched run need not compute: what the corrupt run's blocks returned, recorded once, and served
in place of their forward.

For a patch at block i, every block before i sees the corrupt run's stream and returns what it returned
there: its forward is skipped, not hooked (its instance ``forward`` is swapped, for one forward, for a
function that returns the recorded output, repeated over the batch). That is sound only where a block's
result reaches the rest of the model through its output alone. The rule, observed on the corrupt run: a
block that writes into an object a later block receives (a key/value dict shared across blocks, a cache)
is not skipped; every other block is. What the model's own forward does between blocks (DeepStack's
additions, a shared transformer fed the embeddings, per-layer inputs) still runs: only the blocks'
forwards are replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, MutableSequence, Sequence
from contextlib import contextmanager
from typing import Any

import torch

_ATOMS = (torch.Tensor, int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _state(obj: Any) -> Any:
    """A fingerprint of a mutable object a block receives: what it holds, by identity (a dict's or a
    list's entries, a cache's length), so that a write into it between two calls shows."""
    if isinstance(obj, MutableMapping):  # a dict, or a UserDict (Gemma 4's KVSharingDict)
        return tuple((k, id(v)) for k, v in obj.items())
    if isinstance(obj, MutableSequence):
        return tuple(id(v) for v in obj)
    length = getattr(obj, "get_seq_length", None)
    if callable(length):
        try:
            return ("cache", length(), tuple(id(layer) for layer in getattr(obj, "layers", ()) or ()))
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError):
            return ("cache", id(obj))
    return None


def _shared(args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The objects a block call receives that another block could have written into (not tensors,
    numbers, strings or tuples of them)."""
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, _ATOMS) or (isinstance(v, tuple) and all(isinstance(x, _ATOMS) for x in v)):
            continue
        if _state(v) is not None:
            out.append(v)
    return out


class Recording:
    """The corrupt run's blocks: each one's output as its forward returned it (batch 1), and which blocks
    wrote into an object that a later block received (``writers``: those are never skipped)."""

    def __init__(self, blocks: Sequence[torch.nn.Module]):
        self.blocks = list(blocks)
        self.outputs: list[Any] = [None] * len(self.blocks)
        self.writers: set[int] = set()
        self.reasons: list[str] = []

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Hooks on every block for one forward (removed when it ends, an exception included)."""
        before: dict[int, tuple[list[Any], list[Any]]] = {}
        received: list[tuple[int, list[int]]] = []  # (block, ids of the shared objects it received)
        wrote: list[tuple[int, int]] = []  # (block, id of an object it changed)

        def pre(i: int) -> Callable[..., None]:
            def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                objs = _shared(args, kwargs)
                before[i] = (objs, [_state(o) for o in objs])
                received.append((i, [id(o) for o in objs]))
            return hook

        def post(i: int) -> Callable[..., None]:
            def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
                self.outputs[i] = output
                objs, states = before.pop(i, ([], []))
                wrote.extend((i, id(o)) for o, s in zip(objs, states, strict=True) if _state(o) != s)
            return hook

        handles = []
        try:
            for i, block in enumerate(self.blocks):
                handles.append(block.register_forward_pre_hook(pre(i), with_kwargs=True))
                handles.append(block.register_forward_hook(post(i), with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()
        for i, obj in wrote:
            readers = [j for j, ids in received if j > i and obj in ids]
            if readers:
                self.writers.add(i)
                self.reasons.append(f"layers[{i}] writes into an object that layers[{readers[0]}] receives")
        missing = [i for i, out in enumerate(self.outputs) if out is None]
        if missing:  # a block the forward never called (or one that returned None) is never skipped
            self.writers.update(missing)
            self.reasons.append(f"layers[{missing[0]}] returned nothing the sweep could serve")

    def skippable(self, before: int) -> list[int]:
        """The blocks before ``before`` whose forward a patched run may skip."""
        return [j for j in range(before) if j not in self.writers]


def _repeat(x: Any, rows: int, start: int = 0) -> Any:
    """``x`` (a block's output at batch 1) for ``rows`` rows: every tensor with a batch of 1 repeated (a
    copy: a later edit in place lands in it), from position ``start`` on (axis 1); tuples and lists element
    by element, anything else as is."""
    if isinstance(x, torch.Tensor):
        if not x.dim() or x.shape[0] != 1:
            return x
        if start:
            x = x[:, start:]
        return x.repeat(rows, *([1] * (x.dim() - 1)))
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_repeat(v, rows, start) for v in x)
    if isinstance(x, list):
        return [_repeat(v, rows, start) for v in x]
    return x


@contextmanager
def serving(recording: Recording, blocks: Sequence[int], rows: int, start: int = 0) -> Iterator[None]:
    """For one forward of ``rows`` rows (of the positions from ``start`` on): each block in ``blocks`` returns what it returned in the corrupt
    run without computing anything (its instance ``forward`` swapped, and put back when the forward ends,
    an exception included). Hooks on the block, a trace's included, still see the call and its output."""
    swapped: list[tuple[torch.nn.Module, Any]] = []
    missing = object()
    try:
        for j in blocks:
            block = recording.blocks[j]
            out = _repeat(recording.outputs[j], rows, start)
            swapped.append((block, block.__dict__.get("forward", missing)))
            block.__dict__["forward"] = _served(out)
        yield
    finally:
        for block, previous in reversed(swapped):
            if previous is missing:
                block.__dict__.pop("forward", None)
            else:
                block.__dict__["forward"] = previous


def _served(out: Any) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return out
    return forward
