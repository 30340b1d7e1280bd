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
from . import causal as _causal
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
          progress: bool | None = None, causal: bool | None = None) -> torch.Tensor:
    """``effect [len(layers), len(positions)]``: ``metric(logits)`` of the corrupt run with ``value`` put back
    from the clean run at each block and each position (every block serving ``value`` and every position
    when None). ``metric(logits [batch seq vocab]) -> [batch]``: one number per patched run.
    ``batch_size``: patched runs per forward (default: one block's positions, as many as fit in memory).
    ``causal``: reuse the corrupt run's keys and values before each batch's first patched position and
    compute only the positions from there on (``patching.causal``); None (the default): where that is
    exact (an attention-only model), False: never.

    The loop it equals (``loop`` in this module, the cookbook's recipe)::

        for k, i in enumerate(layers):
            for n, p in enumerate(positions):
                with model.trace(corrupt):
                    model.layers[i].<value>[:, p] = clean_value[i][:, p]
                    logits = model.logits.save()
                effect[k, n] = metric(logits)
    """
    metric = where.checked("sweep", model, metric)
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise InputError(f"batch_size: expected a positive number of rows per forward, got {batch_size!r}")
    clean_in, corrupt_in, blocks, handles, spots = where.setup(model, clean, corrupt, value, layers, positions)
    seq = where.length(corrupt_in)
    saved = where.clean_values(model, clean_in, handles)
    record = recorded(model, corrupt_in)
    limit = None
    if causal is not False:
        limit, why = _causal.past(model, corrupt_in)
        if limit is None and causal:
            raise InputError(f"causal=True: {model.family} cannot reuse the corrupt run's keys and values: {why}")
    if record.reasons:
        with warnings.catch_warnings():
            warnings.simplefilter("always", SweepFallback)
            warnings.warn(f"patching.sweep on {model.family}: {'; '.join(record.reasons)}; those blocks compute in "
                          "every patched run (full forwards where they come first)", SweepFallback, stacklevel=2)
    patches = sorted(((b, k), (p, n)) for k, b in enumerate(blocks) for n, p in enumerate(spots))
    rows = batch_size or default_batch(model, seq, len(spots))
    effect = torch.empty(len(blocks), len(spots))
    bar = _progress(progress, len(patches))
    try:
        for batch in batches(patches, rows, seq if limit is not None and batch_size is None else None):
            out = _patched_run(model, corrupt_in, record, handles, saved, batch, metric, limit)
            for ((_, k), (_, n)), v in zip(batch, out.tolist(), strict=True):
                effect[k, n] = v
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return effect


Patch = tuple[tuple[int, int], tuple[int, int]]  # ((block, its index in layers), (position, its index))


def batches(patches: list[Patch], rows: int, seq: int | None) -> list[list[Patch]]:
    """``patches`` (sorted by block, then position) in forwards of at most ``rows`` rows. Under the causal
    limit (``seq`` given) a forward also holds only positions within ``seq // 16`` of its first (its cost is
    its rows times the positions from its first on)."""
    out: list[list[Patch]] = []
    for patch in patches:
        last = out[-1] if out else None
        if (last is None or len(last) >= rows
                or (seq is not None and (patch[0][0] != last[0][0][0] or patch[1][0] - last[0][1][0] > seq // 16))):
            out.append([patch])
        else:
            last.append(patch)
    return out


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
                 metric: Callable[[torch.Tensor], torch.Tensor], limit: _causal.Past | None) -> torch.Tensor:
    """One forward of ``len(batch)`` rows of the corrupt prompt, row r patched at its own (block, position);
    under the causal limit, from the batch's first position on."""
    n = len(batch)
    first = min(b for (b, _), _ in batch)
    start = min(p for _, (p, _) in batch) if limit is not None else 0
    inputs = limit.inputs(corrupt_in, start, n) if limit is not None and start else where.repeat_rows(corrupt_in, n)
    by_block: dict[int, list[tuple[int, int]]] = {}
    for r, ((_, k), (p, _)) in enumerate(batch):
        by_block.setdefault(k, []).append((r, p))
    skipped = record.skippable(first + (1 if _own_output(handles[batch[0][0][1]]) else 0))
    with torch.no_grad(), skip.serving(record, skipped, n, start):
        with model.trace(inputs):
            for k, spots in by_block.items():
                h = handles[k]
                rows = torch.tensor([r for r, _ in spots])
                at = torch.tensor([p for _, p in spots])
                h[where.key(h, rows, at - start)] = saved[k][where.key(h, torch.zeros_like(rows), at)]
            logits = model.logits.save()
    if limit is not None and start:
        logits = torch.cat([limit.logits_before(start, n), logits], dim=1)
    return where.metric_values(metric, logits, n)


def loop(model: AtlasModel, clean: Any, corrupt: Any, value: str = "layer_output",
         metric: Callable[[torch.Tensor], torch.Tensor] | None = None, positions: Iterable[int] | None = None,
         layers: Iterable[int] | None = None) -> torch.Tensor:
    """The sweep written as the loop it replaces: one traced forward of the corrupt prompt per patch, every
    block computed. What ``sweep`` is tested against, and what the bench times it against."""
    metric = where.checked("loop", model, metric)
    clean_in, corrupt_in, blocks, handles, spots = where.setup(model, clean, corrupt, value, layers, positions)
    saved = where.clean_values(model, clean_in, handles)
    with torch.no_grad():
        effect = torch.empty(len(blocks), len(spots))
        for k, h in enumerate(handles):
            axis = where.seq_axis(h)
            for n, p in enumerate(spots):
                with model.trace(corrupt_in):
                    h[(slice(None),) * axis + (p,)] = saved[k][(slice(None),) * axis + (p,)]
                    logits = model.logits.save()
                effect[k, n] = where.metric_values(metric, logits, 1)[0]
    return effect

