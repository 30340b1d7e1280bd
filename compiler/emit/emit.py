"""Render the resolved atlas into files: adapters, tests, pages. Pure: text in memory, no I/O.

What a spec says reaches generated Python only as literals (``repr``, ``pylit``) or as names
``compiler.names`` accepted (the resolver checks them at their file:line:col); the ``name``
filter checks each such name again as it is written, so a name that slipped past the resolver
stops the render instead of becoming code.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jinja2
from markupsafe import Markup

from nnatlas.spec import Condition, HostSpec, Identity, Layout, ReadPoint, ValueSpec, ViewOp

from ..language import names
from ..language.ir import Atlas, FamilyIR, ValueIR
from ..language.names import class_name
from ..status import status
from . import markdown, page_model

HEADER_RE = re.compile(r"sha256 ([0-9a-f]{64})")


class EmitError(ValueError):
    """Something the resolver should have refused reached a template (a bug, never written out)."""


def checked_name(text: Any) -> str:
    """``text`` if it may stand as a name in Python source, else EmitError."""
    bad = names.problem(text)
    if bad:
        raise EmitError(f"refusing to write {bad} into generated Python")
    return str(text)


def pylit(value: Any) -> str:
    """A deterministic Python literal: tuples for sequences, sorted-nothing dicts in given order."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise EmitError(f"no Python literal for {value!r}")
        return repr(value)
    if isinstance(value, list | tuple):
        inner = ", ".join(pylit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{pylit(k)}: {pylit(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


def dictlit(value: Any) -> str:
    """A JSON-like config mapping as a Python literal with lists (configs want lists)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{pylit(k)}: {dictlit(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dictlit(v) for v in value) + "]"
    return pylit(value)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("nnatlas.compiler.emit", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=jinja2.select_autoescape(["html.j2"], default_for_string=False, default=False),
    )
    env.filters["py"] = repr
    env.filters["pylit"] = pylit
    env.filters["dictlit"] = dictlit
    env.filters["ident"] = _ident
    env.filters["name"] = checked_name
    env.filters["docline"] = _docline
    env.tests["startingwith"] = lambda value, prefix: isinstance(value, str) and value.startswith(prefix)
    env.filters["md"] = markdown.render
    env.filters["json"] = script_json
    env.filters["cfgtext"] = page_model.config_text
    env.filters["mdtext"] = markdown.inline_text
    env.filters["mdcell"] = markdown.cell
    env.filters["mdcode"] = markdown.code_span
    env.filters["mdcodecell"] = markdown.code_cell
    env.filters["mdbody"] = markdown.body
    env.filters["mdinline"] = markdown.inline
    env.filters["cfglabel"] = page_model.config_label
    env.filters["params"] = page_model.param_text
    return env


def script_json(value: Any, compact: bool = False) -> Markup:
    """JSON safe inside <script>: no '<', '>' or '&' survive as such, so no '</script>' can close it.
    ``compact``: no spaces, and keys in the value's own order (search.js's packed rows)."""
    text = (json.dumps(value, ensure_ascii=True, separators=(",", ":")) if compact
            else json.dumps(value, sort_keys=True, ensure_ascii=True))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


_ENV: jinja2.Environment | None = None


def env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = _env()
    return _ENV


@dataclass
class _Fn:
    name: str
    args: str
    body: str


@dataclass(frozen=True)
class Ref:
    """A name of the generated module (a function it defines) standing where the runtime's data model
    holds that object: ``construct`` writes the name."""

    name: str

    def __call__(self, *args: Any) -> Any:
        raise EmitError(f"{self.name} is a name of the generated source; nothing calls it while generating")


def construct(obj: Any, names: Mapping[Any, str] | None = None, indent: int = 0,
              multiline: tuple[type, ...] = ()) -> str:
    """An object of the runtime's data model (``nnatlas.spec``: frozen dataclasses, tuples, mappings,
    literals) as the Python expression that builds it: required fields by position, the others by keyword
    where they differ from their default. ``names``: objects the module names once (a shared ``Layout``);
    a :class:`Ref` is written as its name. Instances of ``multiline`` classes take one line per field."""
    names = names or {}
    if isinstance(obj, Ref):
        return checked_name(obj.name)
    if isinstance(obj, Layout | Condition) and obj in names:
        return names[obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        args: list[str] = []
        inner = indent + 4 if isinstance(obj, multiline) else indent
        for name, has_default, default in _fields(type(obj)):
            value = getattr(obj, name)
            if not has_default:
                args.append(construct(value, names, inner, multiline))
            elif type(value) is not type(default) or value != default:
                args.append(f"{name}={construct(value, names, inner, multiline)}")
        return _call(type(obj).__name__, args, indent, isinstance(obj, multiline))
    if isinstance(obj, tuple | list):
        items = [construct(v, names, indent + 4, multiline) for v in obj]
        inline = f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if any("\n" in it for it in items) or (len(items) > 1 and len(inline) > 100):
            return _call("", items, indent, True)
        return inline
    if isinstance(obj, Mapping):
        return "{" + ", ".join(f"{pylit(k)}: {construct(v, names, indent, multiline)}" for k, v in obj.items()) + "}"
    return pylit(obj)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, bool, Any], ...]:
    """(name, whether it has a default, the default) of each field of a data-model class, once per class."""
    out: list[tuple[str, bool, Any]] = []
    for fld in dataclasses.fields(cls):
        if fld.default is not dataclasses.MISSING:
            out.append((fld.name, True, fld.default))
        elif fld.default_factory is not dataclasses.MISSING:
            out.append((fld.name, True, fld.default_factory()))
        else:
            out.append((fld.name, False, None))
    return tuple(out)


def _call(name: str, args: list[str], indent: int, multiline: bool) -> str:
    if not multiline:
        return f"{name}({', '.join(args)})"
    pad = " " * (indent + 4)
    return f"{name}(\n" + "".join(f"{pad}{a},\n" for a in args) + " " * indent + ")"


def value_spec(v: ValueIR, derive: str | None) -> ValueSpec:
    """The runtime's ``ValueSpec`` of a resolved value (its derive function named by ``derive``)."""
    if v.missing is not None:
        read = ReadPoint("missing", "", v.missing)
    elif v.derived is not None:
        assert derive is not None
        read = ReadPoint("derived", v.derived_text or "", v.words, deps=v.derived.names, derive=Ref(derive))
    else:
        assert v.read is not None
        read = v.read
    view = tuple(ViewOp(cast(Any, op), tuple(args)) for op, args in v.view)
    return ValueSpec(v.name, v.layout, v.meaning, read, view=view, needs=v.needs, readonly=v.readonly,
                     readonly_why=v.readonly_why, reached=v.reached, edit=cast(Any, v.edit), copy=v.copy,
                     at=f"{v.at[0]}:{v.at[1]}:{v.at[2]}" if v.at else "")


def _ident(text: str) -> str:
    """ASCII letters, digits and _ only (``\\W`` would keep non-ASCII letters and digits)."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")


def _docline(text: str) -> str:
    """Text for inside a triple-quoted docstring: printable ASCII, no quote or backslash."""
    return re.sub(r"[^ -~]|[\"\\]", "?", text)


class _Names:
    """Module-level function names, each given once (a later clash gets a numeric suffix)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, base: str) -> str:
        name, k = base, 2
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(checked_name(name))
        return name


