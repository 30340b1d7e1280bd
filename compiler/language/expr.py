"""A small, whitelisted expression grammar over Python's ``ast``, compiled to Python source.

Specs write identities (``layer_input + self_attn.attention_output + mlp.mlp_output == layer_output``),
derived values (``softmax(logits[:, -1], -1)``), config expressions (``head_dim or hidden_size //
num_attention_heads``), block conditions (``layer_types[i] == 'full_attention'``) and views
(``unflatten(-1, [num_heads, head_dim])``). Nothing is ever ``eval``-ed: the tree is checked
node by node against a whitelist and turned into source text that the emitted modules contain.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nnatlas.spec import CONFIG_FUNCTIONS, FUNCTIONS, VIEW_OPS, Function

from . import names

# The one whitelist of functions a spec expression may call lives with the data model (``nnatlas.spec``):
# the compiler checks calls against it, the spec reference prints it, ``nnatlas.trace.expressions`` implements it.
CONTEXT_FUNCTIONS = {n for n, f in FUNCTIONS.items() if f.context}  # these also receive the values mapping

def _check_einsum(equation: str, operands: int) -> str | None:
    """What is wrong with an einsum equation given ``operands`` tensors, or None."""
    eq = equation.replace(" ", "")
    m = re.fullmatch(r"((?:[A-Za-z]|\.\.\.)*(?:,(?:[A-Za-z]|\.\.\.)*)*)(?:->((?:[A-Za-z]|\.\.\.)*))?", eq)
    if not m:
        return f"equation {equation!r}: subscripts are letters and '...', operands separated by ',', then '->' and the output"
    inputs = m.group(1).split(",")
    if len(inputs) != operands:
        return f"equation {equation!r} has {len(inputs)} operand(s), the call gives {operands}"
    for sub in inputs:
        if sub.count("...") > 1:
            return f"equation {equation!r}: '...' at most once per operand"
    out = m.group(2)
    if out is not None:
        letters = out.replace("...", "")
        if len(set(letters)) != len(letters):
            return f"equation {equation!r}: an output letter appears twice"
        seen = set("".join(inputs).replace("...", ""))
        extra = sorted(set(letters) - seen)
        if extra:
            return f"equation {equation!r}: output letter(s) {', '.join(extra)} appear in no operand"
        if "..." in out and not any("..." in sub for sub in inputs):
            return f"equation {equation!r}: '...' in the output but in no operand"
    return None


_STRING_CHECKS: dict[str, Callable[[str, int], str | None]] = {"einsum": _check_einsum}

MAX_TEXT = 1000  # characters in one expression, read point or view
MAX_DEPTH = 40  # nodes nested inside each other in one expression
MAX_INT = 2**53  # |integer constant|; floats must be finite

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Pow: "**", ast.Mod: "%"}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class ExprError(ValueError):
    def __init__(self, message: str, col: int = 0):
        super().__init__(message)
        self.col = col


@dataclass(frozen=True)
class Compiled:
    source: str  # Python source of the expression
    names: tuple[str, ...]  # the dotted names it refers to, in order of first use
    text: str = ""  # the spec's own text (config and block-condition expressions keep it for `evaluate`)


def _parse(text: str) -> ast.expr:
    if not isinstance(text, str) or not text.strip():
        raise ExprError("expected a non-empty expression")
    if "\n" in text.strip():
        raise ExprError("an expression is one line")
    if len(text) > MAX_TEXT:
        raise ExprError(f"an expression of {len(text)} characters (at most {MAX_TEXT})")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError) as e:  # ValueError: a null byte
        msg, offset = (e.msg, e.offset) if isinstance(e, SyntaxError) else (str(e), 1)
        raise ExprError(f"not an expression: {msg}", (offset or 1) - 1) from None
    except (RecursionError, MemoryError):
        raise ExprError(f"an expression nested too deeply (at most {MAX_DEPTH} levels)") from None
    _check_tree(node, text.strip())
    return node


def _check_tree(root: ast.expr, text: str) -> None:
    """Bounded depth (the walks below recurse) and constants that are plain, finite and small."""
    todo: list[tuple[ast.AST, int]] = [(root, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"an expression nested too deeply (at most {MAX_DEPTH} levels)", getattr(node, "col_offset", 0))
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, float | complex) and not isinstance(v, bool) and (
                    not math.isfinite(abs(v)) or isinstance(v, complex)):
                shown = ast.get_source_segment(text, node) or ast.unparse(node)
                raise ExprError(f"'{shown}': numbers must be finite and real", node.col_offset)
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
                raise ExprError(f"integer too large (at most {MAX_INT} in magnitude)", node.col_offset)
            if isinstance(v, bytes):
                raise ExprError("bytes are not allowed in a spec expression", node.col_offset)
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _block_index(node: ast.expr) -> str | None:
    """An index inside a dotted name: an integer, ``i`` (the host's block index), ``i + 1``, ``i - 1``."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return str(node.value)
    if isinstance(node, ast.Name) and node.id == "i":
        return "i"
    if (isinstance(node, ast.BinOp) and isinstance(node.left, ast.Name) and node.left.id == "i"
            and isinstance(node.op, ast.Add | ast.Sub) and isinstance(node.right, ast.Constant)
            and type(node.right.value) is int):
        return f"i{'+' if isinstance(node.op, ast.Add) else '-'}{node.right.value}"
    return None


def _key(node: ast.expr, keys: bool) -> str | None:
    """An index inside a dotted name (``_block_index``), or, where ``keys`` (a config entry), a word in quotes: a
    mapping's key (``per_layer_config['full_attention'].head_dim``: the blocks of one kind)."""
    if keys and isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\w+", node.value):
        return repr(node.value)
    return _block_index(node)


def _dotted(node: ast.expr, keys: bool = False) -> str | None:
    """``a.b[0].c`` → "a.b[0].c": attribute chains, with integer indexes between attributes
    (or ``[i]``, ``[i+1]``: relative to the host's block index; where ``keys``, a word in quotes)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
        while (isinstance(node, ast.Subscript) and _key(node.slice, keys) is not None
               and isinstance(node.value, ast.Name | ast.Attribute)):
            parts[-1] = f"[{_key(node.slice, keys)}].{parts[-1]}"
            node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts)).replace(".[", "[")
    return None


class _Emitter:
    def __init__(self, name_code: Callable[[str], str], functions: dict[str, Function], fn_prefix: str,
                 allow_compare: bool, allow_strings: bool, allow_bool: bool, keys: bool = False):
        self.name_code = name_code
        self.keys = keys  # a word in quotes may index a dotted name (a config entry's)
        self.functions = functions
        self.fn_prefix = fn_prefix
        self.allow_compare = allow_compare
        self.allow_strings = allow_strings
        self.allow_bool = allow_bool
        self.names: list[str] = []

    def fail(self, node: ast.AST, message: str) -> ExprError:
        return ExprError(message, getattr(node, "col_offset", 0))

    def emit(self, node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or v is None:
                return repr(v)
            if isinstance(v, int | float):
                return repr(v)
            if isinstance(v, str) and self.allow_strings:
                return repr(v)
            if v is Ellipsis:
                return "..."
            raise self.fail(node, f"constant {v!r} is not allowed here")
        if isinstance(node, ast.Name | ast.Attribute):
            dotted = _dotted(node, self.keys)
            if dotted is None:
                raise self.fail(node, "attributes are allowed only on names (a.b.c)")
            dunder = next((p for p in re.split(r"[.\[\]]", dotted) if p.startswith("__")), None)
            if dunder is not None:
                raise self.fail(node, f"'{dunder}' starts with '__' (reserved for Python's own names)")
            if dotted not in self.names:
                self.names.append(dotted)
            return self.name_code(dotted)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return f"({self.emit(node.left)} {_BINOPS[type(node.op)]} {self.emit(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{self.emit(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return f"(~{self.emit(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and self.allow_bool:
            return f"(not {self.emit(node.operand)})"
        if isinstance(node, ast.BoolOp) and self.allow_bool:
            op = " or " if isinstance(node.op, ast.Or) else " and "
            return "(" + op.join(self.emit(v) for v in node.values) + ")"
        if isinstance(node, ast.IfExp) and self.allow_bool:
            return f"({self.emit(node.body)} if {self.emit(node.test)} else {self.emit(node.orelse)})"
        if isinstance(node, ast.Compare) and self.allow_compare:
            if len(node.ops) != 1 or type(node.ops[0]) not in _CMPOPS:
                raise self.fail(node, "one comparison at a time (==, !=, <, <=, >, >=)")
            return f"({self.emit(node.left)} {_CMPOPS[type(node.ops[0])]} {self.emit(node.comparators[0])})"
        if isinstance(node, ast.Subscript):
            return f"{self.emit(node.value)}[{self.emit_index(node.slice)}]"
        if isinstance(node, ast.Call):
            return self.emit_call(node)
        if isinstance(node, ast.List | ast.Tuple):
            inner = ", ".join(self.emit(e) for e in node.elts)
            return f"[{inner}]" if isinstance(node, ast.List) else f"({inner}{',' if len(node.elts) == 1 else ''})"
        raise self.fail(node, f"'{ast.unparse(node)}' is not allowed in a spec expression")

    def emit_call(self, node: ast.Call) -> str:
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "only named functions may be called (no methods)")
        name = node.func.id
        if name not in self.functions:
            allowed = ", ".join(sorted(self.functions))
            close = difflib.get_close_matches(name, self.functions, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise self.fail(node, f"unknown function '{name}'{hint} (allowed: {allowed})")
        fn = self.functions[name]
        lo, hi = (fn.arity, fn.arity) if isinstance(fn.arity, int) else fn.arity
        if not lo <= len(node.args) <= hi:
            raise self.fail(node, f"{name}() takes {lo if lo == hi else f'{lo} to {hi}'} positional arguments, "
                                  f"got {len(node.args)}: {fn.signature}")
        allowed_kw = dict(fn.keywords)
        args = []
        for k, a in enumerate(node.args):
            if k in fn.strings:
                if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
                    raise self.fail(a, f"{name}(): argument {k + 1} is a string literal: {fn.signature}")
                check = _STRING_CHECKS.get(name)
                if check is not None:
                    problem = check(a.value, len(node.args) - 1)
                    if problem:
                        raise self.fail(a, f"{name}(): {problem}")
                args.append(repr(a.value))
            else:
                args.append(self.emit_arg(a))
        if name in CONTEXT_FUNCTIONS:
            args.append("v")
        for kw in node.keywords:
            if kw.arg is None or kw.arg not in allowed_kw:
                what = "**" if kw.arg is None else f"keyword '{kw.arg}'"
                takes = f"takes the keywords {', '.join(allowed_kw)}" if allowed_kw else "takes positional arguments only"
                raise self.fail(kw.value if kw.arg is None else node, f"{name}() {takes}, not {what}: {fn.signature}")
            literals = allowed_kw[kw.arg]
            if literals is not None:
                if not (isinstance(kw.value, ast.Constant) and kw.value.value in literals):
                    raise self.fail(kw.value, f"{name}(): {kw.arg} is one of {', '.join(repr(x) for x in literals)}")
                args.append(f"{kw.arg}={kw.value.value!r}")
            else:
                args.append(f"{kw.arg}={self.emit_arg(kw.value)}")
        return f"{self.fn_prefix}{name}({', '.join(args)})"

    def emit_arg(self, node: ast.expr) -> str:
        """A call's argument: an operator expression needs no parentheses of its own there."""
        text = self.emit(node)
        if isinstance(node, ast.BinOp | ast.BoolOp | ast.Compare | ast.UnaryOp | ast.IfExp):
            return text[1:-1]
        return text

    def emit_index(self, node: ast.expr) -> str:
        if isinstance(node, ast.Slice):
            parts = [self.emit(p) if p is not None else "" for p in (node.lower, node.upper)]
            text = f"{parts[0]}:{parts[1]}"
            if node.step is not None:
                text += f":{self.emit(node.step)}"
            return text
        if isinstance(node, ast.Tuple):
            return ", ".join(self.emit_index(e) for e in node.elts)
        return self.emit(node)


# The compilers below are pure functions of the text, and a spec chain repeats its texts in every family
# that extends it (2,766 compilations of 431 texts for the 65 families): each result is kept (an error is not,
# so it is raised again each time); typed, so that 1, 1.0 and True stay apart
_memo = functools.lru_cache(maxsize=4096, typed=True)


@_memo
def compile_identity(text: str) -> tuple[str, Compiled, Compiled]:
    """``lhs OP rhs`` → (op, lhs, rhs); names are value paths relative to the host, config entries, or
    a parameter or buffer of a child module (``router.e_score_correction_bias``: checked on the tiny
    model's tree by ``make generate``, read from the module when the identity is checked)."""
    node = _parse(text)
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or type(node.ops[0]) not in _CMPOPS:
        raise ExprError("an identity is one comparison: lhs == rhs (or <=, <, >=, >)")
    op = _CMPOPS[type(node.ops[0])]
    sides = []
    for side in (node.left, node.comparators[0]):
        e = _Emitter(lambda n: f"v[{n!r}]", FUNCTIONS, "_fn.", False, False, False)
        sides.append(Compiled(e.emit(side), tuple(e.names)))
    return op, sides[0], sides[1]


@_memo
def compile_derived(text: str) -> Compiled:
    """A derived value: names are the host's values, ``model.x`` (the root's value x) or config entries."""
    e = _Emitter(lambda n: f"v[{n!r}]", FUNCTIONS, "_fn.", True, False, False)
    return Compiled(e.emit(_parse(text)), tuple(e.names))


@_memo
def compile_config(text: str | int | float) -> Compiled:
    """A normalized config attribute: names are config attributes (``vision_config.depth``)."""
    if isinstance(text, bool):
        raise ExprError("a config entry is a name or an expression, not a boolean")
    if isinstance(text, int | float):
        return Compiled(repr(text), (), repr(text))
    e = _Emitter(lambda n: f"_cfg(c, {n!r})", CONFIG_FUNCTIONS, "_fn.cfg_", True, True, True, keys=True)
    return Compiled(e.emit(_parse(text)), tuple(e.names), text)


@_memo
def compile_when(text: str) -> Compiled:
    """A block condition over the normalized config and the block index ``i``."""
    def name(n: str) -> str:
        return "i" if n == "i" else f"_cfg(c, {n!r})"
    e = _Emitter(name, CONFIG_FUNCTIONS, "_fn.cfg_", True, True, True)
    return Compiled(e.emit(_parse(text)), tuple(n for n in e.names if n != "i"), text)


def parse_view(text: str) -> list[tuple[str, tuple[object, ...]]]:
    """``unflatten(-1, [num_heads, head_dim]).transpose(1, 2)`` → [(op, args)], names kept as str."""
    return list(_parse_view(text))


@_memo
def _parse_view(text: str) -> tuple[tuple[str, tuple[object, ...]], ...]:
    node = _parse(text)
    calls: list[ast.Call] = []
    while True:
        if not isinstance(node, ast.Call):
            raise ExprError("a view is a chain of calls: unflatten(...), unsqueeze(...), transpose(...), flatten(...)")
        calls.append(node)
        if isinstance(node.func, ast.Name):
            break
        if isinstance(node.func, ast.Attribute):
            node = node.func.value
            continue
        raise ExprError("a view is a chain of calls")
    out = []
    for call in reversed(calls):
        func = call.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if fname not in VIEW_OPS:
            raise ExprError(f"unknown view '{fname}' (allowed: {', '.join(sorted(VIEW_OPS))})", call.col_offset)
        arity = VIEW_OPS[fname].arity
        lo, hi = (arity, arity) if isinstance(arity, int) else arity
        if call.keywords or not lo <= len(call.args) <= hi:
            raise ExprError(f"{fname}() takes {lo if lo == hi else f'{lo} to {hi}'} positional arguments", call.col_offset)
        out.append((fname, tuple(_view_arg(a) for a in call.args)))
    return tuple(out)


def _view_arg(node: ast.expr) -> object:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) is int):
        return -node.operand.value
    if isinstance(node, ast.Name):
        if bad := names.problem(node.id, "view argument"):
            raise ExprError(bad, node.col_offset)
        return node.id
    if isinstance(node, ast.List | ast.Tuple):
        return tuple(_view_arg(e) for e in node.elts)
    raise ExprError(f"view arguments are integers, config names or lists of them, not '{ast.unparse(node)}'",
                    getattr(node, "col_offset", 0))


