"""The spec language reference (docs/spec.md and the site's spec.html), generated from the code.

Nothing here describes the language by hand where the code can: every key, its value form,
default and meaning come from the pydantic models (``models.py``: walked from ``FamilyRaw`` and
``Vocabulary``, so a field or a model added there appears here), the read-point grammar from
``readpoint``'s docstring, merging from ``resolve.merge``'s docstrings, presets from ``presets.PRESETS``,
and the expression whitelist from the tables of ``expr`` (the same tables the compiler checks).
"""

from __future__ import annotations

import inspect
import re
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

from markupsafe import Markup
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ..language import expr, models, presets, readpoint
from ..language.ir import REQUIRED_CONFIG
from ..language.presets import PRESETS
from ..resolve import merge
from . import markdown

SOURCES = ("compiler/language/models.py", "compiler/language/readpoint.py", "compiler/resolve/merge.py", "compiler/language/presets.py", "compiler/language/expr.py")
PATH = "docs/spec.md"
PAGE = "generated/docs/spec.html"

# (the file, the root model, where its keys sit) for each kind of spec file this module knows;
# ``files()`` adds every other model of models.py that no model refers to (a new kind of file)
FILES: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("specs/FAMILY.yaml", models.FamilyRaw, ""),
    ("specs/_vocabulary.yaml", models.Vocabulary, ""),
    ("specs/_notes.yaml", models.NoteRaw, "NAME[n]."),
)


def all_models() -> list[type[BaseModel]]:
    """Every spec model defined in models.py, in the order it defines them."""
    return [m for m in vars(models).values() if isinstance(m, type) and issubclass(m, BaseModel)
            and m.__module__ == models.__name__ and m is not models.Strict]


def files() -> list[tuple[str, type[BaseModel], str]]:
    """FILES, then each model no other model refers to, under the file its docstring names."""
    out = list(FILES)
    reached = {m for _, root, prefix in out for m, _ in walk(root, prefix)}
    referred = {sub for m in all_models() for info in m.model_fields.values() for sub in _models_in(info.annotation)}
    for model in all_models():
        if model in reached or model in referred:
            continue
        named = re.search(r"specs/[A-Za-z0-9_<>/.-]+\.yaml", inspect.getdoc(model) or "")
        out.append((named.group(0) if named else model_title(model), model, ""))
        reached |= {m for m, _ in walk(model)}
    return out


@dataclass
class Table:
    head: tuple[str, ...]
    rows: list[tuple[str, ...]]


@dataclass
class Section:
    title: str
    anchor: str
    level: int = 2
    blocks: list[tuple[str, Any]] = field(default_factory=list)  # ("p", text) | ("code", text) | ("table", Table)

    def p(self, text: str) -> Section:
        self.blocks.append(("p", rst(" ".join(text.split()))))
        return self

    def code(self, text: str) -> Section:
        self.blocks.append(("code", text.rstrip("\n")))
        return self

    def table(self, head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Section:
        self.blocks.append(("table", Table(head, [tuple(rst(" ".join(c.split())) for c in r) for r in rows])))
        return self


def rst(text: str) -> str:
    """The docstrings' ``code`` as Markdown's `code`."""
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---- the models -------------------------------------------------------------------------------

def _models_in(ann: Any) -> list[type[BaseModel]]:
    """The models a field's type mentions, in order."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    out: list[type[BaseModel]] = []
    for a in get_args(ann):
        out += [m for m in _models_in(a) if m not in out]
    return out


def type_text(ann: Any) -> str:
    """A field's value form in words: ``string or list of string``, ``mapping NAME → Host``."""
    origin = get_origin(ann)
    if origin is typing.Annotated:
        return type_text(get_args(ann)[0])
    if ann is type(None) or ann is None:
        return "null"
    simple = {str: "string", int: "integer", float: "number", bool: "true or false", Any: "any YAML value"}
    if ann in simple:
        return simple[ann]
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"{model_title(ann)}"
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(type_text(a) for a in get_args(ann)))
    if origin is Literal:
        return " or ".join(repr(a) if a is not None else "null" for a in get_args(ann))
    if origin is list:
        return f"list of ({type_text(get_args(ann)[0])})" if " or " in type_text(get_args(ann)[0]) \
            else f"list of {type_text(get_args(ann)[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_text(a) for a in get_args(ann)) + "]"
    if origin is dict:
        key, value = get_args(ann)
        return f"mapping of NAME → {type_text(value)}" if type_text(key) == "string" else f"mapping {type_text(key)} → {type_text(value)}"
    return str(ann)


def model_title(model: type[BaseModel]) -> str:
    return model.__name__.removesuffix("Raw")


def _default(info: Any) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default_factory() if info.default is PydanticUndefined else info.default  # type: ignore[misc]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, str):
        return value
    return repr(value)


