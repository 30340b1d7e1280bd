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

Its reading back is ``stored`` (:class:`StoredCache`), the checks of its integrity ``integrity``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

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


def reason_of(e: BaseException) -> str:
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
        raise CacheError(f"cannot write {path}: {reason_of(e)}; free space or make the folder writable, {then}") \
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
            raise CacheError(f"cannot read back {path}: {reason_of(e)}") from None
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
            raise CacheError(f"cannot write {path}: {reason_of(e)}; free space or make the folder writable, then "
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
                raise CacheError(f"--out {folder}: cannot write there ({reason_of(e)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise CacheError(f"--out {folder} is in use by another nnatlas cache run (pid {holder}); wait "
                                     "for it to end, or stop it and run again with --resume") from None
                raise CacheError(f"--out {folder}: cannot lock {self.path} ({reason_of(e)})") from None
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
            raise CacheError(f"--out {folder}: cannot write {self.path} ({reason_of(e)})") from None
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

