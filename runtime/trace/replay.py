"""A trace recorded as an earlier one, replayed: no request objects, no grouping, the plan found by the values asked.

The common loop (the same body over many prompts, a bench) saves the same values every time. A value handle
saved before records its save in the trace's ``_quick`` list (its target, then its holder: ``Value.save``)
instead of making a :class:`~nnatlas.trace.requests.Request`, while the body has asked nothing else. When the
block ends, the tracer looks those targets up (:class:`Replay`, made by the earlier trace of the same values
whose every request was a plain save of a site of its own) and runs :func:`execute`: the plan's wrappers on,
the forward, the wrappers off; each site that fires fills its holder (:func:`serve`). Whatever is not that
trace's plain case (a request out of body order, one never reached) is made into requests on the spot and goes
the general way, so that it raises what the general path raises. Each function takes the Tracer as Any
(``nnatlas.trace.tracer`` imports this module).
"""

from __future__ import annotations

from typing import Any

import torch

from . import interrupts, sites, unserved
from .placeholders import plain
from .requests import RUNNING_TRACE, Request, SiteKey, Target, _same, fill

_Tensor = torch.Tensor
_set_grad = torch._C._set_grad_enabled
_grad_enabled = torch._C.is_grad_enabled
_set_running = RUNNING_TRACE.set
_kernel_routes = sites._KERNEL_ROUTES.get


class Replay:
    """The requests of a trace of plain saves, each at a site of its own, kept by the model's installer
    (``SiteInstaller.replays``) under the id of the first: the targets in body order (held, so that their ids stay
    theirs), each site's place among them, what reads each value, and the plan the traces reuse (``plan_key``,
    ``plan``: dropped when the installer drops any plan, used while the plan is valid)."""

    __slots__ = ("targets", "sites", "gets", "plan_key", "plan")

    def __init__(self, targets: list[Target], plan_key: Any, plan: Any):
        self.targets = targets
        self.sites: dict[SiteKey, int] = {t.site: i for i, t in enumerate(targets)}
        self.gets = [t.get for t in targets]
        self.plan_key, self.plan = plan_key, plan


def execute(tracer: Any) -> bool:
    """``Tracer._execute`` for a trace recorded as an earlier one (its ``_quick`` saves alone, nothing else asked):
    find that trace's :class:`Replay`, check its plan is still valid, put the wrappers on, run the forward, take
    them off again (whatever happened); then what was not served raises as the general path says it. False, with
    nothing done, where the trace is not one to replay (the tracer goes the general way)."""
    quick = tracer._quick
    md = tracer.model.__dict__
    if tracer.requests or tracer.grad or tracer.steps is not None or _kernel_routes() or "_kernels" in md:
        return False
    installer = md.get("_site_installer")
    found = None if installer is None else installer.replays.get(id(quick[0]))
    if found is None or found.targets != quick[::2]:
        return False
    plan = found.plan
    if not plan.valid():
        return False
    holders = tracer._pending = quick[1::2]  # (a holder served is None here)
    plain(holders)  # (the body's placeholders become plain tensors, to be filled)
    tracer._replay = found
    tracer._saves = True  # (every request a plain save of a site of its own: serve's short path)
    live = installer.live
    live.serve, live.mine = tracer._serve_replay, tracer.call_dims
    grad = _grad_enabled()
    token = _set_running(tracer.call_dims)
    try:
        plan.put_on()
        _set_grad(False)
        if interrupts._pending:  # an interrupt while installing: raise it before the forward
            interrupts.deliver()
        tracer.output = tracer._forward()
    except BaseException:
        installer.forget(found.plan_key)  # (a forward that raised may have left a wrapper's state half way)
        raise
    finally:  # (none of these raises)
        _set_grad(grad)
        plan.take_off()
        live.clear()
        RUNNING_TRACE.reset(token)
    if tracer._cursor != len(holders) or tracer._late is not None:
        unserved.served(tracer, tracer._ordered if tracer._late is not None else requests(tracer), False)
    return True


def serve(tracer: Any, key: SiteKey, payload: Any) -> Any:
    """``Tracer.serve`` for a replayed trace: the site's save, if it is the next in body order (any order
    under ``order="any"``), is pointed at the value; a later call of a site served already is left alone."""
    i = tracer._replay.sites.get(key)
    if i is None:
        return payload
    pending = tracer._pending
    holder = pending[i]
    if holder is None:
        return payload  # (a later call of the site: the save is its first call's)
    cursor = tracer._cursor
    if i != cursor and tracer.strict:
        return _late(tracer, i, payload)
    get = tracer._replay.gets[i]
    value = payload if get is _same else get(payload)
    if type(holder) is _Tensor and isinstance(value, _Tensor):
        holder.data = value
    else:
        fill(holder, value, tracer._replay.targets[i].label)
    pending[i] = None
    tracer._cursor = cursor + 1
    return payload


def requests(tracer: Any) -> list[Request]:
    """The replayed trace's saves as the requests the general path makes of them (``Tracer._materialize``),
    those served done, grouped by site: what the general serve and the unserved errors read."""
    quick, pending = tracer._quick, tracer._pending
    made = [Request(j, t.label, "save", t, h, 0, 0, done=pending[j] is None)
            for j, (t, h) in enumerate(zip(quick[::2], quick[1::2], strict=True))]
    tracer.requests = tracer._ordered = made
    tracer.by_site = {r.target.site: [r] for r in made}  # type: ignore[union-attr]  # (each has a target)
    tracer.fired = {}
    return made


def _late(tracer: Any, i: int, payload: Any) -> Any:
    """Save ``i``'s site fired while an earlier save still waits: the general path from here on (its serve
    counts whether the earlier one's site fires: computed later, or never reached)."""
    made = requests(tracer)
    tracer.model.__dict__["_site_installer"].live.serve = tracer.serve
    return tracer._out_of_order(made[tracer._cursor], made[i], payload)
