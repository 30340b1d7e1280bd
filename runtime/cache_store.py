"""The folder ``nnatlas cache`` writes, and :class:`StoredCache`, which reads it back.

    DIR/run.json                           the run's settings (``--resume`` checks them)
    DIR/shard-<rank>-<index>.safetensors   rows [index * rows_per_shard, ...) of one rank, every value
    DIR/manifest.json                      written last: model, values, layouts, tokens, shard -> rows

A shard holds exactly ``rows_per_shard`` rows (a rank's last one fewer), so where shards start
depends only on the plan, never on when a run was stopped; each is written to a temporary name and
renamed, so a shard that exists is whole. A resumed run therefore writes the same bytes as one that
was never stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .cache_data import CacheError
from .spec import Layout

RUN = "run.json"
MANIFEST = "manifest.json"
FORMAT = "nnatlas-cache/1"


def shard_name(rank: int, index: int) -> str:
    return f"shard-{rank:03d}-{index:05d}.safetensors"


def write_json(path: Path, data: Any) -> None:
    """Written whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class ShardWriter:
    """Rows in, shards of exactly ``rows_per_shard`` rows out (the last one at :meth:`close`).

    ``skip`` rows of the first batch added are dropped: a resumed run starts at the batch that holds
    the first row not yet written, and recomputes that batch whole.
    """

    def __init__(self, folder: Path, rank: int, rows_per_shard: int, first_shard: int = 0, skip: int = 0):
        self.folder, self.rank, self.per_shard = folder, rank, rows_per_shard
        self.index = first_shard
        self.skip = skip
        self.pending: dict[str, list[torch.Tensor]] = {}
        self.buffered = 0
        self.written: list[str] = []

    def add(self, rows: dict[str, torch.Tensor]) -> None:
        n = next(iter(rows.values())).shape[0]
        if self.skip:
            drop = min(self.skip, n)
            rows = {k: v[drop:] for k, v in rows.items()}
            self.skip -= drop
            n -= drop
        if not n:
            return
        for k, v in rows.items():
            self.pending.setdefault(k, []).append(v)
        self.buffered += n
        while self.buffered >= self.per_shard:
            self._flush(self.per_shard)

    def close(self) -> None:
        if self.buffered:
            self._flush(self.buffered)

    def _flush(self, n: int) -> None:
        out: dict[str, torch.Tensor] = {}
        for k, parts in self.pending.items():
            whole = parts[0] if len(parts) == 1 else torch.cat(parts)
            # a part of a tensor is copied out (safetensors writes whole storages); all of one is not
            out[k] = whole.contiguous() if whole.shape[0] == n else whole[:n].clone()
            rest = whole[n:]
            self.pending[k] = [rest] if rest.shape[0] else []
        self.buffered -= n
        # one metadata key: safetensors writes several in hash order, which differs between runs
        self.write(self.folder / shard_name(self.rank, self.index), out,
                   {"nnatlas": f"{FORMAT} rank {self.rank} shard {self.index}"})
        self.written.append(shard_name(self.rank, self.index))
        self.index += 1

    @staticmethod
    def write(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)


def done_shards(folder: Path, rank: int, expected: int) -> int:
    """How many of a rank's shards a stopped run finished (the first that is missing ends them);
    temporary files it left are removed."""
    for stale in folder.glob(f".shard-{rank:03d}-*.tmp"):
        stale.unlink()
    k = 0
    while k < expected and (folder / shard_name(rank, k)).is_file():
        k += 1
    return k


def layout_of(entry: dict[str, Any]) -> Layout:
    return Layout(entry["name"], tuple(entry["row_dims"]), entry.get("kind", "float"))


class StoredCache:
    """A folder written by ``nnatlas cache``: its manifest, and its rows read from memory-mapped shards.

        stored = nnatlas.Cache.load("out/")
        for batch in stored.batches("layers[3].layer_output", 4096):   # [<=4096, hidden_size]
            sae.step(batch)
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            extra = " (a run that did not finish: run it again with --resume)" if (self.folder / RUN).is_file() else ""
            raise CacheError(f"{self.folder} has no {MANIFEST}{extra}")
        self.manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        if self.manifest.get("format") != FORMAT:
            raise CacheError(f"{path}: not an nnatlas cache manifest (format {self.manifest.get('format')!r})")

    @property
    def values(self) -> list[str]:
        return list(self.manifest["values"])

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    def __len__(self) -> int:
        return self.rows

    def layout(self, path: str) -> Layout:
        """The layout of the stored rows of ``path`` (``Residual [rows hidden_size]`` for one row per token)."""
        self._check(path)
        return layout_of(self.manifest["layouts"][path])

    def _check(self, path: str) -> None:
        if path not in self.manifest["layouts"] and path not in self.manifest["meta"]:
            raise KeyError(f"{path!r} is not in this cache; values: {', '.join(self.values)}; "
                           f"per-row facts: {', '.join(self.manifest['meta'])}")

    def batches(self, path: str, batch_size: int = 4096, *, start: int = 0, stop: int | None = None
                ) -> Iterator[torch.Tensor]:
        """Rows ``start:stop`` of ``path`` (a value, or a per-row fact such as ``meta.doc``) in run order,
        ``batch_size`` at a time (the last batch may be smaller), read from the memory-mapped shards."""
        from safetensors import safe_open

        self._check(path)
        if batch_size < 1:
            raise ValueError("batch_size is at least 1")
        stop = self.rows if stop is None else min(stop, self.rows)
        parts: list[torch.Tensor] = []
        have = 0
        for shard in self.manifest["shards"]:
            lo, hi = shard["rows"]
            if hi <= start or lo >= stop:
                continue
            with safe_open(str(self.folder / shard["file"]), framework="pt") as f:
                sl = f.get_slice(path)
                pos = max(start, lo)
                end = min(stop, hi)
                while pos < end:
                    take = min(end - pos, batch_size - have)
                    parts.append(sl[pos - lo:pos - lo + take])
                    have += take
                    pos += take
                    if have == batch_size:
                        yield parts[0] if len(parts) == 1 else torch.cat(parts)
                        parts, have = [], 0
        if parts:
            yield parts[0] if len(parts) == 1 else torch.cat(parts)

    def __getitem__(self, path: str) -> torch.Tensor:
        """Every row of ``path`` as one tensor (read whole: for a cache that fits in memory)."""
        return next(self.batches(path, max(self.rows, 1)))

    def __repr__(self) -> str:
        m = self.manifest
        return (f"<nnatlas cache {self.folder}: {m['model']} ({m['family']}), {m['rows']} rows "
                f"({m['positions']} positions, {m['tokens']} tokens) x {len(m['values'])} values in "
                f"{len(m['shards'])} shards>")
