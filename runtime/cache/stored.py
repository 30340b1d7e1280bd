"""A folder ``nnatlas cache`` wrote, read back: :class:`StoredCache` (``Cache.load``), each value's rows in run
order from the memory-mapped shards once ``integrity`` has checked them, and :class:`RowDataset`, the rows as a
torch dataset (shuffled by shard, then by row, deterministically).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

from .. import safe_files
from ..spec import Layout
from ..tree import tables
from .data import CacheError
from .integrity import check_shard, layout_of, read_manifest
from .store import META_KEYS, reason_of

VERIFY = ("header", "content")


class StoredCache:
    """A folder written by ``nnatlas cache``: its manifest, and its rows read from memory-mapped shards.

        stored = nnatlas.Cache.load("out/")
        for batch in stored.batches("layers[3].layer_output", 4096):   # [<=4096, hidden_size]
            sae.step(batch)

    ``verify="header"`` (the default) checks the manifest and every shard's name, size and
    safetensors header against it (tensor names, dtypes, shapes, rows, run id) — a few reads of
    a few KB per shard. ``verify="content"`` also hashes every shard's bytes against the sha256 the
    manifest records: about 500 MB/s on one core here (hashlib's sha256, 1 MiB reads from the page
    cache), so about 20 s for a 10 GB cache, longer where the disk reads slower than that.
    """

    def __init__(self, folder: str | Path, verify: str = "header"):
        if verify not in VERIFY:
            raise CacheError(f"verify={verify!r}: one of {', '.join(map(repr, VERIFY))}")
        self.folder = Path(folder)
        safe_files.warn_if_others_write(self.folder, "others can change the rows it serves, its manifest included")
        self.schema, self.manifest = read_manifest(self.folder)
        self.paths = [check_shard(self.folder, self.schema, s, content=verify == "content")
                      for s in self.schema.shards]

    @property
    def values(self) -> list[str]:
        return list(self.schema.values)

    @property
    def rows(self) -> int:
        return self.schema.rows

    def __len__(self) -> int:
        return self.rows

    def layout(self, path: str) -> Layout:
        """The layout of the stored rows of ``path`` (``Residual [rows hidden_size]`` for one row per token)."""
        self._check(path)
        return layout_of(self.schema.layouts[path])

    def _check(self, path: str) -> None:
        if path not in self.schema.layouts and path not in self.schema.meta:
            raise KeyError(f"{path!r} is not in this cache; values: {', '.join(self.values)}; "
                           f"per-row facts: {', '.join(self.schema.meta)}")

    def _open(self, i: int) -> Any:
        from safetensors import safe_open

        try:
            return safe_open(str(self.paths[i]), framework="pt")
        except Exception as e:  # the file changed since it was checked; safetensors' errors have no one base
            raise CacheError(f"{self.paths[i]}: cannot read ({reason_of(e)}); it changed after Cache.load "
                             "checked it") from None

    def batches(self, path: str, batch_size: int = 4096, *, start: int = 0, stop: int | None = None
                ) -> Iterator[torch.Tensor]:
        """Rows ``start:stop`` of ``path`` (a value, or a per-row fact such as ``meta.doc``) in run order,
        ``batch_size`` at a time (the last batch may be smaller), read from the memory-mapped shards."""
        self._check(path)
        if batch_size < 1:
            raise ValueError("batch_size is at least 1")
        stop = self.rows if stop is None else min(stop, self.rows)
        parts: list[torch.Tensor] = []
        have = 0
        for i, shard in enumerate(self.schema.shards):
            lo, hi = shard.rows
            if hi <= start or lo >= stop:
                continue
            with self._open(i) as f:
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

    def dataset(self, values: str | Sequence[str] | None = None, *, shuffle: bool = False, seed: int = 0,
                batch_size: int | None = None) -> RowDataset:
        """The rows as a torch ``IterableDataset`` (see :class:`RowDataset`) of ``values`` (default:
        every value), each row with its ``attention_mask``, ``doc``, ``position`` and ``token``;
        with ``batch_size``, batches of rows (for ``DataLoader(ds, batch_size=None)``)."""
        if values is None:
            names = self.values
        else:
            names = [values] if isinstance(values, str) else list(values)
        for name in names:
            if name not in self.schema.layouts:
                raise KeyError(f"{name!r} is not a value of this cache; values: {', '.join(self.values)}")
        if batch_size is not None and (type(batch_size) is not int or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r}: a number of rows, at least 1")
        return RowDataset(self, names, shuffle=shuffle, seed=seed, batch_size=batch_size)

    def _title(self) -> str:
        m = self.schema
        return (f"nnatlas cache {self.folder}: {m.model} ({m.family}), {m.rows} rows "
                f"({m.positions} positions, {m.tokens} tokens) x {len(m.values)} values in "
                f"{len(m.shards)} shards")

    def __repr__(self) -> str:
        return f"<{self._title()}>"

    def _repr_html_(self) -> str:
        rows = [(path, str(self.rows), self.layout(path).text) for path in self.values]
        return tables.view(self._title(), [tables.table(("value", "rows", "layout"), rows)])


class RowDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The rows of a stored cache, one dict a row: each value's row, and where the row comes from.

        ds = nnatlas.Cache.load("acts/").dataset("layers[3].layer_output", shuffle=True, seed=0)
        loader = torch.utils.data.DataLoader(ds, batch_size=4096, num_workers=4)
        for epoch in range(3):
            ds.set_epoch(epoch)
            for batch in loader: ...   # batch["layers[3].layer_output"]: [4096, hidden]

    A row holds each value (its stored row), ``doc`` (the record number in the data file),
    ``position`` (the token's place in its document; under ``--positions all``, ``0 .. seq_len-1``),
    ``attention_mask`` (1 where a token is real: always 1 for a per-token row; under ``all``,
    ``[seq_len]`` with 0 on the padding), ``token`` (its token id, or ids) and ``row`` (its row
    number in the cache). With ``shuffle``, the shards are drawn in an order given by ``seed`` and
    the epoch, then the rows inside each shard: one shard is read at a time, so memory holds one
    shard of the chosen values. DataLoader workers split the shards (worker ``w`` of ``n`` takes
    every ``n``-th shard of the order): every row is served once an epoch, by one worker.

    With ``batch_size``, each item is a batch of rows in that same order (each shard's rows cut into
    batches, its last one smaller), gathered by one index per tensor: use ``DataLoader(ds,
    batch_size=None)``. One dict a row costs Python per row; a batch costs it per batch.
    """

    def __init__(self, stored: StoredCache, values: list[str], *, shuffle: bool, seed: int,
                 batch_size: int | None = None):
        super().__init__()
        self.stored, self.values, self.shuffle, self.seed = stored, values, shuffle, int(seed)
        self.batch_size = batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Another order of the same rows (with ``shuffle``); call it before each epoch's iteration."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Rows, or with ``batch_size`` batches (every worker's together)."""
        if self.batch_size is None:
            return self.stored.rows
        return sum(-(-(s.rows[1] - s.rows[0]) // self.batch_size) for s in self.stored.schema.shards)

    def _generator(self, *salt: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(int.from_bytes(hashlib.sha256(repr((self.seed, self.epoch, *salt)).encode()).digest()[:8],
                                     "little") >> 1)
        return g

    def shard_order(self) -> list[int]:
        n = len(self.stored.schema.shards)
        return torch.randperm(n, generator=self._generator(-1)).tolist() if self.shuffle else list(range(n))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        order = self.shard_order()
        if info is not None:
            order = order[info.id::info.num_workers]
        for i in order:
            yield from self._shard(i)

    def _shard(self, i: int) -> Iterator[dict[str, torch.Tensor]]:
        positions = self.stored.schema.positions
        lo, hi = self.stored.schema.shards[i].rows
        n = hi - lo
        with self.stored._open(i) as f:
            cols = {name: f.get_tensor(name) for name in self.values}
            meta = {k: f.get_tensor(k) for k in META_KEYS[positions]}
        if positions == "all":
            seq = meta["meta.tokens"].shape[1]
            position = torch.arange(seq, dtype=torch.int32)
            cols.update({"doc": meta["meta.doc"], "position": position.expand(n, seq),
                         "attention_mask": (position[None, :] < meta["meta.length"][:, None]).long(),
                         "token": meta["meta.tokens"]})
        else:
            cols.update({"doc": meta["meta.doc"], "position": meta["meta.position"],
                         "attention_mask": torch.ones(n, dtype=torch.long), "token": meta["meta.token"]})
        cols["row"] = torch.arange(lo, hi)
        rows = torch.randperm(n, generator=self._generator(i)) if self.shuffle else torch.arange(n)
        if self.batch_size is None:
            for r in rows.tolist():
                yield {k: t[r] for k, t in cols.items()}
        else:
            for take in rows.split(self.batch_size):
                yield {k: t.index_select(0, take) for k, t in cols.items()}
