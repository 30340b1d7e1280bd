"""Where a traced call's time goes, for the why of a miss: recording (``model.trace(...)`` to the end
of the body), installing (the block's end to the forward), the forward, closing (the forward's end to
the block's end: teardown and checks). Each is the median over warm runs of the workload."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from nnatlas.trace import Tracer

PHASES = ("record", "install", "forward", "close")


def split(fn: Callable[[], object], runs: int) -> dict[str, float]:
    """Median seconds of each phase of ``fn`` (one traced call), over ``runs`` warm runs."""
    marks: dict[str, float] = {}
    clock = time.perf_counter
    exit_, forward = Tracer.__exit__, Tracer._forward

    def timed_exit(self: Tracer, *exc: Any) -> None:
        marks["exit"] = clock()
        exit_(self, *exc)

    def timed_forward(self: Tracer) -> Any:
        marks["forward"] = clock()
        try:
            return forward(self)
        finally:
            marks["forward_end"] = clock()

    times: dict[str, list[float]] = {p: [] for p in PHASES}
    Tracer.__exit__ = timed_exit  # type: ignore[method-assign]
    Tracer._forward = timed_forward  # type: ignore[method-assign]
    try:
        fn()
        for _ in range(runs):
            start = clock()
            fn()
            end = clock()
            times["record"].append(marks["exit"] - start)
            times["install"].append(marks["forward"] - marks["exit"])
            times["forward"].append(marks["forward_end"] - marks["forward"])
            times["close"].append(end - marks["forward_end"])
    finally:
        Tracer.__exit__ = exit_  # type: ignore[method-assign]
        Tracer._forward = forward  # type: ignore[method-assign]
    return {p: statistics.median(ts) for p, ts in times.items()}