def family_context(f: FamilyIR) -> dict[str, Any]:
    functions: list[_Fn] = []
    fn_name = _Names()
    shared: dict[Any, str] = {}  # each layout and condition, built once under a module-level name
    layouts: list[tuple[str, str]] = []
    conditions: list[tuple[str, str]] = []
    hosts = []
    for hi, h in enumerate(f.hosts):
        values = []
        for v in h.values:
            if v.layout not in shared:
                key = v.layout.name + ("_or_none" if v.layout.optional else "")
                shared[v.layout] = fn_name(f"_L_{_ident(key)}")
                layouts.append((shared[v.layout], construct(v.layout)))
            for c in (v.needs, v.reached):
                if c is not None and c not in shared:
                    shared[c] = fn_name(f"_C_{_ident(c.name)}")
                    conditions.append((shared[c], construct(c)))
            derive = None
            if v.derived is not None:
                derive = fn_name(f"_derive_{_ident(h.ident)}_{_ident(v.name)}")
                functions.append(_Fn(derive, "v: Any", v.derived.source))
            values.append(value_spec(v, derive))
        identities = []
        for k, ident in enumerate(h.identities):
            fn = fn_name(f"_identity_{_ident(h.ident)}_{k}")
            functions.append(_Fn(fn, "v: Any", f"({ident.lhs.source}, {ident.rhs.source})"))
            identities.append(Identity(ident.text, ident.terms, Ref(fn), ident.op, ident.atol, ident.rtol,
                                       at=f"{ident.at[0]}:{ident.at[1]}:{ident.at[2]}" if ident.at else ""))
        when_fn = None
        if h.when is not None:
            when_fn = fn_name(f"_when_{_ident(h.ident)}_{hi}")
            functions.append(_Fn(when_fn, "c: Any, i: int", h.when.source))
        spec = HostSpec(h.path, h.cls, tuple(values), tuple(identities), when=Ref(when_fn) if when_fn else None,
                        when_text=h.when_text if when_fn else None, kind=h.kind, dims=h.dims)
        hosts.append(construct(spec, shared, 4, multiline=(HostSpec, ValueSpec)))
    draw_fns: dict[str, str] = {}
    for d in f.tiny.draw:
        if d.expr is not None:
            draw_fns[d.name] = fn_name(f"_draw_{_ident(d.name)}")
            functions.append(_Fn(draw_fns[d.name], "c: Any", d.expr.source))
    return {
        "f": f,
        "classes": _classes(f),
        "functions": functions,
        "layouts": layouts,
        "conditions": conditions,
        "hosts": hosts,
        "trait_names": tuple(t for t, _ in f.traits),
        "rename": {k: v for k, v in f.rename},
        "function_groups": [{"name": g.name, "names": g.names, "words": g.words,
                             "route": dict(g.route) if g.route else None} for g in f.functions],
        "tiny_config": dict(f.tiny.config),
        "tiny_processor": dict(f.tiny.processor) if f.tiny.processor else None,
        "tiny_images": dict(f.tiny.images) if f.tiny.images else None,
        "draw_fns": draw_fns,
        "image_text": _image_text(f, functions, fn_name),
    }


