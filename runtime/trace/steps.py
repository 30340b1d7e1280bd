"""``tracer.iter[...]``: the generation steps of ``model.generate``, or the tokens of a trace's call, walked by the
body one at a time (each recorded request then names its step or token)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import InputError, NnatlasError


def _show(sl: int | slice) -> str:
    if not isinstance(sl, slice):
        return str(sl)
    text = f"{'' if sl.start is None else sl.start}:{'' if sl.stop is None else sl.stop}"
    return text + (f":{sl.step}" if sl.step is not None else "")


class Steps:
    """``tracer.iter[...]``: generation steps under ``model.generate``; in a trace, the tokens of a
    per-token value (a recurrent kernel's ``state`` under ``route_kernels``)."""

    def __init__(self, tracer: Any):  # (a Tracer, which imports this module)
        self.tracer = tracer

    def __getitem__(self, sl: int | slice) -> Iterator[int]:
        total = self.tracer.steps
        per_call = total is None
        if per_call:
            total = self.tracer.calls
            if total is None:
                raise NnatlasError("tracer.iter walks generation steps (model.generate) or the tokens of a trace "
                                   "whose inputs have a known length")
        assert total is not None
        what = "tokens of this call" if per_call else "generation steps (max_new_tokens)"
        ends = (sl.start, sl.stop) if isinstance(sl, slice) else (sl,)
        if isinstance(sl, slice) and sl.step is not None and sl.step <= 0:
            raise InputError(f"tracer.iter[{_show(sl)}]: expected a positive step")
        if any(e is not None and not -total <= e <= total for e in ends) or (not isinstance(sl, slice) and sl == total):
            raise InputError(f"tracer.iter[{_show(sl)}]: there are {total} {what}: expected steps in 0..{total - 1}")
        steps = range(total)[sl] if isinstance(sl, slice) else [range(total)[sl]]
        if not steps:
            raise InputError(f"tracer.iter[{_show(sl)}] holds no step of the {total} {what}")
        return self._walk(list(steps), per_call)

    def _walk(self, steps: list[int], per_call: bool) -> Iterator[int]:
        try:
            for s in steps:
                if per_call:
                    self.tracer.current_call = s
                else:
                    self.tracer.current_step = s
                yield s
        finally:
            self.tracer.current_step = 0
            self.tracer.current_call = -1

