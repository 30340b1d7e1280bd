"""What ``load(path, draft=True)`` keeps on disk: data, never code.

    $NNATLAS_CACHE/drafts/<digest>.json   (else $XDG_CACHE_HOME/nnatlas/drafts, else ~/.cache/nnatlas/drafts)
        {"format": "nnatlas-draft/2", "family": ..., "spec": the drafted spec's YAML text,
         "record": {"transformers", "config_class", "config_sha256", "compiler_sha256", "held", "refused", "verify_s"}}
    $NNATLAS_CACHE/drafts/<digest>.lock   the flock a process holds while it drafts that digest

A later load compiles the spec with this process's compiler, through the same door as a user's ``spec=FILE``
(:mod:`nnatlas.loading.user_specs`), so whatever the file says is a value in a spec; the record is checked against the model
(transformers' version, the config's class and sha256, the compiler's sources). The folder is read only when this
user owns it and no one else can write it (:mod:`nnatlas.safe_files`); made 0700, its files 0600, each written whole.

Two processes drafting the same model take turns on the lock (the second reads what the first kept); under an
initialized ``torch.distributed`` group rank 0 drafts first and the other ranks wait on a barrier, then read it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import safe_files

FORMAT = "nnatlas-draft/2"
MAX_BYTES = 4 << 20  # a kept draft (a spec of ~20 KB and its record); a larger file is refused unread
LOCK_TIMEOUT_S = 600.0  # how long a load waits for another process drafting the same model, then drafts beside it


class DraftCacheWarning(UserWarning):
    """A kept draft not used (said in one line: which file, why, and that the model is drafted again)."""


@dataclass(frozen=True)
class Record:
    """What a kept draft was drafted for, and what held when it was verified."""

    transformers: str
    config_class: str
    config_sha256: str
    compiler_sha256: str
    held: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    verify_s: float = 0.0


@dataclass(frozen=True)
class Kept:
    family: str
    spec: str
    record: Record


def to_bytes(kept: Kept) -> bytes:
    data = {"format": FORMAT, "family": kept.family, "spec": kept.spec,
            "record": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(kept.record).items()}}
    return (json.dumps(data, indent=1) + "\n").encode("utf-8")


_STR_FIELDS = ("transformers", "config_class", "config_sha256", "compiler_sha256")


def parse(raw: bytes) -> Kept:
    """A kept draft from its bytes, every field checked for its type; ValueError saying (in one line) what is wrong."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deep)") from None
    except ValueError as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(data, dict) or set(data) != {"format", "family", "spec", "record"}:
        keys = sorted(data)[:6] if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not a kept draft (its keys: {keys})")
    if data["format"] != FORMAT:
        raise ValueError(f"format {str(data['format'])[:40]!r}, this nnatlas reads {FORMAT!r}")
    if not isinstance(data["family"], str) or not isinstance(data["spec"], str):
        raise ValueError("its family and spec are not text")
    rec = data["record"]
    want = {f: str for f in _STR_FIELDS} | {"held": list, "refused": list, "verify_s": float}
    if not isinstance(rec, dict) or set(rec) != set(want):
        raise ValueError(f"its record's keys are not {sorted(want)}")
    for k, t in want.items():
        ok = isinstance(rec[k], (int, float)) and not isinstance(rec[k], bool) if t is float else isinstance(rec[k], t)
        if not ok or (t is list and not all(isinstance(x, str) for x in rec[k])):
            raise ValueError(f"its record's {k} is not {'a number' if t is float else 'a list of text' if t is list else 'text'}")
    if not math.isfinite(rec["verify_s"]) or rec["verify_s"] < 0:
        raise ValueError("its record's verify_s is not a time")
    record = Record(rec["transformers"], rec["config_class"], rec["config_sha256"], rec["compiler_sha256"],
                    tuple(rec["held"]), tuple(rec["refused"]), float(rec["verify_s"]))
    return Kept(data["family"], data["spec"], record)


def mismatch(record: Record, want: Record) -> str | None:
    """How a kept draft's record differs from what this load would draft (None: it is for this model)."""
    if record.transformers != want.transformers:
        return f"drafted under transformers {record.transformers[:40]}, this is {want.transformers}"
    if record.config_class != want.config_class:
        return f"drafted for a {record.config_class[:60]}, this model's config is a {want.config_class}"
    if record.config_sha256 != want.config_sha256:
        return (f"drafted for another config (sha256 {record.config_sha256[:12]}…, this model's is "
                f"{want.config_sha256[:12]}…)")
    if record.compiler_sha256 != want.compiler_sha256:
        return "drafted by another drafter or compiler than this nnatlas's"
    return None


def refused(path: Path, why: str, model_type: str) -> None:
    """The one line that says a kept draft is not used."""
    warnings.warn(f"the kept draft {path} is not used: {why}; {model_type} is drafted again", DraftCacheWarning,
                  stacklevel=4)


@dataclass
class Turn:
    """This load's turn at a digest: whether the folder may be read and written."""

    folder: Path
    digest: str
    readable: bool
    writable: bool

    @property
    def path(self) -> Path:
        return self.folder / f"{self.digest}.json"

    def read(self) -> bytes | None:
        """The kept draft's bytes, None when none is kept; Unsafe (why) when it is not read."""
        if not self.readable:
            return None
        try:
            return safe_files.read_private(self.path, MAX_BYTES)
        except FileNotFoundError:
            return None

    def write(self, kept: Kept) -> None:
        """Keep ``kept`` (whole, 0600); a folder that cannot be written is skipped: the draft still serves."""
        if self.writable:
            try:
                safe_files.write_private(self.path, to_bytes(kept))
            except OSError:
                pass


def _rank() -> int | None:
    """This process's rank in an initialized torch.distributed group of more than one process, else None."""
    import sys

    dist = sys.modules.get("torch.distributed")  # (never imported here: a process that made a group imported it)
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
        return None
    return int(dist.get_rank())


@contextmanager
def turn(folder: Path, digest: str, what: str) -> Iterator[Turn]:
    """This load's turn at drafting ``digest`` in ``folder``: rank 0 first when torch.distributed is initialized (the
    others wait on a barrier, then read what it kept), and one process at a time on the digest's lock file (a load
    that waited ``LOCK_TIMEOUT_S`` drafts beside the holder). A folder others can write is neither read nor written:
    one warning line names it and the fix, and the model is drafted in memory (``what``: the model type)."""
    rank = _rank()
    if rank is not None and rank != 0:
        import torch.distributed as dist

        dist.barrier()  # rank 0 drafts and keeps it first
    try:
        why = safe_files.folder_refusal(folder)
        if why is not None:
            warnings.warn(f"{why}; {what} is drafted afresh in memory", safe_files.UnsafeFolderWarning, stacklevel=4)
            yield Turn(folder, digest, False, False)
            return
        try:
            safe_files.make_private_dir(folder)
        except OSError:
            yield Turn(folder, digest, False, False)  # (no cache to keep it in: drafted in memory)
            return
        with safe_files.FileLock(folder / f"{digest}.lock", LOCK_TIMEOUT_S) as lock:
            if not lock.acquired and lock.fd is not None:
                warnings.warn(f"another process has been drafting {what} into {folder} for {lock.waited:.0f} s "
                              f"(its lock {lock.path}); drafted here too", DraftCacheWarning, stacklevel=4)
            yield Turn(folder, digest, True, lock.fd is not None)
    finally:
        if rank == 0:
            import torch.distributed as dist

            dist.barrier()  # (also when the draft failed: the others then draft, and fail, themselves)
