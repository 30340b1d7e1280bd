"""``patching.sweep``: activation patching over blocks × positions as one call, at the cost of what changes.

Each patched run is the corrupt prompt with one value put back from the clean run at one block and one
position; ``effect[k, n] = metric(logits)`` of the run patched at ``layers[k]``, ``positions[n]``. It equals
the loop (a traced forward of the corrupt prompt per patch) within float rounding, and costs less:

- the blocks before the patched one return what they returned in the corrupt run, without computing
  (``patching.skip``; a block that writes into something a later block reads always computes, said
  once per call);
- ``batch_size`` patched runs go through one forward, each row patched at its own block and position.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import InputError
from ..model import AtlasModel
from . import skip, where

ROW_BYTES = 256 * 2**20  # the default batch holds about this much of logits and of one block's stream


class SweepFallback(UserWarning):
    """Some blocks of this model cannot be skipped: they write into something a later block reads."""


def default_batch(model: AtlasModel, seq: int, patches: int) -> int:
    """Rows per forward: as many as fit ``ROW_BYTES`` of the widest per-row tensor (the logits, or the
    stream), at least 1, at most 64 and the number of patches."""
    cfg = model.config
    width = max(int(getattr(cfg, "vocab_size", 0) or 0), int(model.hidden_size or 0), 1)
    per_row = seq * width * 4
    return max(1, min(64, patches, ROW_BYTES // per_row))


def _progress(progress: bool | None, total: int) -> Any:
    """A tqdm bar over the patched runs, or None: none when tqdm is not installed or ``progress=False``;
    with ``progress=None`` only on a terminal, and drawn after two seconds (a short sweep shows none)."""
    if progress is False:
        return None
    if progress is not None and progress is not True:
        raise InputError(f"progress: expected True, False or None, got {progress!r}")
    if progress is None and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="patching.sweep", unit="run", delay=0 if progress else 2, leave=False)


def sweep(model: AtlasModel, clean: Any, corrupt: Any, value: str = "layer_output",
          metric: Callable[[torch.Tensor], torch.Tensor] | None = None, positions: Iterable[int] | None = None,
          layers: Iterable[int] | None = None, batch_size: int | None = None,
          progress: bool | None = None) -> torch.Tensor:
    """``effect [len(layers), len(positions)]``: ``metric(logits)`` of the corrupt run with ``value`` put back
    from the clean run at each block and each position (every block serving ``value`` and every position
    when None). ``metric(logits [batch seq vocab]) -> [batch]``: one number per patched run.

    The loop it equals (``loop`` in this module, the cookbook's recipe)::

        for k, i in enumerate(layers):
            for n, p in enumerate(positions):
                with model.trace(corrupt):
                    model.layers[i].<value>[:, p] = clean_value[i][:, p]
                    logits = model.logits.save()
                effect[k, n] = metric(logits)
    """
    if not isinstance(model, AtlasModel):
        raise InputError(f"sweep: expected a model from nnatlas.wrap or nnatlas.load, got {type(model).__name__}")
    if not callable(metric):
        raise InputError("metric: expected a function of the logits [batch seq vocab] giving [batch], e.g. "
                         "lambda logits: logits[:, -1].log_softmax(-1)[:, answer]")
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise InputError(f"batch_size: expected a positive number of rows per forward, got {batch_size!r}")
    clean_in, corrupt_in, seq = where.pair(model, clean, corrupt)
    blocks, handles = where.handles(model, value, layers)
    spots = where.positions_of(positions, seq)
    with torch.no_grad():
        with model.trace(clean_in, order="any"):
            saved = [h.save() for h in handles]
    record = recorded(model, corrupt_in)
    if record.reasons:
        with warnings.catch_warnings():
            warnings.simplefilter("always", SweepFallback)
            warnings.warn(f"patching.sweep on {model.family}: {'; '.join(record.reasons)}; those blocks compute in "
                          "every patched run (full forwards where they come first)", SweepFallback, stacklevel=2)
    patches = sorted(((b, k), (p, n)) for k, b in enumerate(blocks) for n, p in enumerate(spots))
    rows = batch_size or default_batch(model, seq, len(patches))
    effect = torch.empty(len(blocks), len(spots))
    bar = _progress(progress, len(patches))
    try:
        for start in range(0, len(patches), rows):
            batch = patches[start:start + rows]
            out = _patched_run(model, corrupt_in, record, handles, saved, batch, metric)
            for ((_, k), (_, n)), v in zip(batch, out.tolist(), strict=True):
                effect[k, n] = v
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return effect


def recorded(model: AtlasModel, corrupt: Any) -> skip.Recording:
    """The corrupt run's blocks (``skip.Recording``): what each returned, and which write into something a
    later block reads. ``corrupt``: a prompt, or inputs from ``where.one_row``."""
    inputs = where.one_row(model, corrupt, "corrupt")
    record = skip.Recording([layer._module for layer in model.layers])
    with torch.no_grad(), record.recording():
        model._runner()(**inputs)
    return record


def _own_output(handle: Any) -> bool:
    """The value is its block's own output (read at the block's boundary): the block's forward itself can be
    skipped and the value put back on what it served."""
    read = handle._read
    return (handle._host._pattern == "layers[i]" and read.kind == "module" and read.side == "output"
            and not read.module and not read.up)


def _patched_run(model: AtlasModel, corrupt_in: dict[str, Any], record: skip.Recording, handles: list[Any],
                 saved: list[Any], batch: list[tuple[tuple[int, int], tuple[int, int]]],
                 metric: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One forward of ``len(batch)`` rows of the corrupt prompt, row r patched at its own (block, position)."""
    n = len(batch)
    first = min(b for (b, _), _ in batch)
    by_block: dict[int, list[tuple[int, int]]] = {}
    for r, ((_, k), (p, _)) in enumerate(batch):
        by_block.setdefault(k, []).append((r, p))
    skipped = record.skippable(first + (1 if _own_output(handles[batch[0][0][1]]) else 0))
    with torch.no_grad(), skip.serving(record, skipped, n):
        with model.trace(where.repeat_rows(corrupt_in, n)):
            for k, spots in by_block.items():
                h = handles[k]
                rows = torch.tensor([r for r, _ in spots])
                at = torch.tensor([p for _, p in spots])
                h[where.key(h, rows, at)] = saved[k][where.key(h, torch.zeros_like(rows), at)]
            logits = model.logits.save()
    return where.metric_values(metric, logits, n)


def loop(model: AtlasModel, clean: Any, corrupt: Any, value: str = "layer_output",
         metric: Callable[[torch.Tensor], torch.Tensor] | None = None, positions: Iterable[int] | None = None,
         layers: Iterable[int] | None = None) -> torch.Tensor:
    """The sweep written as the loop it replaces: one traced forward of the corrupt prompt per patch, every
    block computed. What ``sweep`` is tested against, and what the bench times it against."""
    clean_in, corrupt_in, seq = where.pair(model, clean, corrupt)
    blocks, handles = where.handles(model, value, layers)
    spots = where.positions_of(positions, seq)
    with torch.no_grad():
        with model.trace(clean_in, order="any"):
            saved = [h.save() for h in handles]
        effect = torch.empty(len(blocks), len(spots))
        for k, h in enumerate(handles):
            axis = where.seq_axis(h)
            for n, p in enumerate(spots):
                with model.trace(corrupt_in):
                    h[(slice(None),) * axis + (p,)] = saved[k][(slice(None),) * axis + (p,)]
                    logits = model.logits.save()
                effect[k, n] = where.metric_values(metric, logits, 1)[0]
    return effect

