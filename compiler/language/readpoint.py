"""The read-point language: where a value is read, in one line.

    output            the host module's output            output[0], output.logits
    input             the host module's first input       input.input_ids (a named parameter)
    norm.output       a child module's boundary (standard or native child names)
    input_layernorm.0.output                a list child's boundary: the module at that index of a
                                            ModuleList child (LongCat-Flash's two norms per block)
    call:attention.args[1]                  an argument of the attention interface call
    call:attention.output[0]                its output
    call:attention > op:softmax.input[0]    a torch operation inside that call (op:NAME#K for the K-th)
    call:attention#1.output[0]              the second call's output, where the forward calls the
                                            interface more than once (DiffLlama: one call per half of
                                            the values); call:NAME#K > op:... reads inside the K-th call
    op:mul#2.output                         a torch operation inside the host's own forward (not inside
                                            its child modules' forwards, which have their own scope)
    router > op:linear.output               an operation inside a child module's own forward
    experts > call:experts > op:view.output an operation inside the experts interface call a child makes
    model.model > op:masked_scatter.input[1]   ... inside another module's forward: a path from the
                                            root (``model.``) or from the host, then ``>``
    method:_deepstack_process#i.args[2]     a call of one of the module's own methods (the K-th call
                                            of the forward; ``#i`` is the host's block index), its
                                            positional ``args`` or its ``output``; scoped like ops
    fn:NAME.args[0]  fn:NAME.args.g         an argument of a module-level function the host's forward calls
                                            (by position in its signature, or by parameter name; .kwargs.g too)
    fn:NAME.output[1]                       that call's output
    fn:NAME.step.output[1]                  under route_kernels: the output of each token's step
    fn:NAME.steps.output[1]                 under route_kernels: every step's output, stacked on the sequence dim

    ^.post_attention_layernorm.output       a sibling's boundary: ``^.`` starts the read at the host's
                                            parent (``^.^.`` at its grandparent); ``^.output`` is the
                                            parent's own output. What a sandwich-normed block adds to the
                                            stream is the post-norm's output, a sibling of the mixer.

    ^.op:mul#0.output                       an operation of the parent's own forward: what the
                                            parent makes of the host's output before the stream
                                            receives it (a block's residual multiplier, InternVL's
                                            layer scale lambda_1)

NAME is a global of the host's modeling module, or a group the family declares under ``functions:``
(several kernels, whichever the call runs).

A read point may start with a child module (``CHILD > ...``): the scope the interface call or the
operation is looked for in, instead of the host's own forward.

Each parses into a ``nnatlas.spec.ReadPoint`` (the runtime's data model), its ``words`` the sentence the pages show.
"""

from __future__ import annotations

import dataclasses
import re

from nnatlas.spec import SIDES, ReadPoint

from .expr import MAX_TEXT, ExprError

