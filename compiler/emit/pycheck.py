"""The only shape a generated family adapter may have, checked before it is written or run.

The adapter is data and small functions: imports from nnatlas, classes of annotations, functions
that return one expression, and assignments of literals and of calls to the adapter's own
constructors (``Layout(...)``, ``HostSpec(...)``, ``Family(...)`` …) or to ``nnatlas.trace.expressions``
(``_fn.softmax(...)``). Every name it reads is one it defines or imports, or a function's
parameter; no attribute but ``_fn.NAME``; no lambda, comprehension, import of anything else,
``getattr`` or ``__import__``. ``generate`` runs this on every adapter before any is written or
executed (printouts execute the adapter), so even a name the resolver and the templates both let
through could not make a spec's text run as code.
"""

from __future__ import annotations

import ast
from collections import deque
from typing import Any

from ..errors import GenerateError

IMPORTS = {"__future__", "typing", "nnatlas.trace", "nnatlas.spec", "nnatlas.tree.hosts", "nnatlas.loading.load", "nnatlas.loading.typed"}
CALLS = {"Condition", "Family", "FunctionGroup", "HostSpec", "Identity", "Layout", "Loader", "ReadPoint", "ValueSpec",
         "ViewOp", "Wrapper", "_cfg"}
TYPES = {"tuple", "dict", "str", "int", "list", "Any"}  # read in annotations
# the expressions an adapter may hold, each with the fields that hold its sub-expressions (an
# operator or an expression context, the only other nodes under them, is always allowed)
_EXPR: dict[type[ast.AST], tuple[str, ...]] = {
    ast.Constant: (), ast.Name: (), ast.Tuple: ("elts",), ast.List: ("elts",), ast.Dict: ("keys", "values"),
    ast.Attribute: ("value",), ast.Call: ("func", "args", "keywords"), ast.Subscript: ("value", "slice"),
    ast.Slice: ("lower", "upper", "step"), ast.BinOp: ("left", "right"), ast.UnaryOp: ("operand",),
    ast.BoolOp: ("values",), ast.Compare: ("left", "comparators"), ast.IfExp: ("test", "body", "orelse"),
    ast.keyword: ("value",)}


def parse(rel: str, source: str) -> ast.Module:
    """``source`` parsed, else GenerateError naming the file and line."""
    return _compile(rel, source, ast.PyCF_ONLY_AST)


def compiles(rel: str, source: str) -> None:
    """GenerateError unless ``source`` compiles (it parses, and more): ``parse`` without building a
    syntax tree in Python objects, at a third of its cost."""
    _compile(rel, source, 0)


def _compile(rel: str, source: str, flags: int) -> Any:
    try:
        return compile(source, rel, "exec", flags, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        where = f" (line {e.lineno}: {e.msg})" if isinstance(e, SyntaxError) else f" ({e})"
        raise GenerateError(f"nnatlas: {rel} would not parse{where}; nothing was written. "
                            "This is a bug in nnatlas's templates: please report it with the spec") from None


def check_adapter(rel: str, source: str) -> None:
    """GenerateError unless ``source`` parses and has only the shape above."""
    tree = parse(rel, source)
    defined = set(TYPES)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            defined.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.ClassDef | ast.FunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
    _Checker(rel, defined).module(tree)


class _Checker:
    def __init__(self, rel: str, defined: set[str]):
        self.rel, self.defined = rel, defined

    def fail(self, node: ast.AST, what: str) -> GenerateError:
        return GenerateError(f"nnatlas: {self.rel} line {getattr(node, 'lineno', '?')}: {what}, which no adapter "
                             "holds; nothing was written. This is a bug in nnatlas: please report it with the spec")

    def module(self, tree: ast.Module) -> None:
        for k, node in enumerate(tree.body):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and k == 0:
                continue  # the docstring
            if isinstance(node, ast.ImportFrom):
                if node.module not in IMPORTS or node.level:
                    raise self.fail(node, f"an import from {node.module}")
            elif isinstance(node, ast.Assign):
                if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                    raise self.fail(node, "an assignment to something but a name")
                self.expr(node.value, set())
            elif isinstance(node, ast.AnnAssign):
                if not isinstance(node.target, ast.Name) or node.value is None:
                    raise self.fail(node, "an annotation without a value")
                self.expr(node.annotation, set())
                self.expr(node.value, set())
            elif isinstance(node, ast.ClassDef):
                self.classdef(node)
            elif isinstance(node, ast.FunctionDef):
                self.function(node)
            else:
                raise self.fail(node, f"a {type(node).__name__} statement")

    def classdef(self, node: ast.ClassDef) -> None:
        if node.decorator_list or node.keywords or not all(isinstance(b, ast.Name) for b in node.bases):
            raise self.fail(node, "a class with decorators, keywords or computed bases")
        for b in node.bases:
            self.expr(b, set())
        for k, item in enumerate(node.body):
            if isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant) and k == 0:
                continue
            if isinstance(item, ast.Pass):
                continue
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is None:
                self.expr(item.annotation, set())
                continue
            raise self.fail(item, "a class body that is not annotations")

    def function(self, node: ast.FunctionDef) -> None:
        a = node.args
        if node.decorator_list or a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            raise self.fail(node, "a function with decorators, defaults or variable arguments")
        if len(node.body) != 1 or not isinstance(node.body[0], ast.Return) or node.body[0].value is None:
            raise self.fail(node, "a function that does more than return one expression")
        params = {arg.arg for arg in a.args}
        for arg in a.args:
            if arg.annotation is not None:
                self.expr(arg.annotation, set())
        if node.returns is not None:
            self.expr(node.returns, set())
        self.expr(node.body[0].value, params)

    def expr(self, root: ast.expr, params: set[str]) -> None:
        todo: deque[ast.AST] = deque([root])  # breadth first, as ast.walk, over sub-expressions only
        while todo:
            node = todo.popleft()
            fields = _EXPR.get(type(node))
            if fields is None:
                raise self.fail(node, f"a {type(node).__name__} expression")
            for name in fields:
                child = getattr(node, name)
                if isinstance(child, list):
                    todo.extend(c for c in child if c is not None)  # a dict's **spread has no key
                elif child is not None:
                    todo.append(child)
            if isinstance(node, ast.Name):
                if node.id not in self.defined and node.id not in params:
                    raise self.fail(node, f"the name {node.id!r}")
            elif isinstance(node, ast.Attribute):
                if not (isinstance(node.value, ast.Name) and node.value.id == "_fn"):
                    raise self.fail(node, f"the attribute .{node.attr}")
                if node.attr.startswith("__"):
                    raise self.fail(node, f"the attribute .{node.attr}")
            elif isinstance(node, ast.Call):
                func = node.func
                direct = isinstance(func, ast.Name) and func.id in CALLS
                helper = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "_fn"
                if not (direct or helper):
                    raise self.fail(node, f"a call of {ast.unparse(func)}")
