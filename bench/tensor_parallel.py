"""Tensor parallel: traced/plain under TP=2 (torchrun, gloo on CPU) beside one process, and the gather's cost per value.

A small llama (hidden 256, 4 blocks, 4 heads, random weights) is saved to a temporary folder, then loaded in
one process and, under ``torchrun --standalone --nproc_per_node 2``, with ``tp_plan="auto"``. Each process
times, in paired rounds (shuffled order each round, 1 thread), a plain forward, a trace saving every block's
layer_output, and a trace saving every standard value; the ratios are the median of each round's ratio to
the plain forward of the same round. Under TP the trace saving every value is also timed with
``save(local=True)`` (the rank's shards, no communication), and one gather is timed alone (the all-gather of a
rank's queries and of its MLP neurons, as a trace makes it): the gather's cost per value.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SEQ = 32


def _model(folder: Path) -> None:
    from nnatlas.testing import build, first_params

    params = {**first_params("llama"), "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 128}
    model = build("llama", params, attn_implementation="sdpa")
    model.native.save_pretrained(folder)


def _rounds(fns: dict[str, Any], runs: int) -> dict[str, float]:
    """Median per-round ratio of each function to ``plain`` (and plain's median ms)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for _ in range(3):
        for f in fns.values():
            f()
    rng = random.Random(0)
    for _ in range(runs):
        rng.shuffle(names)  # (the same order on every rank: a collective waits for the other rank)
        for k in names:
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
    out = {"plain_ms": statistics.median(times["plain"]) * 1e3}
    for k in fns:
        if k != "plain":
            out[k] = statistics.median(a / b for a, b in zip(times[k], times["plain"], strict=True))
    return out


def worker(folder: str, runs: int, out: str) -> None:
    import nnatlas
    from nnatlas.testing.values import standard_values

    torch.set_num_threads(1)
    sharded = "WORLD_SIZE" in os.environ
    if sharded:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    model = nnatlas.load(folder, tokenizer=None, **({"tp_plan": "auto"} if sharded else {}))
    hf = model.native
    ids = torch.randint(4, 90, (1, SEQ), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    handles = list(standard_values(model, derived=False))

    def plain() -> None:
        with torch.no_grad():
            hf(**inputs)

    def layer_outputs() -> None:
        with model.trace(dict(inputs)):
            for layer in model.layers:
                layer.layer_output.save()

    def every_value(local: bool = False) -> None:
        with model.trace(dict(inputs), order="any"):
            for h in handles:
                h.save(local=True) if local else h.save()

    fns: dict[str, Any] = {"plain": plain, "layer_outputs": layer_outputs, "every_value": every_value}
    if sharded:
        fns["every_value_local"] = lambda: every_value(True)
    row = _rounds(fns, runs)
    row["values"] = len(handles)
    if sharded:
        gathered = 0
        with model.trace(dict(inputs), order="any"):
            saved = [h.save(local=True) for h in handles]
        gathered = sum(1 for s in saved if getattr(s, "tp_shard", None) is not None)
        row["gathered"] = gathered
        # one gather as a trace makes it: the all-gather of a rank's queries ([1, 2, 32, 64]) and MLP neurons
        from nnatlas.parallel.tensor_parallel import _gather

        costs = []
        for shape in ((1, 2, SEQ, 64), (1, SEQ, 344)):
            local = torch.randn(shape)
            for _ in range(5):
                _gather(local, len(shape) - 1, model._tp)
            t = time.perf_counter()
            for _ in range(50):
                _gather(local, len(shape) - 1, model._tp)
            costs.append((time.perf_counter() - t) / 50)
        row["gather_us_per_value"] = statistics.mean(costs) * 1e6
        if dist.get_rank() == 0:
            Path(out).write_text(json.dumps(row))
        dist.destroy_process_group()
    else:
        Path(out).write_text(json.dumps(row))


def rows(runs: int = 21) -> list[str]:
    """The bench's lines (one process, TP=2), or one line saying why the TP row is missing."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    tmp = Path(tempfile.mkdtemp(prefix="nnatlas-bench-tp-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    lines = []
    try:
        _model(tmp / "model")
        for procs in (1, 2):
            out = tmp / f"tp{procs}.json"
            cmd = [sys.executable, "-m", "bench.tensor_parallel", str(tmp / "model"), str(runs), str(out)]
            if procs == 2:
                if torchrun is None:
                    lines.append("  TP=2: skipped (no torchrun beside this python)")
                    break
                cmd = [torchrun, "--standalone", "--nproc_per_node", "2", *cmd[1:]]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                                  cwd=Path(__file__).resolve().parents[1])
            if done.returncode != 0 or not out.exists():
                lines.append(f"  {'TP=2' if procs == 2 else 'one process'}: failed: {done.stderr[-400:]}")
                continue
            r = json.loads(out.read_text())
            name = "TP=2 (gloo)" if procs == 2 else "one process"
            line = (f"  {name:<12} plain {r['plain_ms']:.2f} ms; traced/plain: every layer_output "
                    f"{r['layer_outputs']:.2f}x, every standard value ({r['values']}) {r['every_value']:.2f}x")
            if procs == 2:
                line += (f" (local=True {r['every_value_local']:.2f}x); {r['gathered']} values sharded, "
                         f"gathered at {r['gather_us_per_value']:.0f} us per value (an all-gather of 2 ranks' shards)")
            lines.append(line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lines


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
