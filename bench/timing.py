"""Interleaved, warm timings: the median time of each function, and the median of per-round ratios."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timings:
    median: dict[str, float]  # seconds per call
    ratio: dict[str, float]  # median over rounds of (this function's time / the base's time in the same round)


def measure(fns: dict[str, Callable[[], object]], runs: int, warmup: int = 3, base: str = "plain") -> Timings:
    """Run every function once per round, round-robin (the order rotated every round), ``runs`` rounds.

    Ratios are paired: each round's time over the base's time in that same round, so that a drift
    of the machine's speed during the run (another process, a frequency change) cancels instead of
    landing on whichever function it happened to hit; the median of those is the ratio reported.
    """
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
    ratio = {name: statistics.median(a / b for a, b in zip(ts, times[base])) for name, ts in times.items()}
    return Timings({name: statistics.median(ts) for name, ts in times.items()}, ratio)