def _image_text(f: FamilyIR, functions: list[_Fn], fn_name: _Names) -> dict[str, Any] | None:
    if f.tiny.image_text is None:
        return None
    it = dict(f.tiny.image_text)
    draws = []
    for name, choices, c in it["draw"]:
        if c is None:
            draws.append((name, pylit(choices), "None"))
        else:
            fn = fn_name(f"_draw_image_text_{_ident(name)}")
            functions.append(_Fn(fn, "c: Any", c.source))
            draws.append((name, "None", fn))
    return {"model_class": it["model_class"], "config_class": it["config_class"], "config": pylit(it["config"]),
            "draws": draws, "processor": pylit(dict(it["processor"])), "images": pylit(dict(it["images"])),
            "examples": it["examples"]}


def _classes(f: FamilyIR) -> list[dict[str, Any]]:
    paths = list(dict.fromkeys(h.path for h in f.hosts))
    out = []
    for path in paths:
        attrs: dict[str, str] = {}
        for h in f.hosts_at(path):
            for v in h.values:
                attrs.setdefault(v.name, "ValueSlot")
        prefix = "" if path == "model" else path + "."
        for child in paths:
            if child != path and child.startswith(prefix) and "." not in child[len(prefix):].replace("[i]", ""):
                rest = child[len(prefix):]
                if rest.endswith("[i]"):
                    attrs[rest[:-3]] = f"HostList[{class_name(child)}]"
                elif item := re.fullmatch(r"(\w+)\[\d+\]", rest):  # list items (self_attn[0], [1]): each its class
                    attrs.setdefault(item.group(1), "HostList[TypedHost]")
                elif "[i]" not in rest:
                    attrs[rest] = class_name(child)
        for std, _ in f.rename:
            if std.startswith(prefix) and "." not in std[len(prefix):] and "[" not in std[len(prefix):]:
                attrs.setdefault(std[len(prefix):], "TypedHost")
        if path == "model":  # the normalized config and the blocks of each kind of a hybrid stack
            for name, _, _ in f.config:
                attrs.setdefault(name, "Any")
            for kind in dict.fromkeys(h.kind for h in f.hosts if h.kind and h.when is not None):
                attrs.setdefault(f"{kind}_layers", "list[int]")
        hosts = f.hosts_at(path)
        doc = f"{path}: {', '.join(dict.fromkeys(h.cls for h in hosts))}" if hosts else path
        out.append({"name": class_name(path), "base": "TypedModel" if path == "model" else "TypedHost",
                    "attrs": list(attrs.items()), "doc": _docline(doc.replace('"', "'"))})
    # a class must be defined before it is named in an annotation string? (annotations are lazy)
    return out


