"""The integrity of a folder ``nnatlas cache`` wrote, checked before a row is read.

Nothing in the folder is trusted when it is read back: the manifest is checked field by field
(:class:`Manifest`), every shard name against the writer's pattern (inside the folder, no link out
of it), and every shard's safetensors header against the manifest; with ``verify="content"`` every
shard's sha256 too. Any disagreement raises one :class:`CacheError` naming the file and what
disagrees.
"""

from __future__ import annotations

import json
import re
import stat
import struct
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Union, cast

from ..spec import DType, Layout
from .data import CacheError
from .store import (
    DTYPES,
    FORMAT,
    ITEMSIZE,
    MANIFEST,
    META_KEYS,
    OLD_FORMATS,
    RUN,
    SHARD,
    file_sha256,
    reason_of,
    shard_metadata,
)

KINDS = typing.get_args(DType)  # a Layout's
MAX_HEADER = 100 << 20  # safetensors' own bound on a header
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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
        raise CacheError(f"{path}: cannot resolve ({reason_of(e)})") from None
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
        raise CacheError(f"{path}: cannot read ({reason_of(e)})") from None
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
        raise CacheError(f"{path}: cannot read ({reason_of(e)})") from None
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
            raise CacheError(f"{path}: cannot read ({reason_of(e)})") from None
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
        raise CacheError(f"{path}: cannot read ({reason_of(e)})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CacheError(f"{path}: not UTF-8 text") from None
    except ValueError as e:
        raise CacheError(f"{path}: not JSON ({e})") from None
    return Manifest.from_json(data, path), data

