"""How long the compiler takes: ``nnatlas generate --check`` cold, and in process per family."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path


def cold_check(runs: int = 3) -> tuple[float, float]:
    """Median wall seconds of ``nnatlas generate --check`` in a fresh process, and its CPU seconds
    (user + system: what the wall time would be on an idle machine)."""
    import resource

    exe = Path(sys.executable).with_name("nnatlas")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nnatlas.compiler.cli"]
    times, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([*cmd, "generate", "--check"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), statistics.median(cpu)


def in_process(runs: int = 5) -> tuple[float, int]:
    """Median seconds of ``generate(check=True)`` warm in this process, and the number of families."""
    from nnatlas.compiler import compile_atlas, default_root, generate

    root = default_root()
    n = len(compile_atlas(root / "specs", root).families)
    generate(root, check=True)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        generate(root, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times), n