def render_family(f: FamilyIR) -> str:
    return env().get_template("family.py.j2").render(**family_context(f))


def render_tests(f: FamilyIR) -> str:
    host_paths = tuple(dict.fromkeys(h.path for h in f.hosts))
    # a path's identities, one group per host spec (block kind): each group one test, its identities checked
    # together on each drawn case (T.check_identities), so a group's cases hold the kind its identities need
    identity_ids = []
    for path in host_paths:
        k = 0
        for h in f.hosts_at(path):
            if h.identities:
                identity_ids.append((path, tuple(range(k, k + len(h.identities)))))
            k += len(h.identities)
    writable, readonly, missing = [], [], []
    for h in f.hosts:
        for v in h.values:
            item = (h.path, v.name)
            if v.missing is not None:
                missing.append(item)
            elif v.readonly:
                readonly.append(item)
            elif (v.layout.dtype == "float" and v.edit == "logits" and item not in writable
                  and not (v.needs and v.needs.never)):
                writable.append(item)
    examples = [(n.title, k, src, n.load or ("image-text-to-text" if n.shared else None))
                for n in f.notes for k, src in enumerate(n.examples)]
    vision_paths = tuple(p for p in host_paths if p.startswith(("vision", "projector")))
    vision_identities = tuple(x for x in identity_ids if x[0] in vision_paths)
    vision_writable = tuple(x for x in writable if x[0] in vision_paths)
    vision_readonly = tuple(x for x in readonly if x[0] in vision_paths)
    if f.tiny.image_text is not None:  # the base tiny load has no vision encoder: those run on the second load
        host_paths = tuple(p for p in host_paths if p not in vision_paths)
        identity_ids = [x for x in identity_ids if x[0] not in vision_paths]
        writable = [x for x in writable if x[0] not in vision_paths]
        readonly = [x for x in readonly if x[0] not in vision_paths]
    # a pattern read inside eager attention on a text block: recomputed under sdpa / flex, checked against eager
    # under the loads the CPU tests run (nnatlas.testing.recomputed_pattern_loads): sdpa, and flex attention
    # (uncompiled) unless the family has attention sinks, which transformers refuses under flex on CPU
    cpu_flex = "Attention sinks" not in (name for name, _ in f.traits)  # nnatlas.testing.flex.REFUSED_ON_CPU
    # the hosts whose values are read at the experts (their identities run under every experts
    # implementation of the tiny spec; the other hosts' identities do not depend on it: the first only)
    expert_paths = tuple(dict.fromkeys(h.path for h in f.hosts for v in h.values if v.read is not None
                                       and (v.read.call == "experts" or "experts" in v.read.module)))
    recomputed = any(v.recomputed for h in f.hosts if h.path.startswith("layers[i]") for v in h.values) \
        and (f.attention is None or "sdpa" in f.attention or ("flex_attention" in f.attention and cpu_flex))
    return env().get_template("test_family.py.j2").render(
        f=f, recomputed=recomputed, host_paths=host_paths, identity_ids=tuple(identity_ids), writable=tuple(writable),
        expert_paths=expert_paths,
        readonly=tuple(readonly), missing=tuple(missing), examples=tuple(examples), vision_paths=vision_paths,
        vision_identities=vision_identities, vision_writable=vision_writable, vision_readonly=vision_readonly)


