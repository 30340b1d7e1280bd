"""Saving what a trace's body computes from values: ``sae.encode(x).save()``, ``nnatlas.save((x @ W, x.norm()))``.

Inside the body a value (``model.layers[1].layer_output``) has no tensor yet, so arithmetic and torch functions on
it build a deferred expression (:class:`nnatlas.tree.lazy.LazyExpr`) over the values it reads. ``.save()`` on one, or
``nnatlas.save(...)`` on one or on a tuple, list or dict of them (:mod:`nnatlas.tree.saving`), records a request that the forward serves as soon
as the last value it reads is produced: the expression is evaluated there (before any later edit of those values
lands), and its result fills the tensor ``save()`` handed back, as a value's save does: a placeholder in the body
(every use raises), the real tensor after the block; under ``trace(grad=True)`` an autograd node of the forward's
graph whose ``.grad`` a backward fills. Nothing of this runs per module call: a trace with no such save pays one
attribute test per served edit or read of an expression.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import NnatlasError
from .placeholders import placeholder
from .requests import Expr, Request, fill

_EMPTY = torch.empty(0)


def _reads(node: Any, out: list[Request]) -> list[Request]:
    """The requests an expression evaluates (Expr.evaluate's walk): its values' reads, in order, each once."""
    if isinstance(node, Expr):
        for a in node.args:
            _reads(a, out)
        for a in node.kwargs.values():
            _reads(a, out)
    elif isinstance(node, Request):
        if all(r is not node for r in out):
            out.append(node)
    elif isinstance(node, list | tuple):
        for a in node:
            _reads(a, out)
    return out


def save_expr(expr: Expr, tracer: Any) -> torch.Tensor:
    """What ``LazyExpr.save()`` returns: a tensor that holds ``expr``'s result once the forward computed it."""
    if tracer is None or tracer.model._tracer is not tracer:
        raise NnatlasError("save(): this tensor was computed in a trace whose block has ended; save it inside "
                           "that `with model.trace(...)` block")
    reads = _reads(expr, [])
    names = list(dict.fromkeys(r.label for r in reads))
    label = "a tensor computed from " + (", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else ""))
    holder = placeholder(_EMPTY, label)
    seq = tracer.seq
    tracer.seq = seq + 1
    r = Request(seq, label, "computed", None, holder, tracer.current_step, ordered=False, deps=reads)
    tracer.requests.append(r)
    if tracer.computed is None:
        tracer.computed = []
    tracer.computed.append((r, expr))
    return holder


def serve_ready(tracer: Any) -> None:
    """Evaluate every expression save whose values are all produced now (called after each served read)."""
    pending: list[tuple[Request, Expr]] = tracer.computed
    ready = [(r, expr) for r, expr in pending if all(d.done for d in r.deps or ())]
    for r, expr in ready:
        pending.remove((r, expr))
        value = expr.evaluate(tracer, r.label)
        if not isinstance(value, torch.Tensor):
            raise NnatlasError(f"save(): {r.label} is a {type(value).__name__}, not a tensor: save tensors "
                               "(a shape or a number can be read off the saved tensor after the trace)")
        fill(r.payload, value, r.label, tracer.grad_live)
        r.done = True
    if not pending:
        tracer.computed = None