# ---- evaluating config expressions at generate time (no eval: a walk of the same whitelist) ----

_CONFIG_CALLS: dict[str, Callable[..., object]] = {
    "len": len, "min": min, "max": max, "int": int, "count": lambda xs, item: list(xs).count(item)}
_PYOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod, ast.Eq: operator.eq,
    ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def _bounded_binop(op: ast.operator, left: Any, right: Any) -> Any:
    """``left OP right`` unless it would take long or be huge (2 ** 10 ** 10, 'x' * 10 ** 9)."""
    if isinstance(op, ast.Pow) and isinstance(right, int | float) and abs(right) > 64:
        raise ExprError(f"exponent {right} is too large to compute")
    if isinstance(op, ast.Mult) and any(isinstance(x, str | list | tuple) for x in (left, right)):
        n = right if isinstance(left, str | list | tuple) else left
        if isinstance(n, int) and n > 10_000:
            raise ExprError("a repetition too long to compute")
    result = _PYOPS[type(op)](left, right)
    if isinstance(result, int) and not isinstance(result, bool) and abs(result) > 2**64:
        raise ExprError("a result too large to compute")
    return result


def evaluate(c: Compiled, lookup: Callable[[str], Any], i: int | None = None) -> Any:
    """Compute a config or block-condition expression: names come from ``lookup`` (``i`` is the block).

    The text was checked by ``compile_config`` / ``compile_when``; this walks the same node types.
    """
    if not c.text:
        raise ExprError("this expression keeps no text to evaluate")
    compile_when(c.text)  # the whitelist, once more: nothing outside it is walked below

    def ev(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name | ast.Attribute):
            dotted = _dotted(node)
            return i if dotted == "i" else lookup(dotted or "")
        if isinstance(node, ast.BinOp):
            return _bounded_binop(node.op, ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else not v
        if isinstance(node, ast.BoolOp):
            result: Any = None
            for v_node in node.values:
                result = ev(v_node)
                if isinstance(node.op, ast.Or) and result or isinstance(node.op, ast.And) and not result:
                    return result
            return result
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.Compare):
            return _PYOPS[type(node.ops[0])](ev(node.left), ev(node.comparators[0]))
        if isinstance(node, ast.Subscript):
            return ev(node.value)[ev(node.slice)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return _CONFIG_CALLS[node.func.id](*(ev(a) for a in node.args))
        if isinstance(node, ast.List | ast.Tuple):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        raise ExprError(f"cannot evaluate '{ast.unparse(node)}'")

    return ev(_parse(c.text))
