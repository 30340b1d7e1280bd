"""``nnatlas cache``'s output folder: taken (locked, begun, or checked for ``--resume``) before any forward, and
its manifest written last."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ..cache.data import CacheError, Plan
from ..cache.store import (
    FORMAT,
    LOCK,
    MANIFEST,
    RUN,
    TEMPORARY,
    FolderLock,
    remove_temporary,
    shard_name,
    write_json,
)
from .ranks import Dist, checked


def take_out(args: argparse.Namespace, settings: dict[str, Any], dist: Dist) -> None:
    """Rank 0 creates ``--out`` (a new run) and locks it for the whole run (released at ``dist.close``);
    every rank checks it; rank 0 writes run.json (a new run) or clears what a stopped one left (a resumed
    run: its temporary files, and the manifest, until the run finishes again). A folder that cannot be
    written (read-only, full) is one CacheError, with no file left behind."""
    out = args.out
    lock = checked(dist, lambda: lock_out(out, args.resume) if dist.rank == 0 else None)
    if lock is not None:
        dist.cleanups.append(lock.release)
    checked(dist, lambda: check_out(out, settings, args.resume))
    checked(dist, lambda: begin_out(out, settings, args.resume) if dist.rank == 0 else None)


def lock_out(out: Path, resume: bool) -> FolderLock | None:
    if out.exists() and not out.is_dir():
        return None  # (check_out says so)
    if not out.exists():
        if resume:
            return None  # (check_out says there is no run)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"--out {out}: cannot create it ({e.strerror or type(e).__name__})") from None
    return FolderLock(out)


def begin_out(out: Path, settings: dict[str, Any], resume: bool) -> None:
    try:
        remove_temporary(out)
        if resume:
            (out / MANIFEST).unlink(missing_ok=True)
    except OSError as e:
        raise CacheError(f"--out {out}: cannot write there ({e.strerror or type(e).__name__})") from None
    if not resume:
        write_json(out / RUN, settings, "then run again (the folder holds no run yet)")


def check_out(out: Path, settings: dict[str, Any], resume: bool) -> None:
    """A new run goes to an empty (or new) folder; a resumed one to a run of the same settings.
    (A run's lock file and the temporary files of a killed run do not count.)"""
    run_file = out / RUN
    if resume:
        if not run_file.is_file():
            raise CacheError(f"--resume: {out} holds no run to continue (no {RUN}); leave out --resume to start one")
        try:
            before = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CacheError(f"--resume: {run_file} is unreadable ({e}); start the run again in an empty folder") \
                from None
        if not isinstance(before, dict):
            raise CacheError(f"--resume: {run_file} is not a run's settings; start the run again in an empty folder")
        if before.get("format") != FORMAT:
            raise CacheError(f"--resume: the run in {out} is of format {before.get('format')!r:.40} (an older nnatlas), "
                             f"this one writes {FORMAT}; start it again in an empty folder")
        changed = [k for k in sorted(set(before) | set(settings)) if before.get(k) != settings.get(k)]
        changed = [k for k in changed if k != "run_id"] or changed  # (the id follows from the rest)
        if changed:
            diffs = "; ".join(f"{k}: {before.get(k)!r} then, {settings.get(k)!r} now" for k in changed)
            raise CacheError(f"--resume: the run in {out} had other settings ({diffs}); resume it with the same ones")
        return
    if out.exists() and (not out.is_dir() or any(p.name != LOCK and not TEMPORARY.match(p.name)
                                                 for p in out.iterdir())):
        raise CacheError(f"--out {out} is not an empty folder" +
                         (" (a run is there: pass --resume to continue it)" if run_file.is_file() else ""))


def manifest_of(settings: dict[str, Any], the_plan: Plan, world: int, per_shard: int,
              shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], args: argparse.Namespace,
              handles: list[Any], records: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The manifest: ``records[r]`` is what rank r wrote (shard name -> sha256, bytes)."""
    shards = []
    for r in range(world):
        offset = the_plan.row_offset(r)
        rows = the_plan.rows(r)
        batches = the_plan.ranks[r]
        for k in range(-(-rows // per_shard)):
            lo, hi = k * per_shard, min((k + 1) * per_shard, rows)
            docs = [d.index for b in batches if b.first_row < hi and b.first_row + b.rows > lo for d in b.docs]
            name = shard_name(r, k)
            record = records[r].get(name, {})
            shards.append({"file": name, "rank": r, "rows": [offset + lo, offset + hi],
                           "docs": [min(docs), max(docs) + 1] if docs else [0, 0],
                           "sha256": record.get("sha256"), "bytes": record.get("bytes")})
    lead = ["rows", "seq"] if args.positions == "all" else ["rows"]
    layouts = {}
    for h in handles:
        layout = h._spec.layout
        shape, dtype = shapes[h.label]
        layouts[h.label] = {"name": layout.name, "layout": layout.text, "kind": layout.dtype,
                            "row_dims": [*lead, *layout.dims[2:]], "row_shape": list(shape),
                            "dtype": str(dtype).removeprefix("torch.")}
    meta = {k: {"row_shape": list(s), "dtype": str(d).removeprefix("torch.")}
            for k, (s, d) in shapes.items() if k.startswith("meta.")}
    rows_total = sum(the_plan.rows(r) for r in range(world))
    padded = sum(len(b.docs) * (args.seq_len if args.positions == "all" else max(len(d.ids) for d in b.docs))
                 for r in range(world) for b in the_plan.ranks[r])
    return {**settings, "layouts": layouts, "meta": meta, "tokens": the_plan.tokens, "padded_tokens": padded,
            "docs": len(the_plan.docs), "rows": rows_total, "shards": shards}


def write_manifest(out: Path, manifest: dict[str, Any]) -> str | None:
    """Writes the manifest once every shard it lists is there as its rank recorded it; else (or when
    the write fails) what went wrong, for every rank to raise."""
    missing = [s["file"] for s in manifest["shards"] if s["sha256"] is None or not (out / s["file"]).is_file()]
    if missing:
        return f"shards missing after every rank finished: {', '.join(missing[:4])}"
    try:
        write_json(out / MANIFEST, manifest)
    except CacheError as e:
        return str(e)
    return None
