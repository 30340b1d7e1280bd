"""The folder ``nnatlas cache`` writes, and :class:`StoredCache`, which reads it back.

    DIR/run.json                           the run's settings and run id (``--resume`` checks them)
    DIR/shard-<rank>-<index>.safetensors   rows [index * rows_per_shard, ...) of one rank, every value
    DIR/journal-<rank>.json                each shard the rank finished: its sha256 and size
    DIR/manifest.json                      written last: model, values, layouts, tokens, shard -> rows, sha256
    DIR/.lock                              while a run holds the folder (its pid); gone when it ends

A shard holds exactly ``rows_per_shard`` rows (a rank's last one fewer), so where shards start
depends only on the plan, never on when a run was stopped; each is written to a temporary name and
renamed, then its sha256 goes into the rank's journal (rewritten whole, by rename). A resumed run
keeps the shards whose bytes hash to what the journal says, in order, and writes the rest again:
it therefore writes the same bytes as one that was never stopped.

The run id is the sha256 of the run's settings: each shard's safetensors metadata names the run,
its rank and its index, and the manifest names the run, so a shard of another run (or a shard
under another shard's name) is found at :meth:`Cache.load <nnatlas.Cache.load>`. Two runs of the
same settings write the same bytes, so they share the id.

Nothing in the folder is trusted when it is read back: the manifest is checked field by field
(:class:`Manifest`), every shard name against the writer's pattern (inside the folder, no link out
of it), and every shard's safetensors header against the manifest; with ``verify="content"`` every
shard's sha256 too. Any disagreement raises one :class:`CacheError` naming the file and what
disagrees.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import struct
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Union, cast

import torch
import torch.utils.data

from ..spec import DType, Layout
from .data import CacheError

RUN = "run.json"
MANIFEST = "manifest.json"
LOCK = ".lock"
FORMAT = "nnatlas-cache/2"
OLD_FORMATS = ("nnatlas-cache/1",)
SHARD = re.compile(r"^shard-(\d{3})-(\d{5})\.safetensors$")
# what a run may leave behind when it is killed: removed when a run takes the folder again
# a temporary file's name; ``rank`` is the rank whose shard or journal it is (none: run.json, the manifest)
TEMPORARY = re.compile(r"^\.(?:shard-(?P<rank>\d{3})-\d{5}\.safetensors|(?:run|manifest|journal-(?P<journal>\d{3}))"
                       r"\.json\.\d+)\.tmp$")
# torch dtype name <-> safetensors' header name
DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
          "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
          "float8_e5m2": "F8_E5M2"}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
META_KEYS = {"all": ("meta.doc", "meta.length", "meta.tokens"), "last": ("meta.doc", "meta.position", "meta.token"),
             "nonpad": ("meta.doc", "meta.position", "meta.token")}
KINDS = typing.get_args(DType)  # a Layout's
MAX_HEADER = 100 << 20  # safetensors' own bound on a header
VERIFY = ("header", "content")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def shard_name(rank: int, index: int) -> str:
    return f"shard-{rank:03d}-{index:05d}.safetensors"


def journal_name(rank: int) -> str:
    return f"journal-{rank:03d}.json"


def shard_metadata(run_id: str, rank: int, index: int) -> dict[str, str]:
    # one metadata key: safetensors writes several in hash order, which differs between runs
    return {"nnatlas": f"{FORMAT} run {run_id} rank {rank} shard {index}"}


def run_id_of(settings: dict[str, Any]) -> str:
    """The sha256 of the settings (without a run id of their own), canonical JSON."""
    body = {k: v for k, v in settings.items() if k != "run_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text


def write_json(path: Path, data: Any, then: str = "then run again with --resume") -> None:
    """Written whole or not at all (a temporary file, then a rename); a failed write (a full disk, a
    read-only folder) leaves no temporary file and raises CacheError (ending with ``then``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise CacheError(f"cannot write {path}: {_reason(e)}; free space or make the folder writable, {then}") \
            from None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks of 1 MiB (about 500 MB/s on one core here)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Rows in, shards of exactly ``rows_per_shard`` rows out (the last one at :meth:`close`).

    ``skip`` rows of the first batch added are dropped: a resumed run starts at the batch that holds
    the first row not yet written, and recomputes that batch whole. ``sha256`` holds the shards a
    resumed run kept (name -> {"sha256", "bytes"}); each shard written is added to it and to the
    rank's journal. The writer touches no state of the process (no umask, no signal): one thread
    may run it while another computes.
    """

    def __init__(self, folder: Path, rank: int, rows_per_shard: int, first_shard: int = 0, skip: int = 0, *,
                 run_id: str = "", sha256: dict[str, dict[str, Any]] | None = None):
        self.folder, self.rank, self.per_shard = folder, rank, rows_per_shard
        self.index = first_shard
        self.skip = skip
        self.run_id = run_id
        self.sha256: dict[str, dict[str, Any]] = dict(sha256 or {})
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
        name = shard_name(self.rank, self.index)
        path = self.folder / name
        self.write(path, out, shard_metadata(self.run_id, self.rank, self.index))
        try:
            record = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
        except OSError as e:
            raise CacheError(f"cannot read back {path}: {_reason(e)}") from None
        self.sha256[name] = record
        self.write_journal()
        self.written.append(name)
        self.index += 1

    def write_journal(self) -> None:
        write_json(self.folder / journal_name(self.rank),
                   {"format": FORMAT, "run_id": self.run_id, "rank": self.rank,
                    "shards": [{"file": k, **v} for k, v in sorted(self.sha256.items())]})

    @staticmethod
    def write(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
        """A whole shard under ``path``, or nothing (its temporary file removed) and a CacheError.

        safetensors writes files 0600; the shard is given the mode a new file gets under this
        process's umask (read from a file created for it, so the umask is never changed)."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        tmp = path.with_name(f".{path.name}.tmp")
        try:
            _remove(tmp)
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            try:
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
            finally:
                os.close(fd)
            save_file(tensors, str(tmp), metadata=metadata)
            os.chmod(tmp, mode)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, SafetensorError) as e:
            _remove(tmp)
            raise CacheError(f"cannot write {path}: {_reason(e)}; free space or make the folder writable, then "
                             "run again with --resume") from None


