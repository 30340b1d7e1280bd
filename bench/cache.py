"""``nnatlas cache`` throughput: tokens/s over a generated corpus, on one process and under torchrun.

A small llama (hidden 256, 4 blocks, random weights) with the tiny word-level tokenizer is saved to a
temporary folder, with ``docs`` documents of 20-60 words; each run is the real command in its own
process(es) (``python -m nnatlas cache`` / ``torchrun --standalone --nproc_per_node N -m nnatlas cache``),
every block's ``layer_output`` at every real token, 1 thread per process. The figures are the command's
own summary line: tokens/s of its forward loop (model load and tokenization excluded) and the peak
resident memory of its largest process. Also: what ``model.cache`` allocates beyond a plain forward.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from nnatlas.testing import WORDS, Allocations, build, draw_inputs, first_params

SUMMARY = re.compile(r"(\d+) tokens in ([\d.]+) s on (\d+) process(?:es)?: (\d+) tokens/s; peak memory (\d+) MB")
SEQ_LEN = 64


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


def run_command(folder: Path, data: Path, out: Path, procs: int) -> dict[str, float]:
    argv = ["cache", str(folder), "--data", str(data), "--out", str(out), "--values", "layer_output",
            "--seq-len", str(SEQ_LEN), "--batch-size", "8", "--no-progress"]
    if procs == 1:
        cmd = [sys.executable, "-m", "nnatlas", *argv]
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
        if torchrun is None:
            raise RuntimeError("torchrun is not installed beside this python")
        cmd = [torchrun, "--standalone", "--nproc_per_node", str(procs), "-m", "nnatlas", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    m = SUMMARY.search(done.stderr)
    if done.returncode != 0 or m is None:
        raise RuntimeError(f"nnatlas cache failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "tokens_per_s": int(m.group(4)),
            "peak_mb": int(m.group(5))}


def cache_rows(docs: int, procs: list[int]) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="nnatlas-bench-cache-") as tmp:
        root = Path(tmp)
        _model(root / "model")
        _corpus(root / "corpus.jsonl", docs)
        for n in procs:
            r = run_command(root / "model", root / "corpus.jsonl", root / f"out{n}", n)
            size = sum(p.stat().st_size for p in (root / f"out{n}").glob("shard-*")) / 1e6
            rows.append(f"  {n} process{'es' if n > 1 else '  '}: {r['tokens']} tokens in {r['seconds']:.2f} s = "
                        f"{r['tokens_per_s']} tokens/s; peak memory {r['peak_mb']} MB per process; {size:.1f} MB "
                        "of shards")
    return rows


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
