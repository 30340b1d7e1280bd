"""Where a traced call's time goes, for the why of a miss: recording (``model.trace(...)`` to the end
of the body), installing (the block's end to the forward), the forward over the plain call, closing
(the forward's end to the block's end: teardown and checks). Each is the least over warm runs
interleaved with the plain call: what the code costs when nothing else takes the machine (a median
of a phase a few µs long moves with the load more than the phase itself)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nnatlas
from nnatlas.trace.tracer import Tracer

PHASES = ("record", "install", "forward", "close")


def split(fn: Callable[[], object], plain: Callable[[], object], runs: int) -> dict[str, float]:
    """Seconds of each phase of ``fn`` (one traced call), ``forward`` less ``plain``'s call, over ``runs`` runs."""
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

    best = dict.fromkeys((*PHASES, "plain"), float("inf"))
    Tracer.__exit__ = timed_exit  # type: ignore[method-assign]
    Tracer._forward = timed_forward  # type: ignore[method-assign]
    try:
        fn()
        for _ in range(runs):
            start = clock()
            plain()
            best["plain"] = min(best["plain"], clock() - start)
            start = clock()
            fn()
            end = clock()
            for phase, took in (("record", marks["exit"] - start), ("install", marks["forward"] - marks["exit"]),
                                ("forward", marks["forward_end"] - marks["forward"]), ("close", end - marks["forward_end"])):
                best[phase] = min(best[phase], took)
    finally:
        Tracer.__exit__ = exit_  # type: ignore[method-assign]
        Tracer._forward = forward  # type: ignore[method-assign]
    best["forward"] -= best.pop("plain")
    return best


def _loop(n: int = 12) -> list[None]:
    return [None for _ in range(n)]


def cold_python(plain: Callable[[], object], runs: int) -> tuple[float, float]:
    """Seconds a 12-step Python loop takes (least over ``runs``): warm (run just before), and right
    after the plain forward. The gap is what this machine charges for Python that the forward pushed
    out of its caches: every phase of a traced call runs after a forward, or between its kernels."""
    clock = time.perf_counter
    warm = cold = float("inf")
    for _ in range(runs):
        _loop()
        start = clock()
        _loop()
        warm = min(warm, clock() - start)
        plain()
        start = clock()
        _loop()
        cold = min(cold, clock() - start)
    return warm, cold


RUNTIME = str(Path(nnatlas.__file__).parent)


def runtime_calls(fn: Callable[[], object]) -> tuple[int, int]:
    """How many nnatlas runtime functions one traced call of ``fn`` runs: (in the forward, in all).
    Counted, not timed: the structural part of a miss's why (a profile hook sees each Python call)."""
    counts = [0, 0]
    forward = Tracer._forward
    inside = [False]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(RUNTIME):
            counts[1] += 1
            if inside[0] and frame.f_code is not forward.__code__:
                counts[0] += 1

    def counted(self: Tracer) -> Any:
        inside[0] = True
        try:
            return forward(self)
        finally:
            inside[0] = False

    Tracer._forward = counted  # type: ignore[method-assign]
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        Tracer._forward = forward  # type: ignore[method-assign]
    return counts[0], counts[1]
