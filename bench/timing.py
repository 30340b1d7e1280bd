"""Interleaved, warm, median timings."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def medians(fns: dict[str, Callable[[], object]], runs: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each function, run round-robin (order rotated every round)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    clock = time.perf_counter
    for r in range(runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = fns[name]
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}