def page_context(f: FamilyIR, atlas: Atlas, printout: str | None = None) -> dict[str, Any]:
    from . import printouts

    head = printouts.parse_header(printout)
    model = page_model.PageModel(f, head.facts if head else None)
    notes = [{"id": model.uid(f"note-{n.title}"), "title": n.title, "body": n.body} for n in f.notes]
    papers = dict(atlas.papers)
    # a hub link for a name that is a hub id (org/name, or a bare legacy name), a paper link where one is recorded
    sizes = [{**r, "hub": r["name"] if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", r["name"]) else None,
              "paper": papers.get(r["name"])} for r in model.sizes()]
    return {"f": f, "atlas": atlas, "model": model, "stacks": model.stacks(), "hosts": model.hosts(),
            "checkpoints": model.checkpoints(), "printouts": printouts.body(printout) if printout else [],
            "notes": notes, "sizes": sizes, "coming_from": model.coming_from(),
            "sae_points": model.sae_points(), "image_text": model.image_text(), "tp": model.tensor_parallel()}


def render_page(f: FamilyIR, atlas: Atlas, printout: str | None = None,
                status_data: dict[str, Any] | None = None, context: dict[str, Any] | None = None,
                tests: str | None = None) -> str:
    """The family's HTML page; ``context``: its ``page_context`` when the caller has built it (render_pages);
    ``tests``: the digest of its generated tests now (``status.tests_digest``), for the badge's stale mark."""
    return env().get_template("page.html.j2").render(**(context or page_context(f, atlas, printout)),
                                                     badge=status.row(f, status_data, tests))


def render_page_md(f: FamilyIR, atlas: Atlas, printout: str | None = None, context: dict[str, Any] | None = None) -> str:
    return env().get_template("page.md.j2").render(**(context or page_context(f, atlas, printout)))


def render_pages(f: FamilyIR, atlas: Atlas, printout: str | None = None,
                 status_data: dict[str, Any] | None = None, tests: str | None = None) -> tuple[str, str]:
    """(the HTML page, the Markdown page), from one page model (the templates only read it)."""
    context = page_context(f, atlas, printout)
    return render_page(f, atlas, printout, status_data, context, tests), render_page_md(f, atlas, printout, context)