# ---- taking a folder, resuming in it --------------------------------------------------------------

class FolderLock:
    """An exclusive ``fcntl.flock`` on ``DIR/.lock`` (which holds the holder's pid) while a run writes
    in DIR; a second run (or ``--resume``) is refused, naming the holder. The lock file is removed
    when the lock is released; a process killed while holding it leaves the file, whose lock the
    kernel released, so the next run takes it."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.fd: int | None = None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as e:
                raise CacheError(f"--out {folder}: cannot write there ({_reason(e)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise CacheError(f"--out {folder} is in use by another nnatlas cache run (pid {holder}); wait "
                                     "for it to end, or stop it and run again with --resume") from None
                raise CacheError(f"--out {folder}: cannot lock {self.path} ({_reason(e)})") from None
            try:  # the file may have been removed by its last holder between our open and our lock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:
            _remove(self.path)
            os.close(fd)
            raise CacheError(f"--out {folder}: cannot write {self.path} ({_reason(e)})") from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            _remove(self.path)  # before the unlock: whoever locks next makes a new file
            os.close(self.fd)
            self.fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def remove_temporary(folder: Path, rank: int | None = None) -> None:
    """The temporary files a killed run left (of ``rank``'s shards and journal, or all of them)."""
    for p in folder.iterdir() if folder.is_dir() else ():
        match = TEMPORARY.match(p.name)
        if match and (rank is None or int(match["rank"] or match["journal"] or -1) == rank):
            _remove(p)  # (by the rank in its name: rank 0's '-000' is also in rank 1's shard '-001-00000')


def resume_point(folder: Path, rank: int, expected: int, run_id: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """How many of a rank's shards a stopped run finished, checked against its journal: the first
    shard that is missing, not in the journal, or whose size or sha256 differs from it ends them
    (it and the ones after are written again). Temporary files the run left are removed."""
    remove_temporary(folder, rank)
    record: dict[str, dict[str, Any]] = {}
    try:
        journal = json.loads((folder / journal_name(rank)).read_text(encoding="utf-8"))
        if journal.get("run_id") == run_id and journal.get("rank") == rank and journal.get("format") == FORMAT:
            for e in journal["shards"]:
                if isinstance(e.get("file"), str) and isinstance(e.get("sha256"), str) and type(e.get("bytes")) is int:
                    record[e["file"]] = {"sha256": e["sha256"], "bytes": e["bytes"]}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        record = {}  # no journal, or not one this run wrote: every shard is written again
    kept: dict[str, dict[str, Any]] = {}
    for k in range(expected):
        name = shard_name(rank, k)
        path = folder / name
        want = record.get(name)
        try:
            st = path.lstat()
            ok = (want is not None and stat.S_ISREG(st.st_mode) and st.st_size == want["bytes"]
                  and file_sha256(path) == want["sha256"])
        except OSError:
            ok = False
        if not ok:
            break
        kept[name] = dict(want)  # type: ignore[arg-type]
    return len(kept), kept


# ---- the manifest: a strict schema ----------------------------------------------------------------
#
# Frozen dataclasses checked by a small validator of their own (``_parse``), not pydantic: the
# runtime stays light to import (``import nnatlas`` never pulls pydantic in; tests/test_architecture.py
# forbids it), and a manifest needs only JSON types. ``from_json`` checks every field's type, rejects
# unknown and missing keys, then each class's ``_ranges`` checks values against each other, and all
# the problems found are reported at once.

class _Problems(list[str]):
    def add(self, where: str, what: str) -> None:
        self.append(f"{where}: {what}" if where else what)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _parse(tp: Any, value: Any, where: str, problems: _Problems) -> Any:
    """``value`` (from JSON) as ``tp``, or None with the problems added."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"no parser for {tp}")  # (a schema of this module's own: X | None only)
        return _parse(rest[0], value, where, problems)
    if tp is bool or tp is str:
        if type(value) is not tp:
            problems.add(where, f"{value!r:.60} is not a {tp.__name__}")
        return value
    if tp is int:
        if type(value) is not int:
            problems.add(where, f"{value!r:.60} is not an integer")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            problems.add(where, f"{value!r:.60} is not a list")
            return None
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_parse(args[0], v, f"{where}[{i}]", problems) for i, v in enumerate(value))
        if len(value) != len(args):
            problems.add(where, f"{value!r:.60} is not a list of {len(args)}")
            return None
        return tuple(_parse(a, v, f"{where}[{i}]", problems) for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            problems.add(where, f"{value!r:.60} is not an object")
            return None
        return {k: _parse(args[1], v, f"{where}[{k!r}]", problems) for k, v in value.items()}
    if is_dataclass(tp):
        return _from_json(tp, value, where, problems)
    raise TypeError(f"no parser for {tp}")  # (a schema of this module's own)


def _from_json(cls: Any, value: Any, where: str, problems: _Problems) -> Any:
    if not isinstance(value, dict):
        problems.add(where, f"{value!r:.60} is not an object")
        return None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.default is MISSING]  # (the keys a manifest must have)
    for k in value:
        if k not in hints:
            problems.add(where, f"unknown key {k!r}")
    before = len(problems)
    kwargs = {}
    for f in fields(cls):
        name, at = f.name, f"{where}.{f.name}" if where else f.name
        if name not in value:
            if f.default is MISSING:
                problems.add(where, f"no {name!r}")
            continue
        n = len(problems)
        kwargs[name] = _parse(hints[name], value[name], at, problems)
        low = getattr(cls, "MIN", {}).get(name)
        if low is not None and len(problems) == n and kwargs[name] is not None:
            _at_least(problems, at, kwargs[name], low)
    if len(problems) > before or any(n not in kwargs for n in names):
        return None
    made = cls(**kwargs)
    made._ranges(where, problems)
    return made


def _at_least(problems: _Problems, where: str, value: int, low: int) -> None:
    if value < low:
        problems.add(where, f"{value} is below {low}")


@dataclass(frozen=True)
class DataFile:
    file: str
    sha256: str
    text_field: str

    def _ranges(self, where: str, problems: _Problems) -> None:
        if not _HEX64.match(self.sha256):
            problems.add(f"{where}.sha256", "not a sha256 (64 hex digits)")


@dataclass(frozen=True)
class StoredLayout:
    name: str
    layout: str
    kind: str
    row_dims: tuple[str, ...]
    row_shape: tuple[int, ...]
    dtype: str

    def _ranges(self, where: str, problems: _Problems) -> None:
        _shape(self.row_shape, self.dtype, where, problems)
        if self.kind not in KINDS:
            problems.add(f"{where}.kind", f"{self.kind!r} is not one of {', '.join(KINDS)}")
        if self.row_dims[:1] != ("rows",):
            problems.add(f"{where}.row_dims", f"{list(self.row_dims)} does not start with 'rows'")
        if len(self.row_dims) != len(self.row_shape) + 1:
            problems.add(where, f"row_dims {list(self.row_dims)} do not fit row_shape {list(self.row_shape)}")


@dataclass(frozen=True)
class StoredMeta:
    row_shape: tuple[int, ...]
    dtype: str

    def _ranges(self, where: str, problems: _Problems) -> None:
        _shape(self.row_shape, self.dtype, where, problems)


def _shape(row_shape: tuple[int, ...], dtype: str, where: str, problems: _Problems) -> None:
    for i, s in enumerate(row_shape):
        _at_least(problems, f"{where}.row_shape[{i}]", s, 0)
    if dtype not in DTYPES:
        problems.add(f"{where}.dtype", f"{dtype!r} is not a dtype a shard stores ({', '.join(DTYPES)})")


@dataclass(frozen=True)
class ShardEntry:
    MIN: ClassVar[dict[str, int]] = {"rank": 0, "bytes": 8}  # integer fields' least values

    file: str
    rank: int
    rows: tuple[int, int]
    docs: tuple[int, int]
    sha256: str
    bytes: int

    def _ranges(self, where: str, problems: _Problems) -> None:
        m = SHARD.match(self.file)
        if not m:
            problems.add(f"{where}.file", f"{self.file!r:.80} is not a shard name (shard-RRR-IIIII.safetensors)")
        elif int(m.group(1)) != self.rank:
            problems.add(f"{where}.file", f"{self.file} is not a shard of rank {self.rank}")
        if not 0 <= self.rows[0] <= self.rows[1]:
            problems.add(f"{where}.rows", f"{list(self.rows)} is not a range of rows")
        if not 0 <= self.docs[0] <= self.docs[1]:
            problems.add(f"{where}.docs", f"{list(self.docs)} is not a range of documents")
        if not _HEX64.match(self.sha256):
            problems.add(f"{where}.sha256", "not a sha256 (64 hex digits)")

    @property
    def index(self) -> int:
        return int(self.file[len("shard-000-"):-len(".safetensors")])


@dataclass(frozen=True)
class Manifest:
    """Every field of ``manifest.json``, checked (:meth:`from_json`)."""

    MIN: ClassVar[dict[str, int]] = {"seq_len": 1, "batch_size": 1, "max_tokens": 1, "world_size": 1, "tp_size": 1,
                                     "rows_per_shard": 1, "tokens": 0, "padded_tokens": 0, "docs": 0, "rows": 0}

    format: str
    run_id: str
    model: str
    family: str
    revision: str | None
    config_sha256: str
    data: DataFile
    values: tuple[str, ...]
    positions: str
    seq_len: int
    batch_size: int
    max_tokens: int | None
    dtype: str | None
    model_dtype: str
    attn_implementation: str | None
    world_size: int
    rows_per_shard: int
    order: str  # the batches' order: "length" (longest documents first: rows map back by meta.doc) or "file"
    layouts: dict[str, StoredLayout]
    meta: dict[str, StoredMeta]
    tokens: int
    padded_tokens: int
    docs: int
    rows: int
    shards: tuple[ShardEntry, ...]
    # the ranks each copy of the model was sharded over (nnatlas cache --tp); world_size counts the copies (the
    # ranks that wrote shards). A manifest written before --tp has none: 1
    tp_size: int = 1

    @classmethod
    def from_json(cls, data: Any, path: Path) -> Manifest:
        """The manifest ``data`` (parsed JSON) read from ``path``, or a CacheError listing every problem."""
        if isinstance(data, dict) and data.get("format") != FORMAT:
            fmt = data.get("format")
            if fmt in OLD_FORMATS:
                raise CacheError(f"{path}: a cache of format {fmt}, written by an older nnatlas; this one reads "
                                 f"{FORMAT} (shard checksums, a run id): run nnatlas cache again to write it")
            raise CacheError(f"{path}: not an nnatlas cache manifest (format {fmt!r:.60}, expected {FORMAT!r})")
        problems = _Problems()
        made = _from_json(cls, data, "", problems)
        if problems or made is None:
            shown = "; ".join(problems[:12]) + (f"; … ({len(problems)} problems)" if len(problems) > 12 else "")
            raise CacheError(f"{path}: not a valid manifest: {shown}")
        return made  # type: ignore[no-any-return]

    def _ranges(self, where: str, problems: _Problems) -> None:
        if not _HEX64.match(self.run_id):
            problems.add("run_id", "not a run id (64 hex digits)")
        if not _HEX64.match(self.config_sha256):
            problems.add("config_sha256", "not a sha256 (64 hex digits)")
        if self.order not in ("length", "file"):
            problems.add("order", f"{self.order!r} is not one of length, file")
        if self.positions not in META_KEYS:
            problems.add("positions", f"{self.positions!r} is not one of {', '.join(META_KEYS)}")
        elif set(self.meta) != set(META_KEYS[self.positions]):
            problems.add("meta", f"{sorted(self.meta)} are not the per-row facts of positions "
                                 f"{self.positions} ({', '.join(META_KEYS[self.positions])})")
        if list(self.values) != list(self.layouts):
            problems.add("values", f"{list(self.values)[:6]} are not the values of layouts {list(self.layouts)[:6]}")
        # shards: each rank's in index order 0, 1, ..., ranks in order, rows contiguous from 0 to rows
        row, index, rank = 0, 0, -1
        seen = set()
        for i, s in enumerate(self.shards):
            where = f"shards[{i}]"
            if s.file in seen:
                problems.add(where, f"{s.file} is listed twice")
            seen.add(s.file)
            if not 0 <= s.rank < self.world_size:
                problems.add(f"{where}.rank", f"{s.rank} is not a rank of world_size {self.world_size}")
            if s.rank != rank:
                if s.rank < rank:
                    problems.add(f"{where}.rank", f"rank {s.rank} after rank {rank}")
                rank, index = s.rank, 0
            if SHARD.match(s.file) and s.index != index:
                problems.add(f"{where}.file", f"{s.file} where shard {index} of rank {s.rank} belongs")
            index += 1
            if s.rows[0] != row:
                problems.add(f"{where}.rows", f"start at row {s.rows[0]}, not {row} where the shard before ends")
            if not 0 < s.rows[1] - s.rows[0] <= self.rows_per_shard:
                problems.add(f"{where}.rows", f"{s.rows[1] - s.rows[0]} rows, not 1 to rows_per_shard "
                                              f"({self.rows_per_shard})")
            row = s.rows[1]
        if row != self.rows:
            problems.add("rows", f"{self.rows}, but the shards hold {row}")

    def stored(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each key a shard holds: (row shape, dtype)."""
        out = {k: (v.row_shape, v.dtype) for k, v in self.layouts.items()}
        out.update({k: (v.row_shape, v.dtype) for k, v in self.meta.items()})
        return out


# ---- a shard's safetensors header, read and checked without trusting it --------------------------

def shard_path(folder: Path, name: str) -> Path:
    """``folder / name`` for a name of the writer's pattern that stays inside ``folder`` (no link out)."""
    if not SHARD.match(name):
        raise CacheError(f"{folder / MANIFEST}: {name!r:.80} is not a shard name (shard-RRR-IIIII.safetensors)")
    path = folder / name
    try:
        inside = path.resolve().parent == folder.resolve()
    except (OSError, RuntimeError) as e:  # a loop of links
        raise CacheError(f"{path}: cannot resolve ({_reason(e)})") from None
    if not inside:
        raise CacheError(f"{path}: a link out of {folder} (to {path.resolve()}); a shard is a file in the folder")
    return path


def read_header(path: Path, size: int) -> dict[str, Any]:
    """The JSON header of the safetensors file ``path`` of ``size`` bytes, bounds checked."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CacheError(f"{path}: {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise CacheError(f"{path}: its header claims {n} bytes, the file has {size}")
            raw = f.read(n)
    except OSError as e:
        raise CacheError(f"{path}: cannot read ({_reason(e)})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CacheError(f"{path}: its safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise CacheError(f"{path}: its safetensors header is not a JSON object")
    header["__size__"] = 8 + n
    return header


def check_shard(folder: Path, m: Manifest, entry: ShardEntry, *, content: bool) -> Path:
    """Shard ``entry`` against the manifest: a regular file of the recorded size whose header names
    this run, rank and index, and holds each stored key with the manifest's dtype and row shape,
    ``rows`` rows, the tensors' bytes exactly filling the file; with ``content``, its sha256 too."""
    path = shard_path(folder, entry.file)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CacheError(f"{path}: missing (the manifest lists it)") from None
    except OSError as e:
        raise CacheError(f"{path}: cannot read ({_reason(e)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CacheError(f"{path}: not a regular file")
    if st.st_size != entry.bytes:
        raise CacheError(f"{path}: {st.st_size} bytes, the manifest says {entry.bytes} (cut short or replaced)")
    header = read_header(path, st.st_size)
    body = st.st_size - header.pop("__size__")
    want_meta = shard_metadata(m.run_id, entry.rank, entry.index)
    got_meta = header.pop("__metadata__", None)
    if got_meta != want_meta:
        said = got_meta.get("nnatlas") if isinstance(got_meta, dict) else got_meta
        raise CacheError(f"{path}: its metadata says {said!r:.160}, the manifest wants {want_meta['nnatlas']!r} "
                         "(a shard of another run, or under another shard's name)")
    stored = m.stored()
    if set(header) != set(stored):
        extra, lost = sorted(set(header) - set(stored)), sorted(set(stored) - set(header))
        raise CacheError(f"{path}: its tensors differ from the manifest's values"
                         f"{f' (not in the manifest: {extra[:4]})' if extra else ''}"
                         f"{f' (missing: {lost[:4]})' if lost else ''}")
    n = entry.rows[1] - entry.rows[0]
    spans = []
    for key, (row_shape, dtype) in stored.items():
        t = header[key]
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            raise CacheError(f"{path}: the header entry of {key} is not a tensor's")
        shape, offsets = t["shape"], t["data_offsets"]
        want = [n, *row_shape]
        if t["dtype"] != DTYPES[dtype]:
            raise CacheError(f"{path}: {key} is {t['dtype']!r:.20}, the manifest says {dtype} ({DTYPES[dtype]})")
        if shape != want:
            raise CacheError(f"{path}: {key} has shape {shape!r:.60}, the manifest says {want} "
                             f"({n} rows of {list(row_shape)})")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or offsets[1] - offsets[0] != ITEMSIZE[DTYPES[dtype]] * _numel(want)):
            raise CacheError(f"{path}: {key}'s data offsets {offsets!r:.60} do not fit its shape")
        spans.append((offsets[0], offsets[1], key))
    spans.sort()
    end = 0
    for lo, hi, key in spans:
        if lo != end:
            raise CacheError(f"{path}: {key}'s data starts at {lo}, not {end} (a gap or an overlap)")
        end = hi
    if end != body:
        raise CacheError(f"{path}: its tensors take {end} bytes after the header, the file has {body}")
    if content:
        try:
            digest = file_sha256(path)
        except OSError as e:
            raise CacheError(f"{path}: cannot read ({_reason(e)})") from None
        if digest != entry.sha256:
            raise CacheError(f"{path}: its sha256 is {digest[:16]}…, the manifest says {entry.sha256[:16]}… "
                             "(its bytes changed after it was written)")
    return path


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def layout_of(entry: StoredLayout) -> Layout:
    return Layout(entry.name, tuple(entry.row_dims), cast(DType, entry.kind))


def read_manifest(folder: Path) -> tuple[Manifest, dict[str, Any]]:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise CacheError(f"{folder}: no such folder")
    if not path.is_file():
        extra = " (a run that did not finish: run it again with --resume)" if (folder / RUN).is_file() else ""
        raise CacheError(f"{folder} has no {MANIFEST}{extra}")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CacheError(f"{path}: cannot read ({_reason(e)})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CacheError(f"{path}: not UTF-8 text") from None
    except ValueError as e:
        raise CacheError(f"{path}: not JSON ({e})") from None
    return Manifest.from_json(data, path), data


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
            raise CacheError(f"{self.paths[i]}: cannot read ({_reason(e)}); it changed after Cache.load "
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

    def __repr__(self) -> str:
        m = self.schema
        return (f"<nnatlas cache {self.folder}: {m.model} ({m.family}), {m.rows} rows "
                f"({m.positions} positions, {m.tokens} tokens) x {len(m.values)} values in "
                f"{len(m.shards)} shards>")


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
