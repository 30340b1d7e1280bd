"""``nnatlas.save(obj)``: keep tensors computed in a trace's body from values, alone or in a tuple, list or dict.

Each leaf is a value handle (its ``.save()``) or an expression built from values (``LazyExpr.save()``, served by
:mod:`nnatlas.trace.computed`); what is saved already passes through; anything else is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import NnatlasError
from ..trace.placeholders import Placeholder
from ..trace.requests import Box
from .lazy import LazyExpr
from .values import Value


def _a(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def save(obj: Any) -> Any:
    """What ``nnatlas.save(obj)`` does (:func:`nnatlas.save`, which documents it)."""
    return _save(obj, "")


def _save(obj: Any, where: str) -> Any:
    if isinstance(obj, LazyExpr | Value):
        return obj.save()
    if type(obj) is Placeholder or isinstance(obj, Box):  # saved already (a value's save(), in this body)
        return obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_save(x, f"{where}.{f}") for f, x in zip(obj._fields, obj)))
    if isinstance(obj, list | tuple):
        return type(obj)(_save(x, f"{where}[{i}]") for i, x in enumerate(obj))
    if isinstance(obj, Mapping):
        return {k: _save(x, f"{where}[{k!r}]") for k, x in obj.items()}
    what = f"nnatlas.save: {where.lstrip('.') or 'its argument'}"
    if isinstance(obj, torch.Tensor):
        raise NnatlasError(f"{what} is a tensor that exists already, not one computed from a trace's values (inside "
                           "`with model.trace(...)`, from model.<value>): it needs no save, keep it as it is")
    raise NnatlasError(f"{what} is {_a(type(obj).__name__)}: nnatlas.save keeps tensors computed from a trace's values "
                       "(or a tuple, list or dict of them)")
