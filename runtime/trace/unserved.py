"""What a trace's forward could not serve, said as the error a researcher reads: a value whose call condition the
inputs do not meet (before the forward), one asked for after a value computed later (out of order), one whose
read point never fired (never reached)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import NotReached, OutOfOrderError
from . import conditions
from .requests import Request

# (each function takes the Tracer as Any: nnatlas.trace.tracer imports this module)


def check_reached(inputs: Mapping[str, Any], sited: list[Request]) -> None:
    """A value whose call condition these inputs do not meet is never computed: say so now,
    before the forward, rather than let a later request wait on it."""
    missing = []
    for r in sited:
        cond = r.target.reached if r.target is not None else None
        if cond is not None and not conditions.call_met(cond.name, inputs):
            label = r.owner.label if r.owner is not None else r.label
            if (label, cond) not in missing:
                missing.append((label, cond))
    if missing:
        parts = [f"{label} {cond.says}" for label, cond in missing]
        raise NotReached(f"{'; '.join(parts)}; this call has none, so the forward never computes "
                         f"{'it' if len(missing) == 1 else 'them'}. Fix: {missing[0][1].fix}")


def served(tracer: Any, ordered: list[Request], derived: bool) -> None:
    """After the forward: raise what it could not serve (out of order, never reached)."""
    if tracer._late is not None:
        raise_late(tracer, *tracer._late)
    missing = None
    for r in ordered:
        if not r.done and r.owner is None:
            missing = [r for r in ordered if not r.done and r.owner is None]
            break
    if derived:  # a derived value and its inputs point at each other: unlinked, they go with the last reference
        for r in ordered:
            r.owner = r.deps = None
    if missing:
        names = ", ".join(r.label + (f" (step {r.step})" if tracer.steps is not None else "") for r in missing)
        raise NotReached(f"the forward finished without computing {names}: "
                         "nothing in this call reaches that point (check the inputs, the block kind, the step)")


def raise_late(tracer: Any, first: Request, later: Request) -> None:
    """``later``'s site fired while ``first`` still waited (``Tracer._out_of_order``): which error that was."""
    if tracer.fired:  # first's site fired after later's: the body asked in the wrong order
        raise OutOfOrderError(first.label, later.label)
    raise NotReached(f"{first.label} was never computed: its read point never fired in this forward, so "
                     f"{later.label}, asked for after it, could not be served in the body's order. Nothing in this "
                     "call reaches that point (check the inputs, the block kind, the step); in a spec of your own, "
                     "check the read point names a module or op the forward really calls")