def _index_data(atlas: Atlas, printout_texts: dict[str, str] | None = None) -> dict[str, Any]:
    from . import printouts
    names, families_of = _value_families(atlas)
    matrix: dict[str, dict[str, str]] = {}
    marks: dict[str, dict[str, list[tuple[str, str]]]] = {}
    entries: list[dict[str, str]] = []
    sizes: list[dict[str, Any]] = []
    for f in atlas.families:
        text = (printout_texts or {}).get(f.name)
        head = printouts.parse_header(text)
        page = page_model.PageModel(f, head.facts if head else None)
        sizes.extend({"family": f.name, **r} for r in page.sizes())
        matrix[f.name] = {}
        for c in f.checkpoints:  # a checkpoint id finds its family (Qwen/Qwen3.5-0.8B)
            entries.append({"name": c.name, "kind": "checkpoint", "family": f.name, "where": "sizes",
                            "href": f"{f.name}.html#sizes"})
        for cls in f.classes:  # the classes a load builds (Qwen3_5ForConditionalGeneration)
            entries.append({"name": cls, "kind": "load class", "family": f.name, "where": "model",
                            "href": f"{f.name}.html#support"})
        for h in f.hosts:
            host_label = "model" if h.path == "model" else f"model.{h.path}"
            native = page_model.native_path(f, h.path)  # the module path with indices as [i] (transformer.h[i].attn)
            entries.append({"text": f"{h.cls} {host_label}" + (f" model.{native}" if native else ""), "name": h.cls,
                            "kind": "native class", "family": f.name, "where": host_label,
                            "href": f"{f.name}.html#{page_model.host_anchor(h, f)}"})
            for v in h.values:
                anchor = page_model.value_anchor(h, v, f)
                path = page_model.nnsight_path(f, h.path, v)  # model.model.layers[i].self_attn.o_proj.input
                entries.append({"text": f"{v.name} {host_label}.{v.name}" + (f" {path}" if path else ""),
                                "name": v.name, "kind": "value", "family": f.name,
                                "where": f"{host_label} ({h.cls})", "href": f"{f.name}.html#{anchor}"})
        # the matrix's cell links the value on its first text host (then vision), with one mark per load
        for h in sorted(f.hosts, key=lambda h: h.path == "vision" or h.path.startswith("vision.")):
            for v in h.values:
                if v.name not in matrix[f.name] and v.missing is None:
                    matrix[f.name][v.name] = page_model.value_anchor(h, v, f)
        marks[f.name] = page_model.load_marks(f)
        for note in f.notes:  # the notes' words are searched too (attn_implementation, sae, resid_post)
            entries.append({"text": f"{note.title} {note.body}", "name": note.title, "kind": "note", "family": f.name,
                            "where": "notes", "href": f"{f.name}.html#{page.uid(f'note-{note.title}')}"})
        for r in page.coming_from():
            entries.append({"text": f"{r['tl']} {r['nnsight']}", "name": r["tl"], "kind": f"is {r['nnatlas']}",
                            "family": f.name, "where": "TransformerLens", "href": f"{f.name}.html#{r['anchor']}"})
        for std, natives in f.rename:
            for n in natives:
                entries.append({"text": f"{std} {n}", "name": std, "kind": f"standard name of {n}", "family": f.name,
                                "where": "rename", "href": f"{f.name}.html#support"})
    traits = sorted({t for f in atlas.families for t, _ in f.traits})
    return {"atlas": atlas, "value_names": names, "matrix": matrix, "marks": marks,
            "mark_words": page_model.MARK_WORDS,
            "two_loads": {f.name for f in atlas.families if len(page_model.loads(f)) > 1},
            "families_of": families_of, "search_index": entries, "traits": traits, "sizes": sizes}


def _value_families(atlas: Atlas) -> tuple[list[str], dict[str, list[str]]]:
    """(every standard value name, sorted; value name -> the families serving it, in the atlas's order)."""
    families_of: dict[str, list[str]] = {}
    for f in atlas.families:
        for h in f.hosts:
            for v in h.values:
                if f.name not in families_of.setdefault(v.name, []):
                    families_of[v.name].append(f.name)
    return sorted(families_of), families_of