def field_rows(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(key, value form, default, meaning) for each field, the YAML key as written (aliases: class, copy)."""
    rows = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        rows.append((key, type_text(info.annotation), _default(info), info.description or ""))
    return rows


def walk(root: type[BaseModel], prefix: str = "") -> list[tuple[type[BaseModel], str]]:
    """Every model reachable from ``root``, breadth first, with the key path where it first appears."""
    seen: dict[type[BaseModel], str] = {root: prefix.rstrip(".") or "(top level)"}
    todo = [(root, prefix)]
    while todo:
        model, where = todo.pop(0)
        for name, info in model.model_fields.items():
            key = info.alias or name
            path = where + key + _container_suffix(info.annotation)
            for sub in _models_in(info.annotation):
                if sub not in seen:
                    seen[sub] = path
                    todo.append((sub, path + "."))
    return list(seen.items())


def _container_suffix(ann: Any) -> str:
    origin = get_origin(ann)
    if origin is typing.Annotated:
        return _container_suffix(get_args(ann)[0])
    if origin in (Union, types.UnionType):
        for a in get_args(ann):
            suffix = _container_suffix(a)
            if suffix:
                return suffix
        return ""
    if origin is dict:
        return ".NAME" + _container_suffix(get_args(ann)[1])
    if origin is list:
        return "[n]" + _container_suffix(get_args(ann)[0])
    return ""


def model_sections(root: type[BaseModel], file: str, prefix: str = "") -> list[Section]:
    out = []
    for model, where in walk(root, prefix):
        title = f"{model_title(model)}" + (f" · `{where}`" if model is not root else f" · {file}")
        sec = Section(title, anchor(f"{file}-{model.__name__}"), level=3)
        doc = inspect.getdoc(model)
        if doc and doc != inspect.getdoc(BaseModel) and not doc.startswith("!!! abstract"):
            sec.p(doc)
        sec.table(("key", "value", "default", "meaning"),
                  [(f"`{key}`", form, default, meaning) for key, form, default, meaning in field_rows(model)])
        if model is models.FamilyRaw:
            sec.p("The config entries every family has (here, in a base, or from a preset): "
                  + ", ".join(f"`{k}`" for k in REQUIRED_CONFIG) + ".")
        out.append(sec)
    return out


# ---- the rest of the language ----------------------------------------------------------------------

def _docstring(obj: Any) -> str:
    return inspect.getdoc(obj) or ""


def _ops(table: dict[Any, str]) -> str:
    return " ".join(f"`{v}`" for v in table.values())


def expression_sections() -> list[Section]:
    intro = Section("Expressions", "expressions")
    for para in _docstring(expr).split("\n\n")[:2]:
        intro.p(para)
    intro.p("Where each kind of expression is written, and what its names are:")
    intro.table(("where", "compiled by", "names are"), [
        (f"`{where}`", f"`expr.{fn.__name__}`", (_docstring(fn).splitlines() or [""])[0])
        for where, fn in (("hosts.PATH.identities", expr.compile_identity), ("values: {derived: ...}", expr.compile_derived),
                          ("config", expr.compile_config), ("when", expr.compile_when), ("view", expr.parse_view))])
    intro.p(f"Operators: {_ops(expr._BINOPS)}, unary `-` and `~`; comparisons {_ops(expr._CMPOPS)} (one per "
            "comparison); indexing and slicing (`x[:, -1]`, `x[..., :rotary_dim]`); lists `[a, b]`. Config expressions "
            "and block conditions also take `and`, `or`, `not`, `a if c else b` and string literals. Attribute "
            "chains name values (`mlp.mlp_output`, `layers[i+1].layer_input`, `model.logits`); methods, lambdas, "
            "comprehensions, dunder names and every function not listed below are refused with the list of allowed ones.")
    funcs = Section("Functions of identities and derived values", "functions", level=3)
    funcs.p("The one whitelist (`nnatlas.spec.FUNCTIONS`); each compiles to `nnatlas.trace.expressions.NAME`. Keyword arguments are "
            "accepted only where the signature shows them.")
    funcs.table(("function", "computes"), [(f"`{f.signature}`", f.doc) for f in expr.FUNCTIONS.values()])
    config = Section("Functions of config expressions and block conditions", "config-functions", level=3)
    config.table(("function", "computes"), [(f"`{f.signature}`", f.doc) for f in expr.CONFIG_FUNCTIONS.values()])
    views = Section("Views", "views", level=3)
    views.p("A value's `view:` is a chain of these calls, `unflatten(-1, [num_heads, head_dim]).transpose(1, 2)`; "
            "arguments are integers, config entries, `batch` / `seq` (bound per call), or lists of them.")
    views.table(("view", "does"), [(f"`{f.signature}`", f.doc) for f in expr.VIEW_OPS.values()])
    return [intro, funcs, config, views]


READ_EXAMPLES = (
    "output[0]", "output.logits", "input.input_ids", "norm.output", "input_layernorm.0.output", "o_proj.input[0]", "call:attention.args[1]",
    "call:attention.output[0]", "call:attention > op:softmax.input[0]", "call:attention#1.output[0]",
    "call:attention#1 > op:softmax.output", "op:mul#2.output", "router > op:linear.output",
    "experts > call:experts > op:view.output", "model.model > op:masked_scatter.input[2]",
    "method:_deepstack_process#i.args[2]", "fn:delta_rule.args[0]", "fn:delta_rule.kwargs.g",
    "fn:delta_rule.output[1]", "fn:delta_rule.step.output[1]", "fn:delta_rule.steps.output[1]",
    "^.post_attention_layernorm.output", "^.op:mul#0.output",
)
KIND_WORDS = {
    "module": "a module boundary (the host's or a child's input or output)",
    "call": "an interface call (transformers' attention or experts interface)",
    "op": "a torch operation inside a forward or a call (op:NAME#K, the K-th)",
    "method": "a call of one of the module's own methods",
    "fn": "a module-level function of the modeling module",
}


def readpoint_section() -> Section:
    doc = _docstring(readpoint)
    first, _, rest = doc.partition("\n\n")
    sec = Section("Read points", "read-points").p(first)
    grammar, _, after = rest.partition("\n\n")
    sec.code(textwrap.dedent(grammar))
    for para in after.split("\n\n"):
        if para.strip() and "nnatlas.spec" not in para:
            sec.p(para)
    sec.p("Each read point is of one kind, which decides how the runtime serves it:")
    sec.table(("kind", "reads"), [(f"`{k}`", v) for k, v in KIND_WORDS.items()])
    sec.p("Examples, each parsed here by the compiler (`readpoint.parse`), with its kind and the words the pages "
          "show for it (`fn:delta_rule` is a group declared under `functions:`):")
    groups = {"delta_rule": "the delta-rule kernel"}
    rows = []
    for example in READ_EXAMPLES:
        ir = readpoint.parse(example, groups)
        rows.append((f"`{example}`", f"`{ir.kind}`", ir.words))
    sec.table(("read point", "kind", "the page says"), rows)
    sec.p("Interface calls a read point may name after `call:`:")
    sec.table(("call", "is"), [(f"`call:{k}`", v) for k, v in readpoint.CALLS.items()])
    return sec


def extends_section() -> Section:
    sec = Section("extends: merging a family over its bases", "extends")
    for fn in (merge.extends_chain, merge.merge):
        for para in _docstring(fn).split("\n\n"):
            sec.p(para.replace("``", "`"))
    return sec


def presets_section() -> Section:
    sec = Section("Presets", "presets")
    sec.p(_docstring(presets).replace("``", "`"))
    sec.table(("preset", "means", "fills"), [(f"`{name}`", p.doc, ", ".join(f"`{k}`" for k, _ in p.reasons))
                                             for name, p in PRESETS.items()])
    return sec


def sections() -> list[Section]:
    out = [Section("The spec language", "the-spec-language").p(
        "One YAML file per model family in `specs/`, beside the shared vocabulary `specs/_vocabulary.yaml` and "
        "the shared notes `specs/_notes.yaml` and `specs/_papers.yaml` (each recorded checkpoint's arXiv id, "
        "`CHECKPOINT: \"2310.06825\"`, or `CHECKPOINT: {none: why}`: the pages link the paper and the hub page). Unknown keys are errors; every problem is reported at once as "
        "`specs/FILE.yaml:LINE:COL: message`, and nothing is written. `nnatlas new FAMILY --from BASE` writes a "
        "starting spec that extends BASE; `make generate` compiles the specs; `make test` runs what they generate.")
        .table(("file", "holds"), [(f"`{file}`", model_title(model) + (" (a list per `NAME`)" if prefix else ""))
                                   for file, model, prefix in files()])]
    for file, model, prefix in files():
        head = Section(f"{file}", anchor(file))
        if prefix:
            head.p("Groups of notes written once: `NAME: [ {title, body, load}, ... ]`; a family names a group with "
                   "`notes: [{shared: NAME}]`.")
        out.append(head)
        out += model_sections(model, file, prefix)
    out.append(readpoint_section())
    out += expression_sections()
    out.append(extends_section())
    out.append(presets_section())
    return out


# ---- rendering -----------------------------------------------------------------------------------

def header() -> str:
    return (f"<!-- Generated by nnatlas from {', '.join(SOURCES)}. Do not edit: change the code or its "
            "descriptions, then run `make generate`. -->")


def render_md() -> str:
    lines = [header(), ""]
    for sec in sections():
        lines += [f"{'#' * sec.level} {sec.title}", ""]
        for kind, body in sec.blocks:
            if kind == "p":
                lines += [_md_text(body), ""]
            elif kind == "code":
                lines += ["```", body, "```", ""]
            else:
                lines.append("| " + " | ".join(body.head) + " |")
                lines.append("|" + "|".join("---" for _ in body.head) + "|")
                for row in body.rows:
                    lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
                lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _md_text(text: str) -> str:
    """HTML inert outside `code` spans (GitHub shows a code span's text as it is)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                   for p in parts)


def _md_cell(text: str) -> str:
    """A table cell: like a paragraph, and pipes escaped (in `code` spans too)."""
    return _md_text(text).replace("|", "\\|")


def render_html() -> str:
    from .templating import env

    return env().get_template("spec.html.j2").render(sections=sections(), header=header(), inline=_inline_html)


def _inline_html(text: str) -> Markup:
    """`code` and **bold** in a spec-reference text, everything else escaped."""
    return Markup(markdown._inline(text))  # noqa: S704 - _inline escapes every piece of text it emits
