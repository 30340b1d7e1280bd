"""The drafter's config expressions (``head_dim or hidden_size // num_attention_heads``), evaluated on a config.

The drafter writes these from config attribute names, and some names come from the checkpoint's own config.json,
which anyone may have written: before ``eval`` the text must parse as an expression of names, attributes, items,
numbers, strings, arithmetic, comparisons and ``and``/``or``/``if``, with no name or attribute that holds a double
underscore (the way out of an eval without builtins) and no call but those named; anything else is refused (never evaluated).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

_NODES = (ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Constant, ast.Name,
          ast.Attribute, ast.Subscript, ast.Slice, ast.List, ast.Tuple, ast.Load, ast.operator, ast.unaryop,
          ast.boolop, ast.cmpop, ast.Call)


class Refused(ValueError):
    """A config expression that is not one the drafter writes."""


def check(text: str, calls: frozenset[str] = frozenset()) -> ast.Expression:
    """The parsed expression of ``text``, or Refused saying why."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise Refused(f"not an expression: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise Refused(f"{type(node).__name__} is not allowed in a config expression")
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        if "__" in name:
            raise Refused(f"the name {name!r} holds a double underscore")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in calls
                                               and not node.keywords):
            raise Refused("a call is not allowed in a config expression")
    return tree


def evaluate(text: str, names: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None) -> Any:
    """``text`` (checked by :func:`check`) evaluated with ``names`` (a missing name: the mapping's ``__missing__``)
    and ``functions``, and no builtins."""
    functions = dict(functions or {})
    code = compile(check(text, frozenset(functions)), "<config expression>", "eval")
    return eval(code, {"__builtins__": functions}, names)  # noqa: S307 - checked above: names, numbers, arithmetic