# search.js, packed (issue 30: 1.54 MB as one object per entry, its keys, family, page and the text's repeats in
# each): per family a list of rows, each a kind's letter and the fields the entry cannot be derived without;
# atlas.js's unpackSearch and unpack_search below rebuild the entries, and pack_search keeps a row only where
# it rebuilds its entry exactly (else the entry's fields as they are, the row "x").
#   c name                      checkpoint: where sizes, #sizes
#   l name                      load class: where model, #support
#   h cls label native anchor   native class: text "cls label[ model.native]", where label, #anchor
#   v name path                 value of the last h: text "name label.name[ path]", where "label (cls)",
#                               #v-{the h's anchor after host-}-name
#   n title body anchor         note: text "title body", where notes
#   t hook nnsight row          TransformerLens hook: text "hook nnsight", kind "is {row's label.name}",
#                               where TransformerLens, the v row's page (row: its index in the family's rows)
#   r std native                rename: text "std native", kind "standard name of native", where rename, #support
#   g title words page href     a section of the manual (family "manual"): text "title words", kind section, where page
#   x name text kind where href any other entry, as it is ("" text: the name)
def _unpack_row(page: str, row: list[Any], host: list[Any], made: list[dict[str, str]]) -> dict[str, str]:
    """One packed row's entry (``host``: the family's last h row; ``made``: the family's entries so far)."""
    k = row[0]
    if k == "c":
        return {"name": row[1], "kind": "checkpoint", "where": "sizes", "href": page + "sizes"}
    if k == "l":
        return {"name": row[1], "kind": "load class", "where": "model", "href": page + "support"}
    if k == "h":
        return {"name": row[1], "text": f"{row[1]} {row[2]}" + (f" model.{row[3]}" if row[3] else ""),
                "kind": "native class", "where": row[2], "href": page + row[4]}
    if k == "v":
        return {"name": row[1], "text": f"{row[1]} {host[2]}.{row[1]}" + (f" {row[2]}" if row[2] else ""),
                "kind": "value", "where": f"{host[2]} ({host[1]})",
                "href": page + "v-" + host[4].removeprefix("host-") + "-" + row[1], "label": host[2]}
    if k == "n":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": "note", "where": "notes", "href": page + row[3]}
    if k == "t":
        v = made[row[3]]
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": f"is {v['label']}.{v['name']}",
                "where": "TransformerLens", "href": v["href"]}
    if k == "r":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": f"standard name of {row[2]}",
                "where": "rename", "href": page + "support"}
    if k == "g":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": "section", "where": row[3], "href": row[4]}
    return {"name": row[1], "text": row[2] or row[1], "kind": row[3], "where": row[4], "href": row[5]}


def _entry(family: str, e: dict[str, str]) -> dict[str, str]:
    entry = {"family": family, **{key: val for key, val in e.items() if key != "label"}}
    if entry.get("text") == entry["name"]:
        del entry["text"]
    return entry


def unpack_search(packed: Mapping[str, list[list[Any]]]) -> list[dict[str, str]]:
    """The search entries from search.js's packed rows (what atlas.js's unpackSearch makes of them)."""
    out: list[dict[str, str]] = []
    for family, rows in packed.items():
        made: list[dict[str, str]] = []
        host: list[Any] = ["", "", "", "", ""]
        for row in rows:
            if row[0] == "h":
                host = row
            made.append(_unpack_row(f"{family}.html#", row, host, made))
        out.extend(_entry(family, e) for e in made)
    return out


def pack_search(entries: list[dict[str, str]]) -> dict[str, list[list[Any]]]:
    """search.js's packed rows for ``entries`` (each family's entries in one run, in their order); every row
    is checked to unpack to its entry, else it is kept whole (row "x")."""
    packed: dict[str, list[list[Any]]] = {}
    made: dict[str, list[dict[str, str]]] = {}  # family -> its rows unpacked (what a t row refers to)
    values: dict[str, dict[str, int]] = {}  # family -> a value's page anchor -> its row
    host: list[Any] = []
    for e in entries:
        family = e["family"]
        rows = packed.setdefault(family, [])
        page = f"{family}.html#"
        href = e["href"].removeprefix(page)
        kind, name, text = e["kind"], e["name"], e.get("text", e["name"])
        row: list[Any]
        if kind == "checkpoint":
            row = ["c", name]
        elif kind == "load class":
            row = ["l", name]
        elif kind == "native class":
            label = e["where"]
            native = text.removeprefix(f"{name} {label}").removeprefix(" model.")
            row = ["h", name, label, native, href]
        elif kind == "value" and host:
            row = ["v", name, text.removeprefix(f"{name} {host[2]}.{name}").removeprefix(" ")]
        elif kind == "note":
            row = ["n", name, text.removeprefix(f"{name} "), href]
        elif kind.startswith("is ") and href in values.get(family, {}):
            row = ["t", name, text.removeprefix(f"{name} "), values[family][href]]
        elif kind.startswith("standard name of "):
            row = ["r", name, kind.removeprefix("standard name of ")]
        elif kind == "section" and family == "manual":
            row = ["g", name, text.removeprefix(f"{name} "), e["where"], e["href"]]
        else:
            row = ["x", name, "", kind, e["where"], e["href"]]
        done = made.setdefault(family, [])
        back = _unpack_row(page, row, row if row[0] == "h" else host, done)
        if row[0] != "x" and _entry(family, back) != e:
            row = ["x", name, "" if text == name else text, kind, e["where"], e["href"]]
            back = _unpack_row(page, row, host, done)
        if row[0] == "h":
            host = row
        if row[0] == "v":
            values.setdefault(family, {})[href] = len(rows)
        rows.append(row)
        done.append(back)
    return packed


