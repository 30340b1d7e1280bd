"""``nnatlas cache`` throughput: tokens/s over a generated corpus, against a plain forward loop over the same batches.

A small llama (hidden 256, 4 blocks, random weights) with the tiny word-level tokenizer is saved to a
temporary folder, with ``docs`` documents of 20-60 words; each run is the real command in its own
process(es) (``python -m nnatlas cache`` / ``torchrun --standalone --nproc_per_node N -m nnatlas cache``),
every block's ``layer_output`` at every real token, 1 thread per process. The figures are the command's
own summary line: tokens/s of its forward loop (model load and tokenization excluded; the shard writes
included, up to the last one) and the peak resident memory of its largest process. The plain loop
(``python -m bench.cache plain``, under torchrun for N processes) runs the same batches (the command's
plan, each rank its share) through ``model(**inputs, output_hidden_states=True)`` under no_grad, right-padded
to each batch's longest document, timed the same way (from a barrier after loading to a barrier at the
end). Command and plain loop alternate, ``rounds`` times each; the ratio is the median of each round's.
On a busy machine the wall-clock ratio is mostly noise: the CPU seconds of the forward loop's own thread
(the plain loop's over the command's) say whether the loop does more work than a plain one, and the
writer thread's CPU is what a free core overlaps with the forwards.
Also: what ``model.cache`` allocates beyond a plain forward.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from nnatlas.testing import WORDS, Allocations, build, draw_inputs, first_params

SUMMARY = re.compile(r"(\d+) tokens in ([\d.]+) s on (\d+) process(?:es)?: (\d+) tokens/s; peak memory (\d+) MB"
                     r"(?: per process; padding ([\d.]+)%.*)?; CPU ([\d.]+) s in the forward loop(?:, ([\d.]+) s writing)?")
SEQ_LEN = 64
BATCH = 8
# MB per shard: the corpus' 247 MB of rows in 8 shards, written while the forwards run (a whole run in the
# default 512 MB shard is written once, after the last forward, with nothing left to overlap it)
SHARD_MB = 32
ROOT = Path(__file__).resolve().parents[1]


def _model(folder: Path) -> None:
    params = {**first_params("llama"), "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 128}
    model = build("llama", params, attn_implementation="sdpa")
    model.native.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)


def _corpus(path: Path, docs: int) -> None:
    rng = random.Random(0)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))})
                            + "\n" for _ in range(docs)))


def _launcher(procs: int) -> list[str]:
    if procs == 1:
        return [sys.executable, "-m"]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        raise RuntimeError("torchrun is not installed beside this python")
    return [torchrun, "--standalone", "--nproc_per_node", str(procs), "-m"]


def _run(cmd: list[str], what: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    m = SUMMARY.search(done.stderr)
    if done.returncode != 0 or m is None:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "tokens_per_s": int(m.group(4)),
            "peak_mb": int(m.group(5)), "padding": float(m.group(6) or "nan"), "cpu": float(m.group(7)),
            "writer_cpu": float(m.group(8) or 0)}


def run_command(folder: Path, data: Path, out: Path, procs: int, *extra: str) -> dict[str, float]:
    argv = ["cache", str(folder), "--data", str(data), "--out", str(out), "--values", "layer_output",
            "--seq-len", str(SEQ_LEN), "--batch-size", str(BATCH), "--shard-size", str(SHARD_MB), "--no-progress",
            *extra]
    return _run([*_launcher(procs), "nnatlas", *argv], "nnatlas cache")


def run_plain(folder: Path, data: Path, procs: int, *extra: str) -> dict[str, float]:
    return _run([*_launcher(procs), "bench.cache", "plain", str(folder), str(data), *extra], "the plain loop")


def cache_rows(docs: int, procs: list[int], rounds: int = 3) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nnatlas-bench-cache-") as tmp:
        root = Path(tmp)
        _model(root / "model")
        _corpus(root / "corpus.jsonl", docs)
        for n in procs:
            ours, plain = [], []
            for k in range(rounds):  # alternated, each round's first one swapped: a run pays for the one before
                out = root / f"out{n}"
                for which in ("ours", "plain") if k % 2 == 0 else ("plain", "ours"):
                    if which == "ours":
                        ours.append(run_command(root / "model", root / "corpus.jsonl", out, n))
                    else:
                        plain.append(run_plain(root / "model", root / "corpus.jsonl", n))
                size = sum(p.stat().st_size for p in out.glob("shard-*")) / 1e6
                shutil.rmtree(out)
            ratio = statistics.median(o["tokens_per_s"] / p["tokens_per_s"] for o, p in zip(ours, plain))
            t_ours = [o["tokens_per_s"] for o in ours]
            t_plain = [p["tokens_per_s"] for p in plain]
            # CPU seconds: what a busy machine's wall-clock ratio swamps (the loop's own thread against the
            # plain loop's; the writer thread's, which a free core overlaps with the forwards)
            cpu = statistics.median(p["cpu"] / o["cpu"] for o, p in zip(ours, plain))
            writing = statistics.median(o["writer_cpu"] / o["cpu"] for o in ours)
            rows.append(f"  {n} process{'es' if n > 1 else '  '}: nnatlas cache {statistics.median(t_ours):.0f} "
                        f"tokens/s ({min(t_ours)}-{max(t_ours)}), plain loop {statistics.median(t_plain):.0f} "
                        f"({min(t_plain)}-{max(t_plain)}): ratio {ratio:.3f} (median of {rounds} rounds: "
                        f"{', '.join(f'{o / p:.3f}' for o, p in zip(t_ours, t_plain))}); CPU of the forward loop: "
                        f"plain/ours {cpu:.3f}, and the writer thread {100 * writing:.0f}% more; {ours[0]['tokens']} "
                        f"tokens, padding {ours[0]['padding']:.1f}%; peak memory {max(o['peak_mb'] for o in ours):.0f} "
                        f"MB per process; {size:.1f} MB of shards")
    return rows


def plain_main(argv: list[str] | None = None) -> None:
    """A plain forward loop over the command's batches (this rank's share under torchrun), timed like it."""
    import nnatlas
    from nnatlas.cache.data import plan, read_texts, tokenize

    parser = argparse.ArgumentParser(prog="python -m bench.cache plain")
    parser.add_argument("model")
    parser.add_argument("data", type=Path)
    parser.add_argument("--no-sort", action="store_true")
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as td

        td.init_process_group("gloo")
    model = nnatlas.load(args.model)
    native, tok = model.native, model.tokenizer
    ids = tokenize(tok, read_texts(args.data, "text"), SEQ_LEN)
    the_plan = plan(ids, BATCH, "nonpad", world, None, "file" if args.no_sort else "length")
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    mine = the_plan.ranks[rank]
    tokens = sum(len(d.ids) for b in mine for d in b.docs)
    if world > 1:
        td.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    with torch.no_grad():
        for b in mine:
            width = max(len(d.ids) for d in b.docs)
            inputs = torch.full((len(b.docs), width), pad, dtype=torch.long)
            mask = torch.zeros((len(b.docs), width), dtype=torch.long)
            for i, d in enumerate(b.docs):
                inputs[i, :len(d.ids)] = torch.tensor(d.ids)
                mask[i, :len(d.ids)] = 1
            native(input_ids=inputs, attention_mask=mask, output_hidden_states=True)
    cpu = time.thread_time() - cpu
    if world > 1:
        td.barrier()
        counts: list[tuple[int, float]] = [(0, 0.0)] * world
        td.all_gather_object(counts, (tokens, cpu))
        tokens, cpu = sum(t for t, _ in counts), sum(c for _, c in counts)
    took = time.perf_counter() - start
    if rank == 0:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"plain loop: {tokens} tokens in {took:.2f} s on {world} process{'es' if world > 1 else ''}: "
              f"{tokens / took:.0f} tokens/s; peak memory {peak:.0f} MB; CPU {cpu:.2f} s in the forward loop",
              file=sys.stderr)
    if world > 1:
        td.destroy_process_group()


def model_cache_memory() -> str:
    """Bytes ``model.cache`` allocates beyond the plain forward (0: the cached tensors are the model's own)."""
    model = build("llama", attn_implementation="sdpa")
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 2, 16, [0, 4])
    with torch.no_grad(), Allocations() as plain:
        model.native(**inputs)
    with Allocations() as ours:
        cache = model.cache(inputs, values=["layer_output", "self_attn.attention_output", "mlp.mlp_output"])
    held = sum(v.numel() * v.element_size() for v in cache.values())
    return (f"  model.cache (tiny llama, {len(cache)} values, {held} bytes of values): allocated "
            f"{ours.bytes - plain.bytes:+d} bytes vs the plain forward")


if __name__ == "__main__":
    if sys.argv[1:2] != ["plain"]:
        sys.exit("usage: python -m bench.cache plain MODEL DATA [--no-sort]")
    plain_main(sys.argv[2:])
