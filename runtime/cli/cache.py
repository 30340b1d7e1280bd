"""``nnatlas cache``: run a model over a dataset and write the values it computes to safetensors shards.

    nnatlas cache MODEL_OR_PATH --data corpus.jsonl --values layer_output --layers 0-3 --out acts/
    torchrun --nproc_per_node 4 -m nnatlas cache MODEL_OR_PATH --data corpus.jsonl ... --out acts/
    torchrun --nproc_per_node 8 -m nnatlas cache MODEL_OR_PATH ... --tp 4 --out acts/   # 2 copies of 4 ranks each

One process, or one per rank under torchrun (``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` from its
environment): every rank plans the same batches (``cache_data.plan``: by length unless ``--no-sort``),
runs its contiguous share on its own device, writes its own shards (on a thread, :class:`Background`,
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
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import safe_files
from ..cache.data import POSITIONS, CacheError, Plan, parse_layers, plan, read_texts, tokenize
from ..cache.store import (
    FORMAT,
    LOCK,
    MANIFEST,
    RUN,
    TEMPORARY,
    FolderLock,
    ShardWriter,
    file_sha256,
    remove_temporary,
    resume_point,
    run_id_of,
    shard_name,
    write_json,
)
from ..errors import NnatlasError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# the most --batch-size / --seq-len / --shard-size (MB) may be: more is a typo, not a run
LIMITS = {"batch_size": 1 << 20, "seq_len": 1 << 20, "shard_size": 1e6}
META_KEYS = {"all": ("meta.doc", "meta.length", "meta.tokens"), "last": ("meta.doc", "meta.position", "meta.token"),
             "nonpad": ("meta.doc", "meta.position", "meta.token")}


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


class Dist:
    """This process's rank among ``world`` (torchrun's environment), and the group they talk over."""

    def __init__(self, rank: int, world: int, local_rank: int):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.group = False
        self.owned = False  # whether start() made the process group (close() then ends it)
        self.tp = 1  # ranks per copy of the model (--tp): ranks g*tp .. g*tp + tp - 1 are data-parallel rank g
        self.cleanups: list[Callable[[], None]] = []  # run at close (the lock on --out)

    @property
    def dp_rank(self) -> int:
        """The data-parallel rank: which share of the batches this rank's group runs (and whose shards it writes)."""
        return self.rank // self.tp

    @property
    def dp_world(self) -> int:
        return self.world // self.tp

    @property
    def writes(self) -> bool:
        """Whether this rank writes its group's shards (the group's first rank; every rank without --tp)."""
        return self.rank % self.tp == 0

    @classmethod
    def from_env(cls) -> Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))

    def start(self, device: torch.device) -> None:
        if self.world > 1 and not self.group:
            import torch.distributed as td

            if device.type == "cuda":  # (NCCL's object collectives run on the current device: the rank's own)
                torch.cuda.set_device(device)
            if not td.is_initialized():  # (a caller that made the group, as the TP oracle's launch, keeps it)
                td.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
                self.owned = True
            self.group = True

    def agree(self, error: str | None) -> None:
        """Every rank raises when any did (the first failing rank's words), so none waits for another."""
        if self.group:
            import torch.distributed as td

            errors: list[str | None] = [None] * self.world
            td.all_gather_object(errors, error)
            error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise CacheError(error)

    def barrier(self) -> None:
        self.agree(None)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (on every rank)."""
        if not self.group:
            return [value]
        import torch.distributed as td

        values: list[Any] = [None] * self.world
        td.all_gather_object(values, value)
        return values

    def close(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()
        if self.group:
            import torch.distributed as td

            if self.owned:
                td.destroy_process_group()
            self.group = self.owned = False


def checked(dist: Dist, step: Callable[[], Any]) -> Any:
    """Run ``step`` on every rank; a bad input on any rank stops them all, with its message."""
    try:
        result = step()
    except NnatlasError as e:
        dist.agree(str(e))
        raise
    dist.agree(None)
    return result


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
    model = checked(dist, lambda: _load(args, device, dist))
    handles = checked(dist, lambda: _handles(model, names, layers))
    ids = tokenize(model.tokenizer, texts, args.seq_len)
    del texts
    width = args.seq_len if args.positions == "all" else None
    the_plan = checked(dist, lambda: plan(ids, args.batch_size, args.positions, dist.dp_world, args.max_tokens,
                                          _order(args), width))
    store_dtype = DTYPES[args.dtype] if args.dtype else None
    shapes = _row_shapes(model, handles, the_plan, args.positions, args.seq_len, store_dtype)
    row_bytes = sum(_numel(s) * torch.empty(0, dtype=d).element_size() for s, d in shapes.values())
    # a shard's safetensors header (a JSON entry per key, padded) counts against --shard-size too
    header = 1024 + 256 * len(shapes)
    per_shard = (int(args.shard_size * 1e6) - header) // row_bytes
    if per_shard < 1:
        raise CacheError(f"--shard-size {args.shard_size:g} holds not one row (a row of these values is {row_bytes} "
                         f"bytes, a shard's header about {header}): at least {(header + row_bytes) / 1e6:.6f} MB")
    settings = _settings(args, model, handles, the_plan, dist.dp_world, per_shard)
    _take_out(args, settings, dist)
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
    pad = _pad_id(model)
    try:
        # the writes (and a GPU's copies to the host) overlap the next forwards; at most a shard of rows waits
        with Background(writer, per_shard * row_bytes) if writer is not None else _Idle() as background:
            for batch in batches:
                rows = _batch_rows(model, handles, batch.docs, args.positions, args.seq_len, store_dtype, pad)
                if writer is not None:
                    background.add(*_to_host(rows))
                if bar is not None:
                    bar.update(sum(len(d.ids) for d in batch.docs))
    finally:
        if bar is not None:
            bar.close()
    cpu = time.thread_time() - cpu  # (before the barrier, where a rank that is done early may wait)
    dist.barrier()
    gathered = dist.gather((tokens, _peak_rss_mb(), positions, cpu, background.cpu))
    ran, peak = sum(g[0] for g in gathered), max(g[1] for g in gathered)
    padding = 1 - ran / max(sum(g[2] for g in gathered), 1)
    cpu, writer_cpu = sum(g[3] for g in gathered), sum(g[4] for g in gathered)
    records = dist.gather(writer.sha256 if writer is not None else {})[::dist.tp]  # (the writers' records)
    error = None
    if dist.rank == 0:
        manifest = _manifest(settings, the_plan, dist.dp_world, per_shard, shapes, args, handles, records)
        error = _write_manifest(args.out, manifest)
    # every rank waits for the manifest (a failure stops them all): ranks that left the group while
    # another still wrote made gloo abort the early one at exit ("terminate called without an active exception")
    dist.agree(error)
    if dist.rank == 0:
        took = time.perf_counter() - start
        print(f"nnatlas cache: {the_plan.tokens} tokens of {len(the_plan.docs)} documents -> {manifest['rows']} rows "
              f"x {len(handles)} values in {len(manifest['shards'])} shards ({args.out}); {ran} tokens in "
              f"{took:.2f} s on {dist.world} process{'es' if dist.world > 1 else ''}{_groups(dist)}: "
              f"{ran / max(took, 1e-9):.0f} "
              f"tokens/s; peak memory {peak:.0f} MB per process; padding {100 * padding:.1f}% of the positions "
              f"the forwards ran (batched in {the_plan.order} order); CPU {cpu:.2f} s in the forward loop, "
              f"{writer_cpu:.2f} s writing", file=sys.stderr)
    return 0


def _groups(dist: Dist) -> str:
    return f" ({dist.dp_world} group{'s' if dist.dp_world > 1 else ''} of {dist.tp} tensor-parallel ranks)" \
        if dist.tp > 1 else ""


class _Idle:
    """What a rank that writes nothing (a tensor-parallel group's other ranks) has for a :class:`Background`."""

    cpu = 0.0

    def add(self, rows: dict[str, torch.Tensor], ready: Any = None) -> None:
        return None

    def __enter__(self) -> _Idle:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _order(args: argparse.Namespace) -> str:
    """Batches by length (the default) pad less; ``--positions all`` pads every batch to --seq-len anyway."""
    return "file" if args.no_sort or args.positions == "all" else "length"


class Background:
    """``ShardWriter.add`` / ``close`` on one thread, fed through a queue of at most ``limit`` bytes of rows
    (one batch always fits): the shard writes, and the copies from a GPU, overlap the next forwards.

    Used as a context: leaving it normally waits for the last shard; an error on the thread is raised in
    the caller (at its next :meth:`add` or at the end, the thread's own exception); leaving it by an
    error (a KeyboardInterrupt included) stops the thread once the shard it is writing, if any, is whole.
    No thread outlives the block.
    """

    def __init__(self, writer: ShardWriter, limit: int):
        self.writer, self.limit = writer, limit
        self.items: queue.SimpleQueue[tuple[dict[str, torch.Tensor], Any, int] | None] = queue.SimpleQueue()
        self.held = 0  # bytes of rows queued, not yet given to the writer
        self.room = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = False
        self.cpu = 0.0  # seconds of CPU the thread took
        self.thread = threading.Thread(target=self._work, name="nnatlas-cache-writer", daemon=True)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def add(self, rows: dict[str, torch.Tensor], ready: Any = None) -> None:
        """Queue one batch's rows (``ready``: an event to wait for before they are read, or None)."""
        size = sum(v.numel() * v.element_size() for v in rows.values())
        with self.room:
            while self.held and self.held + size > self.limit and self.error is None:
                self.room.wait(0.5)
            self.held += size
        self._raise()
        self.items.put((rows, ready, size))

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _work(self) -> None:
        start = time.thread_time()
        try:
            self._loop()
        except BaseException as e:  # raised again in the caller's thread
            self.error = e
            with self.room:
                self.room.notify()
        finally:
            self.cpu = time.thread_time() - start

    def _loop(self) -> None:
        while True:
            item = self.items.get()
            if self.stopping:
                return
            if item is None:
                self.writer.close()
                return
            rows, ready, size = item
            if ready is not None:
                ready.synchronize()
            self.writer.add(rows)
            del rows, item
            with self.room:
                self.held -= size
                self.room.notify()

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is not None:
            self.stopping = True
        self.items.put(None)
        try:
            self.thread.join()
        except BaseException:  # interrupted while the last shards are written: stop after the current one
            self.stopping = True
            self.thread.join()
            raise
        if kind is None:
            self._raise()


def _peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports kB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def _load(args: argparse.Namespace, device: torch.device, dist: Dist | None = None) -> Any:
    from ..loading.load import load

    kwargs: dict[str, Any] = {"dtype": DTYPES.get(args.model_dtype, "auto")}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    tp = dist.tp if dist is not None else 1
    if tp > 1:  # (a family that cannot be sharded is refused by load, before the weights)
        from ..parallel.tensor_parallel import groups_config

        kwargs["distributed_config"] = groups_config(tp, dist.world)  # type: ignore[union-attr]
    try:
        model = load(args.model, **kwargs)
    except (OSError, ValueError) as e:
        raise CacheError(f"cannot load {args.model}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if model.tokenizer is None:
        raise CacheError(f"{args.model} has no tokenizer that AutoTokenizer can load; nnatlas cache tokenizes text")
    if tp > 1:  # transformers put each rank's shard on its device; the group is the rank's own tp consecutive ranks
        import torch.distributed as td

        group = model._tp.group if model._tp is not None else None
        first = dist.dp_rank * tp  # type: ignore[union-attr]
        if group is None or td.get_process_group_ranks(group) != list(range(first, first + tp)):
            raise CacheError(f"--tp {tp}: transformers did not shard the model over ranks {first} to {first + tp - 1}")
    else:
        model.native.to(device)
    return model


def _handles(model: Any, names: list[str], layers: list[int] | None) -> list[Any]:
    from ..cache.model_cache import select

    handles = select(model, names, layers)
    for h in handles:
        assert h._spec is not None  # (select gives standard values only)
        layout = h._spec.layout
        if tuple(layout.dims[:2]) != ("batch", "seq") or layout.dtype == "object":
            raise CacheError(f"{h.label} has layout {layout.text}; nnatlas cache stores values per token "
                             "(layouts that start with [batch seq]); read it with model.cache() instead")
    return handles


def _inputs(docs: Sequence[Any], pad: int, length: int | None) -> dict[str, torch.Tensor]:
    """Right-padded: a document's tokens keep the positions they have alone (padding comes after them)."""
    width = length or max(len(d.ids) for d in docs)
    ids = torch.tensor([(*d.ids, *(pad,) * (width - len(d.ids))) for d in docs], dtype=torch.long)
    mask = torch.tensor([(1,) * len(d.ids) + (0,) * (width - len(d.ids)) for d in docs], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask}


def _pad_id(model: Any) -> int:
    tok = model.tokenizer
    for pad in (tok.pad_token_id, tok.eos_token_id, 0):
        if pad is not None:
            return int(pad)
    return 0


def _batch_rows(model: Any, handles: list[Any], docs: Sequence[Any], positions: str, seq_len: int,
                dtype: torch.dtype | None, pad: int | None = None) -> dict[str, torch.Tensor]:
    """The rows of one batch: each value at the chosen positions (on the model's device), and what says
    where each row is from (``meta.*``, on the CPU)."""
    inputs = _inputs(docs, _pad_id(model) if pad is None else pad, seq_len if positions == "all" else None)
    with model.trace(inputs, order="any"):
        saved = [h.save() for h in handles]
    mask = inputs["attention_mask"].bool()
    lengths = mask.sum(1)
    doc = torch.tensor([d.index for d in docs], dtype=torch.long)
    out: dict[str, torch.Tensor] = {}
    if positions == "nonpad":
        where = mask.nonzero()
        pick: Callable[[torch.Tensor], torch.Tensor] = lambda v: v[mask.to(v.device)]
        out = {"meta.doc": doc[where[:, 0]], "meta.position": where[:, 1].to(torch.int32),
               "meta.token": inputs["input_ids"][mask]}
    elif positions == "last":
        rows = torch.arange(len(docs))
        pick = lambda v: v[rows.to(v.device), (lengths - 1).to(v.device)]
        out = {"meta.doc": doc, "meta.position": (lengths - 1).to(torch.int32),
               "meta.token": inputs["input_ids"][rows, lengths - 1]}
    else:
        pick = lambda v: v
        out = {"meta.doc": doc, "meta.length": lengths.to(torch.int32), "meta.tokens": inputs["input_ids"]}
    values = {}
    for h, v in zip(handles, saved):
        rows_v = pick(v)
        if dtype is not None and rows_v.is_floating_point():
            rows_v = rows_v.to(dtype)
        values[h.label] = rows_v.detach()
    return {**values, **out}


def _to_host(rows: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
    """``rows`` on the CPU, and an event to wait for before they are read: from a CUDA device the copies
    are queued (into pinned memory) behind the forward, not waited for here."""
    devices = {v.device for v in rows.values() if v.device.type != "cpu"}
    if not devices:
        return rows, None
    if len(devices) == 1 and next(iter(devices)).type == "cuda":
        host = {k: v.to("cpu", non_blocking=True) for k, v in rows.items()}
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(next(iter(devices))))
        return host, ready
    return {k: v.cpu() for k, v in rows.items()}, None


def _row_shapes(model: Any, handles: list[Any], the_plan: Plan, positions: str, seq_len: int,
                dtype: torch.dtype | None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each stored key's shape per row and dtype, from a forward of one token (the sizes a shard is cut by)."""
    first = the_plan.docs[0]
    probe = type(first)(first.index, first.ids[:1])
    rows = _batch_rows(model, handles, [probe], "last", seq_len, dtype)
    shapes = {k: (tuple(v.shape[1:]), v.dtype) for k, v in rows.items() if not k.startswith("meta.")}
    if positions == "all":
        shapes = {k: ((seq_len, *s), d) for k, (s, d) in shapes.items()}
        shapes.update({"meta.doc": ((), torch.long), "meta.length": ((), torch.int32),
                       "meta.tokens": ((seq_len,), torch.long)})
    else:
        shapes.update({"meta.doc": ((), torch.long), "meta.position": ((), torch.int32), "meta.token": ((), torch.long)})
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


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


def _take_out(args: argparse.Namespace, settings: dict[str, Any], dist: Dist) -> None:
    """Rank 0 creates ``--out`` (a new run) and locks it for the whole run (released at ``dist.close``);
    every rank checks it; rank 0 writes run.json (a new run) or clears what a stopped one left (a resumed
    run: its temporary files, and the manifest, until the run finishes again). A folder that cannot be
    written (read-only, full) is one CacheError, with no file left behind."""
    out = args.out
    lock = checked(dist, lambda: _lock_out(out, args.resume) if dist.rank == 0 else None)
    if lock is not None:
        dist.cleanups.append(lock.release)
    checked(dist, lambda: _check_out(out, settings, args.resume))
    checked(dist, lambda: _begin(out, settings, args.resume) if dist.rank == 0 else None)


def _lock_out(out: Path, resume: bool) -> FolderLock | None:
    if out.exists() and not out.is_dir():
        return None  # (_check_out says so)
    if not out.exists():
        if resume:
            return None  # (_check_out says there is no run)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"--out {out}: cannot create it ({e.strerror or type(e).__name__})") from None
    elif resume:  # (its journals and shards are read back)
        safe_files.warn_if_others_write(out, "others can change the rows a resumed run keeps")
    return FolderLock(out)


def _begin(out: Path, settings: dict[str, Any], resume: bool) -> None:
    try:
        remove_temporary(out)
        if resume:
            (out / MANIFEST).unlink(missing_ok=True)
    except OSError as e:
        raise CacheError(f"--out {out}: cannot write there ({e.strerror or type(e).__name__})") from None
    if not resume:
        write_json(out / RUN, settings, "then run again (the folder holds no run yet)")


def _check_out(out: Path, settings: dict[str, Any], resume: bool) -> None:
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


def _manifest(settings: dict[str, Any], the_plan: Plan, world: int, per_shard: int,
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


def _write_manifest(out: Path, manifest: dict[str, Any]) -> str | None:
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


def _progress(args: argparse.Namespace, dist: Dist, tokens: int) -> Any:
    if args.no_progress or dist.rank != 0:
        return None
    from tqdm.auto import tqdm

    desc = "nnatlas cache" + (f" (rank 0 of {dist.world})" if dist.world > 1 else "")
    return tqdm(total=tokens, unit="tok", unit_scale=True, desc=desc, disable=None, file=sys.stderr)