def search_script(entries: list[dict[str, str]]) -> str:
    """search.js: the packed entries as one compact JSON object, safe inside <script> (script_json)."""
    text = script_json(pack_search(entries), compact=True)
    head = ("/* Generated by nnatlas from specs/: the index's search entries, packed (atlas.js's unpackSearch), loaded "
            "on the search's first use. Do not edit: edit the specs, then run `make generate`. */\n")
    return f"{head}window.nnatlasSearchPacked = {text};\n"


def read_search_script(text: str) -> list[dict[str, str]]:
    """The entries a search.js holds (tests; the browser's are atlas.js's unpackSearch of the same rows)."""
    start = text.index("window.nnatlasSearchPacked = ") + len("window.nnatlasSearchPacked = ")
    return unpack_search(json.loads(text[start:].rstrip().rstrip(";")))


def render_index(atlas: Atlas, printout_texts: dict[str, str] | None = None,
                 status_data: dict[str, Any] | None = None, cookbook: bool = False,
                 tests: Mapping[str, str] | None = None, guides: Sequence[tuple[str, str]] = (),
                 guide_entries: Sequence[dict[str, str]] = ()) -> tuple[str, str, str]:
    """(the index, its search index ``search.js``, the values × families matrix page); ``cookbook``: the site
    has a cookbook page to link to (a checkout with docs/cookbook.md); ``guides``: (title, page) of each page of
    the manual (``compiler/emit/guide.py``), linked from the index, and ``guide_entries`` their sections, searched with
    the families' entries. The search index is a script the index loads on the search's first use (a script,
    not a fetch: pages opened from file:// may not fetch)."""
    data = _index_data(atlas, printout_texts)
    search = [{k: v for k, v in e.items() if k != "text" or v != e["name"]}
              for e in [*data.pop("search_index"), *guide_entries]]
    rows = status.page_rows(atlas, status_data, tests)
    page = env().get_template("index.html.j2").render(**data, cookbook=cookbook, guides=list(guides), **rows)
    matrix = env().get_template("matrix.html.j2").render(**data, **rows)
    return page, search_script(search), matrix


def render_status(atlas: Atlas, status_data: dict[str, Any] | None = None, tests: Mapping[str, str] | None = None) -> str:
    """status.html; ``tests``: family → the digest of its generated tests now, for the stale marks."""
    return env().get_template("status.html.j2").render(atlas=atlas, **status.page_rows(atlas, status_data, tests))


def render_llms(atlas: Atlas, guides: Sequence[tuple[str, str]] = ()) -> str:
    """llms.txt; ``guides``: (title, page) of each page of the manual."""
    names, families_of = _value_families(atlas)  # all it shows of the index
    return env().get_template("llms.txt.j2").render(atlas=atlas, value_names=names, families_of=families_of,
                                                    guides=list(guides))


def render_registry(atlas: Atlas) -> str:
    return env().get_template("families_init.py.j2").render(atlas=atlas)


def render_tests_conftest(atlas: Atlas) -> str:
    """The generated tests' conftest (one torch thread), headed with its template's sha256."""
    source = env().loader.get_source(env(), "tests_conftest.py.j2")[0]  # type: ignore[union-attr]
    return env().get_template("tests_conftest.py.j2").render(sha256=hashlib.sha256(source.encode()).hexdigest())
