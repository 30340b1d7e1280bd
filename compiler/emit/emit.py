"""Render a resolved family into its generated Python: the typed adapter (``render_family``), its tests
(``render_tests``), the families' registry and the tests' conftest. Pure: text in memory, no I/O. The literals and
names written are :mod:`.pysource`'s; the site's pages are :mod:`.pages`'."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, cast

from nnatlas.spec import HostSpec, Identity, ReadPoint, ValueSpec, ViewOp

from ..language.ir import Atlas, FamilyIR, ValueIR
from ..language.names import class_name
from .pysource import Ref, checked_name, construct, docline, identifier, pylit
from .templating import env


@dataclass
class _Fn:
    name: str
    args: str
    body: str


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
                shared[v.layout] = fn_name(f"_L_{identifier(key)}")
                layouts.append((shared[v.layout], construct(v.layout)))
            for c in (v.needs, v.reached):
                if c is not None and c not in shared:
                    shared[c] = fn_name(f"_C_{identifier(c.name)}")
                    conditions.append((shared[c], construct(c)))
            derive = None
            if v.derived is not None:
                derive = fn_name(f"_derive_{identifier(h.ident)}_{identifier(v.name)}")
                functions.append(_Fn(derive, "v: Any", v.derived.source))
            values.append(value_spec(v, derive))
        identities = []
        for k, ident in enumerate(h.identities):
            fn = fn_name(f"_identity_{identifier(h.ident)}_{k}")
            functions.append(_Fn(fn, "v: Any", f"({ident.lhs.source}, {ident.rhs.source})"))
            identities.append(Identity(ident.text, ident.terms, Ref(fn), ident.op, ident.atol, ident.rtol,
                                       at=f"{ident.at[0]}:{ident.at[1]}:{ident.at[2]}" if ident.at else ""))
        when_fn = None
        if h.when is not None:
            when_fn = fn_name(f"_when_{identifier(h.ident)}_{hi}")
            functions.append(_Fn(when_fn, "c: Any, i: int", h.when.source))
        spec = HostSpec(h.path, h.cls, tuple(values), tuple(identities), when=Ref(when_fn) if when_fn else None,
                        when_text=h.when_text if when_fn else None, kind=h.kind, dims=h.dims)
        hosts.append(construct(spec, shared, 4, multiline=(HostSpec, ValueSpec)))
    draw_fns: dict[str, str] = {}
    for d in f.tiny.draw:
        if d.expr is not None:
            draw_fns[d.name] = fn_name(f"_draw_{identifier(d.name)}")
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
            fn = fn_name(f"_draw_image_text_{identifier(name)}")
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
                    "attrs": list(attrs.items()), "doc": docline(doc.replace('"', "'"))})
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


def render_registry(atlas: Atlas) -> str:
    return env().get_template("families_init.py.j2").render(atlas=atlas)


def render_tests_conftest(atlas: Atlas) -> str:
    """The generated tests' conftest (one torch thread), headed with its template's sha256."""
    source = env().loader.get_source(env(), "tests_conftest.py.j2")[0]  # type: ignore[union-attr]
    return env().get_template("tests_conftest.py.j2").render(sha256=hashlib.sha256(source.encode()).hexdigest())
