"""``nnatlas cache``: run a model over a dataset and write the values it computes to safetensors shards.

    nnatlas cache MODEL_OR_PATH --data corpus.jsonl --values layer_output --layers 0-3 --out acts/
    torchrun --nproc_per_node 4 -m nnatlas cache MODEL_OR_PATH --data corpus.jsonl ... --out acts/
    torchrun --nproc_per_node 8 -m nnatlas cache MODEL_OR_PATH ... --tp 4 --out acts/   # 2 copies of 4 ranks each

One process, or one per rank under torchrun (``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` from its
environment): every rank plans the same batches (``cache_data.plan``: by length unless ``--no-sort``),
runs its contiguous share on its own device, writes its own shards (on a thread, :class:`ranks.Background`,
while the next forwards run), and rank 0 writes ``manifest.json`` once every rank is done.
With ``--tp N`` the ranks are ``WORLD_SIZE / N`` data-parallel groups of N consecutive ranks: each group holds one
copy of the model sharded by transformers' tensor parallel over its ranks, and plays the part of one rank above
(the group's first rank writes its shards); the rows are those of one process, up to the float noise of the
ranks' reductions.
Bad input (a file, a field, a setting, a device, a value this load cannot serve) is reported on one
line with exit status 2, before any forward of the data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..cache.data import POSITIONS, CacheError, Plan, parse_layers, plan, read_texts, tokenize
from ..cache.store import (
    FORMAT,
    ShardWriter,
    file_sha256,
    resume_point,
    run_id_of,
)
from ..errors import NnatlasError
from .out import manifest_of, take_out, write_manifest
from .ranks import Background, Dist, Idle, checked, groups_text, peak_rss_mb
from .rows import DTYPES, batch_rows, count_of, load_model, pad_id, row_shapes, to_host, value_handles

# the most --batch-size / --seq-len / --shard-size (MB) may be: more is a typo, not a run
LIMITS = {"batch_size": 1 << 20, "seq_len": 1 << 20, "shard_size": 1e6}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nnatlas cache", description="Run a model over a dataset and write the "
                                "values it computes (standard names) to safetensors shards plus manifest.json.")
    p.add_argument("model", help="a checkpoint folder or hub name (nnatlas.load)")
    p.add_argument("--data", type=Path, required=True, help="a .jsonl, .txt (a document per line) or .parquet file")
    p.add_argument("--text-field", default="text", help="the field (.jsonl) or column (.parquet) holding the text")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="bytes of a .jsonl / .txt file that are not UTF-8: refused with their line and offset "
                        "(strict, default) or read as U+FFFD (replace)")
    p.add_argument("--values", action="append", default=None,
                   help="comma-separated values, read on every chosen block that has them (layer_output, "
                        "self_attn.attention_output), else on the model (logits); repeatable; default layer_output")
    p.add_argument("--layers", default=None, help="blocks: 0-3, 0,2,5-7 or all (default: all)")
    p.add_argument("--out", type=Path, required=True, help="the folder to write")
    p.add_argument("--batch-size", type=int, default=8, help="documents per forward (default 8)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per document at most; longer ones are cut "
                   "(default 128; a long text is tokenized in pieces of about --seq-len tokens)")
    p.add_argument("--no-sort", action="store_true",
                   help="batch the documents in file order (default: longest first, so a batch pads its "
                        "documents to about their own length; the rows are then stored in that order, "
                        "meta.doc and meta.position say where each is from)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens of the dataset")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="store floating values in this dtype (default: as the model computes them)")
    p.add_argument("--model-dtype", choices=[*sorted(DTYPES), "auto"], default="auto",
                   help="load the model in this dtype (default: the checkpoint's)")
    p.add_argument("--attn-implementation", default=None, help="passed to from_pretrained (eager serves the "
                   "attention pattern)")
    p.add_argument("--positions", choices=POSITIONS, default="nonpad",
                   help="rows: one per real token (nonpad, default), one per document at its last token (last), "
                        "or one per document of --seq-len positions, padding included (all)")
    p.add_argument("--shard-size", type=float, default=512.0, help="MB per shard at most (default 512; a "
                   "rank holds up to about three shards of rows in memory while one is written)")
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK when CUDA is there, else cpu")
    p.add_argument("--tp", type=int, default=1, help="under torchrun: shard the model over groups of this many "
                   "ranks (transformers' tensor parallel, tp_plan='auto'); the WORLD_SIZE / TP groups each cache "
                   "their share of the dataset (default 1: every rank holds the whole model)")
    p.add_argument("--resume", action="store_true", help="continue a stopped run in --out (same settings)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    dist = Dist.from_env()
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    if args.no_progress:  # transformers' own bars too (loading weights), for this command only
        hf_logging.disable_progress_bar()
    try:
        return run(args, dist)
    except NnatlasError as e:  # UnknownName, Unavailable, CacheError ...
        text = " ".join(str(e).split())
        print(f"nnatlas cache: error: {text}", file=sys.stderr)
        return 2
    finally:
        dist.close()
        if bars:
            hf_logging.enable_progress_bar()


def _settings_error(args: argparse.Namespace) -> None:
    for name in ("batch_size", "seq_len"):
        flag, value = f"--{name.replace('_', '-')}", getattr(args, name)
        if value < 1:
            raise CacheError(f"{flag} is at least 1")
        if value > LIMITS[name]:
            raise CacheError(f"{flag} {value}: at most {LIMITS[name]}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise CacheError("--max-tokens is at least 1")
    if not (math.isfinite(args.shard_size) and 0 < args.shard_size <= LIMITS["shard_size"]):
        raise CacheError(f"--shard-size {args.shard_size:g}: a number of MB above 0 and at most "
                         f"{LIMITS['shard_size']:g} (a shard is held in memory while it fills)")
    if not _value_names(args):
        raise CacheError(f"--values {','.join(args.values or [])!r} names no value; name one or more, such as "
                         "layer_output,mlp.mlp_output")


def _tp_error(args: argparse.Namespace, dist: Dist) -> None:
    """--tp against torchrun's ranks (every rank reads the same environment: every rank says it, none waits)."""
    tp = args.tp
    if tp < 1:
        raise CacheError(f"--tp {tp}: the ranks per copy of the model are at least 1")
    if tp > 1 and dist.world == 1:
        raise CacheError(f"--tp {tp} shards the model over torchrun's ranks, and this is one process: run it as "
                         f"torchrun --nproc_per_node {tp} -m nnatlas cache ... --tp {tp}")
    if dist.world % tp:
        raise CacheError(f"--tp {tp} does not divide the {dist.world} ranks torchrun started (WORLD_SIZE): each "
                         f"copy of the model takes {tp} ranks; start a multiple of {tp}")
    if tp > 1:  # a config without a TP plan, or a family transformers cannot shard, before any process group
        from ..loading.load import _check_shardable

        try:
            _check_shardable(args.model)
        except (OSError, ValueError) as e:
            raise CacheError(f"cannot load {args.model}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                from None
    if tp > 1 and args.device is not None:
        device = _device(args.device, dist)
        here = _device(None, dist)
        if device != here:
            raise CacheError(f"--device {device} with --tp {tp}: transformers' tensor parallel puts each rank's "
                             f"shard on {here} (cuda:LOCAL_RANK, else the CPU); leave out --device")


def _value_names(args: argparse.Namespace) -> list[str]:
    return [n.strip() for v in (args.values or ["layer_output"]) for n in v.split(",") if n.strip()]


def _device(text: str | None, dist: Dist) -> torch.device:
    """``--device``, checked: one this torch has on this machine (default: cuda:LOCAL_RANK, else cpu)."""
    if text is None:
        return torch.device(f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CacheError(f"--device {text!r} is not a device: {why}") from None
    if device.type == "meta":
        raise CacheError("--device meta computes shapes, not values: there is nothing to cache; pass cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CacheError(f"--device {device}: this torch has no CUDA device")
        n = torch.cuda.device_count()
        if device.index is not None and device.index >= n:
            raise CacheError(f"--device {device}: this machine has {n} CUDA device{'s' if n > 1 else ''} "
                             f"(cuda:0 to cuda:{n - 1})")
    elif device.type != "cpu":
        try:
            torch.empty(1, device=device)
        except Exception as e:  # each backend raises its own
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CacheError(f"--device {text}: this torch cannot use it ({why})") from None
    return device


def run(args: argparse.Namespace, dist: Dist) -> int:
    _settings_error(args)
    _tp_error(args, dist)
    device = _device(args.device, dist)
    dist.tp = args.tp
    dist.start(device)
    names = _value_names(args)
    layers = parse_layers(args.layers)
    texts = checked(dist, lambda: read_texts(args.data, args.text_field, args.errors))
    model = checked(dist, lambda: load_model(args, device, dist))
    handles = checked(dist, lambda: value_handles(model, names, layers))
    ids = tokenize(model.tokenizer, texts, args.seq_len)
    del texts
    width = args.seq_len if args.positions == "all" else None
    the_plan = checked(dist, lambda: plan(ids, args.batch_size, args.positions, dist.dp_world, args.max_tokens,
                                          _order(args), width))
    store_dtype = DTYPES[args.dtype] if args.dtype else None
    shapes = row_shapes(model, handles, the_plan, args.positions, args.seq_len, store_dtype)
    row_bytes = sum(count_of(s) * torch.empty(0, dtype=d).element_size() for s, d in shapes.values())
    # a shard's safetensors header (a JSON entry per key, padded) counts against --shard-size too
    header = 1024 + 256 * len(shapes)
    per_shard = (int(args.shard_size * 1e6) - header) // row_bytes
    if per_shard < 1:
        raise CacheError(f"--shard-size {args.shard_size:g} holds not one row (a row of these values is {row_bytes} "
                         f"bytes, a shard's header about {header}): at least {(header + row_bytes) / 1e6:.6f} MB")
    settings = _settings(args, model, handles, the_plan, dist.dp_world, per_shard)
    take_out(args, settings, dist)
    dist.barrier()

    start, cpu = time.perf_counter(), time.thread_time()
    rank = dist.dp_rank  # (under --tp, every rank of a group runs the group's batches; its first rank writes)
    total_rows = the_plan.rows(rank)
    expected = -(-total_rows // per_shard)
    done, kept = resume_point(args.out, rank, expected, settings["run_id"]) if dist.writes else (0, {})
    if dist.tp > 1:  # the group's other ranks resume where its writer does
        done = dist.gather(done)[rank * dist.tp]
    first_row = done * per_shard
    batches = [b for b in the_plan.ranks[rank] if b.first_row + b.rows > first_row]
    writer = ShardWriter(args.out, rank, per_shard, done, first_row - batches[0].first_row if batches else 0,
                         run_id=settings["run_id"], sha256=kept) if dist.writes else None
    counted = [] if not dist.writes else batches  # (a group's tokens are counted once, by its writer)
    tokens = sum(len(d.ids) for b in counted for d in b.docs)
    positions = sum(len(b.docs) * (width or max(len(d.ids) for d in b.docs)) for b in counted)
    bar = _progress(args, dist, tokens)
    pad = pad_id(model)
    try:
        # the writes (and a GPU's copies to the host) overlap the next forwards; at most a shard of rows waits
        with Background(writer, per_shard * row_bytes) if writer is not None else Idle() as background:
            for batch in batches:
                rows = batch_rows(model, handles, batch.docs, args.positions, args.seq_len, store_dtype, pad)
                if writer is not None:
                    background.add(*to_host(rows))
                if bar is not None:
                    bar.update(sum(len(d.ids) for d in batch.docs))
    finally:
        if bar is not None:
            bar.close()
    cpu = time.thread_time() - cpu  # (before the barrier, where a rank that is done early may wait)
    dist.barrier()
    gathered = dist.gather((tokens, peak_rss_mb(), positions, cpu, background.cpu))
    ran, peak = sum(g[0] for g in gathered), max(g[1] for g in gathered)
    padding = 1 - ran / max(sum(g[2] for g in gathered), 1)
    cpu, writer_cpu = sum(g[3] for g in gathered), sum(g[4] for g in gathered)
    records = dist.gather(writer.sha256 if writer is not None else {})[::dist.tp]  # (the writers' records)
    error = None
    if dist.rank == 0:
        manifest = manifest_of(settings, the_plan, dist.dp_world, per_shard, shapes, args, handles, records)
        error = write_manifest(args.out, manifest)
    # every rank waits for the manifest (a failure stops them all): ranks that left the group while
    # another still wrote made gloo abort the early one at exit ("terminate called without an active exception")
    dist.agree(error)
    if dist.rank == 0:
        took = time.perf_counter() - start
        print(f"nnatlas cache: {the_plan.tokens} tokens of {len(the_plan.docs)} documents -> {manifest['rows']} rows "
              f"x {len(handles)} values in {len(manifest['shards'])} shards ({args.out}); {ran} tokens in "
              f"{took:.2f} s on {dist.world} process{'es' if dist.world > 1 else ''}{groups_text(dist)}: "
              f"{ran / max(took, 1e-9):.0f} "
              f"tokens/s; peak memory {peak:.0f} MB per process; padding {100 * padding:.1f}% of the positions "
              f"the forwards ran (batched in {the_plan.order} order); CPU {cpu:.2f} s in the forward loop, "
              f"{writer_cpu:.2f} s writing", file=sys.stderr)
    return 0


def _order(args: argparse.Namespace) -> str:
    """Batches by length (the default) pad less; ``--positions all`` pads every batch to --seq-len anyway."""
    return "file" if args.no_sort or args.positions == "all" else "length"


def _settings(args: argparse.Namespace, model: Any, handles: list[Any], the_plan: Plan, world: int,
              per_shard: int) -> dict[str, Any]:
    """What makes the rows what they are: a resumed run must have the same (checked against run.json).

    Paths are resolved (a resumed run may spell them another way); the config is hashed without
    ``_name_or_path`` (where it was loaded from, not what it is). ``run_id`` is the hash of the rest."""
    config = model.config
    if hasattr(config, "to_dict"):
        described = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}
        config_json = json.dumps(described, sort_keys=True, default=str)
    else:
        config_json = repr(config)
    settings = {
        "format": FORMAT, "model": _resolved(args.model), "family": model.family,
        "revision": getattr(config, "_commit_hash", None),
        "config_sha256": hashlib.sha256(config_json.encode()).hexdigest(),
        "data": {"file": str(args.data.resolve()), "sha256": file_sha256(args.data), "text_field": args.text_field},
        "values": [h.label for h in handles], "positions": args.positions, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "max_tokens": args.max_tokens, "dtype": args.dtype,
        "model_dtype": str(next(model.native.parameters()).dtype).removeprefix("torch."),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "world_size": world, "rows_per_shard": per_shard, "order": the_plan.order,
    }
    if args.tp > 1:  # (only then: the settings, and so the run id, of a run without --tp are as they were)
        settings["tp_size"] = args.tp
    return {"format": FORMAT, "run_id": run_id_of(settings), **settings}


def _resolved(model: str) -> str:
    """A local checkpoint folder as its resolved path; a hub name as it is."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else str(model)


def _progress(args: argparse.Namespace, dist: Dist, tokens: int) -> Any:
    if args.no_progress or dist.rank != 0:
        return None
    from tqdm.auto import tqdm

    desc = "nnatlas cache" + (f" (rank 0 of {dist.world})" if dist.world > 1 else "")
    return tqdm(total=tokens, unit="tok", unit_scale=True, desc=desc, disable=None, file=sys.stderr)