CALLS = {"attention": "the attention interface call", "experts": "the experts interface call"}
_ACCESS = re.compile(r"\[(-?[0-9]{1,9})\]|\.([A-Za-z_][A-Za-z0-9_]*)|\[['\"]([A-Za-z_][A-Za-z0-9_]*)['\"]\]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"\d+(?=\.)")  # a list child's index in a module path: input_layernorm.0.output
_OP = re.compile(r"op:([A-Za-z_][A-Za-z0-9_]*)(?:#([0-9]{1,6}))?\.(input|output)")
_METHOD = re.compile(r"method:([A-Za-z_][A-Za-z0-9_]*)(?:#([0-9]{1,6}|i))?\.(args|output)")
_SIDES = ("input", "inputs", "output", "args")


def _accessors(rest: str, offset: int) -> tuple[int | str, ...]:
    out: list[int | str] = []
    pos = 0
    while pos < len(rest):
        m = _ACCESS.match(rest, pos)
        if not m:
            raise ExprError(f"cannot read '{rest[pos:]}': expected [N] or .name", offset + pos)
        if m.group(1) is not None:
            out.append(int(m.group(1)))
        else:
            out.append(m.group(2) or m.group(3))
        pos = m.end()
    return tuple(out)


def _access_words(access: tuple[int | str, ...]) -> str:
    words = []
    for a in access:
        words.append(f"element {a}" if isinstance(a, int) else f".{a}")
    return (", " + ", ".join(words)) if words else ""


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def _ordinal(k: int) -> str:
    """0 → "first", 5 → "sixth", 11 → "12th"."""
    if k < len(_ORDINALS):
        return _ORDINALS[k]
    n = k + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


_FN = re.compile(r"fn:([A-Za-z_][A-Za-z0-9_]*)((?:\.steps?)?)\.(args|kwargs|output)")
FN_SIDES = {"": ("fn_args", "fn_output"), ".step": (None, "fn_step"), ".steps": (None, "fn_steps")}


def _parse_fn(text: str, groups: dict[str, str] | None) -> ReadPoint:
    m = _FN.match(text)
    if not m:
        raise ExprError(f"'{text}': write fn:NAME.args[N], fn:NAME.kwargs.NAME, fn:NAME.output[...], "
                        "fn:NAME.step.output[...] or fn:NAME.steps.output[...]")
    name, steps, side = m.group(1), m.group(2), m.group(3)
    access = _accessors(text[m.end():], m.end())
    what = (groups or {}).get(name) or f"the module-level function {name}"
    if side in ("args", "kwargs"):
        if steps:
            raise ExprError(f"'{text}': a step is read at its output (.step.output[...])")
        if not access:
            raise ExprError(f"'{text}': name the argument, e.g. .args[0] or .kwargs.g")
        if side == "kwargs" and not isinstance(access[0], str):
            raise ExprError(f"'{text}': .kwargs takes a parameter name (.kwargs.g)")
        a0 = access[0]
        arg = f"element {a0}" if isinstance(a0, int) else f"argument {a0}"
        words = f"inside the forward: the arguments of {what}, {arg}{_access_words(access[1:])}"
        return ReadPoint("fn", text, words, side="fn_args", access=access, fn=name)
    kind = FN_SIDES[steps][1]
    assert kind is not None
    if kind == "fn_output":
        words = f"inside the forward: the output of {what}{_access_words(access)}"
    elif kind == "fn_step":
        words = f"inside the forward: the output of each token's step of {what} routed token by token{_access_words(access)}"
    else:
        words = (f"inside the forward: every token's step of {what} routed token by token, stacked along the "
                 f"sequence{_access_words(access)}")
    return ReadPoint("fn", text, words, side=SIDES[kind], access=access, fn=name)


def parse(text: str, groups: dict[str, str] | None = None) -> ReadPoint:
    """``groups``: the family's declared function groups, name → words (for the pages)."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("a read point is a non-empty string")
    if len(text) > MAX_TEXT:
        raise ExprError(f"a read point of {len(text)} characters (at most {MAX_TEXT})")
    text = text.strip()
    if text.startswith("^"):
        return _parse_up(text, groups)
    if text.startswith("fn:"):
        return _parse_fn(text, groups)
    head, sep, tail = text.partition(" > ")
    if sep and not head.startswith(("call:", "op:")):
        # a scope: the module whose forward is read, a path from the host (router, mlp.experts) or
        # from the root (model, model.model)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|\d+))*", head):
            raise ExprError(f"'{head}': a scope before ' > ' is a module path (router, mlp.experts, mlps.0 for a "
                            "list child, or model.x from the root)")
        if not tail.startswith(("call:", "op:", "method:")):
            raise ExprError(f"'{text}': inside a module's forward, read an interface call (call:NAME), "
                            "an op (op:NAME) or a method call (method:NAME)")
        segments = tuple(head.split("."))
        root = segments[0] == "model"
        path = segments[1:] if root else segments
        ir = parse(tail, groups)
        owner = ("the root's child " + ".".join(path) if path else "the root") if root else head
        words = ir.words.removeprefix("inside the forward: ").replace(" inside the forward", "")
        if ir.kind == "method":
            words = words.replace("the module's method", f"{owner}'s method")
        else:
            words = f"inside {owner}'s forward: " + words
        return dataclasses.replace(ir, text=text, words=words, module=path, scope_root=root)
    call = None
    nth = 0
    body = text
    if text.startswith("method:"):
        return _method(text, text)
    if text.startswith("call:"):
        scope, _, inner = text.partition(" > ")
        m = re.fullmatch(r"call:([A-Za-z_]+)(#[^.\s]*)?(.*)", scope)
        if not m or m.group(1) not in CALLS:
            raise ExprError(f"unknown interface call in '{scope}' (known: {', '.join('call:' + c for c in CALLS)})")
        call = m.group(1)
        if m.group(2) is not None:  # call:NAME#K: the K-th call of the interface in the forward (DiffLlama's two)
            if not re.fullmatch(r"#\d+", m.group(2)):
                raise ExprError(f"'{scope}': the K-th call of an interface is call:{call}#K, K a number "
                                f"(#0 the first call, #1 the second)", len("call:") + len(call))
            nth = int(m.group(2)[1:])
        if inner:
            if m.group(3):
                raise ExprError("write either call:NAME.args[...] / .output[...] or call:NAME > op:...")
            body = inner
        else:
            rest = m.group(3)
            sm = re.match(r"\.(args|output)", rest)
            if not sm:
                raise ExprError(f"'{text}': an interface call is read at .args[N] or .output")
            side = sm.group(1)
            access = _accessors(rest[sm.end():], len(scope) - len(rest) + sm.end())
            if side == "args" and (not access or not isinstance(access[0], int)):
                raise ExprError(f"'{text}': name the argument, e.g. .args[1]")
            what = "the arguments of" if side == "args" else "the output of"
            return ReadPoint("call", text, f"inside the forward: {what} {CALLS[call]}{_nth_words(nth)}"
                          f"{_access_words(access)}", side=SIDES[side], access=access, call=call, call_occurrence=nth)
    m = _OP.match(body)
    if m:
        access = _accessors(body[m.end():], m.end())
        op, k, side = m.group(1), int(m.group(2) or 0), m.group(3)
        where = f" inside {CALLS[call]}{_nth_words(nth)}" if call else " inside the forward"
        if side == "input" and not access:
            access = (0,)
        words = f"the {side} of {op} ({_ordinal(k)} call){where}{_access_words(access)}"
        return ReadPoint("op", text, words, side=SIDES[side], access=access, call=call, op=op, occurrence=k,
                         call_occurrence=nth)
    if call:
        raise ExprError(f"'{body}': inside a call, read an operation: op:NAME.input[N] or op:NAME.output")
    parts: list[str] = []
    pos = 0
    while True:
        m2 = _NAME.match(body, pos) or (_INDEX.match(body, pos) if parts else None)
        if not m2:
            raise ExprError(f"'{text}': expected a module name or input/output", pos)
        name = m2.group(0)
        pos = m2.end()
        if name in _SIDES:
            side = name
            break
        parts.append(name)
        if pos >= len(body) or body[pos] != ".":
            raise ExprError(f"'{text}': a module boundary ends in .input, .inputs or .output", pos)
        pos += 1
    if side == "args":
        raise ExprError(f"'{text}': .args belongs to an interface call (call:attention.args[N])")
    access = _accessors(body[pos:], pos)
    param = None
    if side == "input" and access and isinstance(access[0], str):
        param, access = access[0], access[1:]
    owner = f"the child module {'.'.join(parts)}'s" if parts else "the module's own"
    noun = {"input": "input", "inputs": "inputs (args, kwargs)", "output": "output"}[side]
    words = f"{owner} {noun}" + (f" {param}" if param else "") + _access_words(access)
    return ReadPoint("module", text, words, module=tuple(parts), side=SIDES[side], param=param, access=access)


def _nth_words(nth: int) -> str:
    """The words of ``call:NAME#K`` (nothing for the first call, the default)."""
    return f" ({_ordinal(nth)} call)" if nth else ""


def _method(text: str, inner: str) -> ReadPoint:
    m = _METHOD.match(inner)
    if not m:
        raise ExprError(f"'{inner}': a method call is read at method:NAME#K.args[N] or method:NAME#K.output")
    name, k, side = m.group(1), m.group(2) or "0", m.group(3)
    access = _accessors(inner[m.end():], m.end())
    if side == "args" and (not access or not isinstance(access[0], int)):
        raise ExprError(f"'{text}': name the argument, e.g. .args[1]")
    per_index = k == "i"
    which = "the call numbered by the block index" if per_index else f"the {_ordinal(int(k))} call"
    owner = "the module"
    what = "the arguments of" if side == "args" else "the output of"
    words = f"{what} {owner}'s method {name} ({which}){_access_words(access)}"
    return ReadPoint("method", text, words, side=SIDES[side], access=access, method=name,
                  occurrence=0 if per_index else int(k), per_index=per_index)


def _parse_up(text: str, groups: dict[str, str] | None) -> ReadPoint:
    """``^.`` (repeated): the read starts above the host, at a sibling's or the parent's boundary."""
    up, rest = 0, text
    while rest.startswith("^"):
        if not rest.startswith("^."):
            raise ExprError(f"'{text}': write ^. before the sibling's name (^.post_attention_layernorm.output)", text.find("^"))
        up, rest = up + 1, rest[2:]
    if rest.startswith(("fn:", "call:", "method:")):
        raise ExprError(f"'{text}': ^. names a module of the parent (^.NAME.output, ^.NAME > op:...) or an "
                        "operation of the parent's own forward (^.op:NAME#K.output); functions, calls and methods "
                        "are read in the host's own forward without ^.")
    ir = parse(rest, groups)
    parent = "the parent" if up == 1 else f"the host {up} levels up"
    if ir.kind == "op" and not ir.module and not ir.call:  # an operation of the parent's own forward
        return dataclasses.replace(ir, text=text, up=up, words=ir.words.replace(
            "inside the forward", f"inside {parent}'s own forward", 1))
    name = ".".join(ir.module)
    if ir.kind == "module" and ir.module:
        owner = f"the sibling module {name}'s" if up == 1 else f"the module {name}'s"
        words = ir.words.replace(f"the child module {name}'s", owner, 1) + ("" if up == 1 else f" ({name} is a child of {parent})")
    elif ir.kind == "module":
        words = ir.words.replace("the module's own", f"{parent} module's own", 1)
    elif ir.module:
        words = ir.words.replace(f"inside {name}'s", f"inside the sibling {name}'s" if up == 1 else
                                 f"inside {name}'s (a child of {parent})", 1)
    else:
        raise ExprError(f"'{text}': after ^. name a module (^.NAME > op:...)")
    return dataclasses.replace(ir, text=text, words=words, up=up)
