"""Interleaved, warm timings: the median time of each function, and the median of per-round ratios."""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Timings:
    median: dict[str, float]  # seconds per call
    ratio: dict[str, float]  # median over rounds of (this function's time / the base's time in the same round)
    over: dict[str, float] = field(default_factory=dict)  # median over rounds of (this time - the base's), seconds


def measure(fns: dict[str, Callable[[], object]], runs: int, warmup: int = 3, base: str = "plain",
            seed: int = 0) -> Timings:
    """Run every function once per round, in an order shuffled every round (seeded), ``runs`` rounds.

    Ratios are paired: each round's time over the base's time in that same round, so that a drift
    of the machine's speed during the run (another process, a frequency change) cancels instead of
    landing on whichever function it happened to hit; the median of those is the ratio reported.
    The order is shuffled, not rotated, because a call pays for what ran just before it (caches it
    emptied, garbage it left): a rotation keeps every function behind the same one, and one that
    always ran right after nnsight's call measured 15% slower (torch forward hooks on a 3-block llama,
    1.23x plain behind nnsight, 1.07x shuffled), which made the plain call the slow one and every
    ratio to it too low. tests/test_bench.py checks that the shuffle puts every function behind
    every other.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    order = names[:]
    rng = random.Random(seed)
    gc.collect()
    clock = time.perf_counter
    for _ in range(runs):
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            start = clock()
            fn()
            times[name].append(clock() - start)
    ratio = {name: statistics.median(a / b for a, b in zip(ts, times[base])) for name, ts in times.items()}
    over = {name: statistics.median(a - b for a, b in zip(ts, times[base])) for name, ts in times.items()}
    return Timings({name: statistics.median(ts) for name, ts in times.items()}, ratio, over)
