"""What a load from the draft cache costs: ``nnatlas.wrap(model, draft=True)`` in a fresh process, with the draft
kept by an earlier process, against the same call drafting afresh (no cache) and against a process that only imports.

    python -m bench.draft_cache                    # this checkout
    python -m bench.draft_cache --python OTHER     # and, alternating with it, another venv's (an older nnatlas)

Each child builds one tiny Helium (a type nnatlas ships no family for) and times the wrap alone; rounds alternate
kept / fresh and python / python, so all see the same machine. Printed: median seconds of each, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch, transformers, nnatlas
torch.manual_seed(0)
config = transformers.HeliumConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, head_dim=8)
model = transformers.HeliumForCausalLM(config).eval()
start, cpu = time.perf_counter(), time.process_time()
nnatlas.wrap(model, draft=True)
print(json.dumps({"wrap_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}))
"""


def _child(python: str, cache: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of the wrap in a fresh process: CPU seconds are what wall would be on an idle machine."""
    env = {**os.environ, "NNATLAS_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([python, "-c", CHILD], env=env, check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return float(got["wrap_s"]), float(got["cpu_s"])


def measure(pythons: list[str], rounds: int = 5) -> dict[str, dict[str, float]]:
    """Per python: median wrap seconds from a kept draft and drafting afresh, rounds alternating between pythons."""
    with tempfile.TemporaryDirectory(prefix="nnatlas-bench-drafts-") as tmp:
        kept = {py: Path(tmp, f"kept{i}") for i, py in enumerate(pythons)}
        for py in pythons:
            _child(py, kept[py])  # (drafts and keeps it)
        times: dict[str, dict[str, list[tuple[float, float]]]] = {py: {"kept": [], "fresh": []} for py in pythons}
        for r in range(rounds):
            for i, py in enumerate(pythons):
                times[py]["kept"].append(_child(py, kept[py]))
                times[py]["fresh"].append(_child(py, Path(tmp, f"fresh{i}-{r}")))
    out = {}
    for py, t in times.items():
        k, f = (statistics.median(x[0] for x in t[w]) for w in ("kept", "fresh"))
        kc, fc = (statistics.median(x[1] for x in t[w]) for w in ("kept", "fresh"))
        out[py] = {"kept_s": k, "fresh_s": f, "kept_cpu_s": kc, "fresh_cpu_s": fc}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.draft_cache", description=__doc__)
    parser.add_argument("--python", action="append", default=[], help="another python whose nnatlas is measured "
                        "beside this one's (an older checkout's venv); repeatable")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    pythons = [*args.python, sys.executable]
    got = measure(pythons, args.rounds)
    base = got[pythons[0]]["kept_cpu_s"]
    for py in pythons:
        g = got[py]
        print(f"{py}: wrap(draft=True) from a kept draft {g['kept_s']:.2f} s wall, {g['kept_cpu_s']:.2f} s CPU "
              f"({g['kept_cpu_s'] / base:.2f}x the first python's CPU); drafting afresh {g['fresh_s']:.2f} s wall, "
              f"{g['fresh_cpu_s']:.2f} s CPU (kept / fresh CPU {g['kept_cpu_s'] / g['fresh_cpu_s']:.2f})")
    print(f"medians of {args.rounds} fresh processes each, rounds alternating")
    return 0


if __name__ == "__main__":
    sys.exit(main())
