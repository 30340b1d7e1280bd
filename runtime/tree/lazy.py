"""Deferred expressions over the values of a trace: arithmetic, comparisons, torch functions and tensor methods
on value handles build a :class:`LazyExpr` (``model.layers[1].output * 2``), which the forward computes once the
values it reads are served; ``.save()`` keeps its result (see :mod:`nnatlas.trace.computed`)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from ..errors import NnatlasError
from ..trace.computed import save_expr
from ..trace.requests import Expr
from ..trace.tracer import Tracer


def _lazy_binop(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[Any, Any], LazyExpr]:
    def method(self: Any, other: Any) -> LazyExpr:
        a, b = self._node(), _node(other)
        return LazyExpr(Expr(op, (b, a) if reflected else (a, b)), self._owner())
    return method


def _node(x: Any) -> Any:
    if isinstance(x, _Lazy):  # (a value handle or an expression)
        return x._node()
    if isinstance(x, list | tuple):
        return type(x)(_node(i) for i in x)
    return x


def _owner_in(items: Any) -> Tracer | None:
    """The trace whose body built the first handle or expression among ``items`` (nested lists and tuples)."""
    for x in items:
        if isinstance(x, _Lazy):
            return x._owner()
        if isinstance(x, list | tuple):
            found = _owner_in(x)
            if found is not None:
                return found
    return None


class _Lazy:
    """Arithmetic and torch functions on handles build deferred expressions."""

    def _node(self) -> Any:
        raise NotImplementedError

    def _owner(self) -> Tracer | None:
        """The trace whose body this handle or expression belongs to (an expression's save is recorded there)."""
        raise NotImplementedError

    __add__ = _lazy_binop(operator.add)
    __radd__ = _lazy_binop(operator.add, True)
    __sub__ = _lazy_binop(operator.sub)
    __rsub__ = _lazy_binop(operator.sub, True)
    __mul__ = _lazy_binop(operator.mul)
    __rmul__ = _lazy_binop(operator.mul, True)
    __truediv__ = _lazy_binop(operator.truediv)
    __rtruediv__ = _lazy_binop(operator.truediv, True)
    __matmul__ = _lazy_binop(operator.matmul)
    __pow__ = _lazy_binop(operator.pow)

    def __neg__(self) -> LazyExpr:
        return LazyExpr(Expr(operator.neg, (self._node(),)), self._owner())

    # comparisons build masks of the forward's values: ``moe.expert_indices == e``
    __eq__ = _lazy_binop(operator.eq)  # type: ignore[assignment]
    __ne__ = _lazy_binop(operator.ne)  # type: ignore[assignment]
    __lt__ = _lazy_binop(operator.lt)
    __le__ = _lazy_binop(operator.le)
    __gt__ = _lazy_binop(operator.gt)
    __ge__ = _lazy_binop(operator.ge)
    __hash__ = object.__hash__

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> LazyExpr:
        kwargs = kwargs or {}
        expr = Expr(func, _node(tuple(args)), {k: _node(v) for k, v in kwargs.items()})
        return LazyExpr(expr, _owner_in((*args, *kwargs.values())))


class LazyExpr(_Lazy):
    """A deferred expression over values of the trace (``model.layers[1].output * 2``); ``.save()`` keeps its
    result (see :mod:`nnatlas.trace.computed`)."""

    def __init__(self, expr: Expr, tracer: Tracer | None = None):
        self._expr = expr
        self._trace = tracer

    def _node(self) -> Expr:
        return self._expr

    def _owner(self) -> Tracer | None:
        return self._trace

    def save(self) -> torch.Tensor:
        """The expression's result, once the forward computed the values it reads: a placeholder in the body,
        the real tensor after the block (under ``grad=True`` a node of the forward's graph, its ``.grad`` kept)."""
        return save_expr(self._expr, self._trace)

    def __getitem__(self, key: Any) -> LazyExpr:
        return LazyExpr(Expr(operator.getitem, (self._expr, key)), self._trace)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _lazy_attr(self._expr, name, self._trace)

    def __repr__(self) -> str:
        return "<deferred expression: computed during the forward>"

    def __bool__(self) -> bool:
        raise NnatlasError("a deferred expression has no truth value while the trace body runs; compute it after "
                           "the trace, or use it as a tensor (masked_fill, where) inside the forward")


def _lazy_attr(node: Any, name: str, tracer: Tracer | None) -> Any:
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        raise AttributeError(f"tensors have no attribute '{name}'")
    if callable(attr):
        def method(*args: Any, **kwargs: Any) -> LazyExpr:
            return LazyExpr(Expr(lambda t, *a, **k: getattr(t, name)(*a, **k), (node, *_node(args)),
                                 {k: _node(v) for k, v in kwargs.items()}), tracer)
        return method
    return LazyExpr(Expr(lambda t: getattr(t, name), (node,)), tracer)
