"""Render the site's pages from the atlas: each family's page (HTML and Markdown, from one page model), the
index with its search entries and the values x families matrix, status.html and llms.txt. Pure: text in memory."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..language.ir import Atlas, FamilyIR
from ..status import status
from . import cards, page_model, value_marks
from .search_index import search_script
from .templating import env


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
            native = cards.native_path(f, h.path)  # the module path with indices as [i] (transformer.h[i].attn)
            entries.append({"text": f"{h.cls} {host_label}" + (f" model.{native}" if native else ""), "name": h.cls,
                            "kind": "native class", "family": f.name, "where": host_label,
                            "href": f"{f.name}.html#{cards.host_anchor(h, f)}"})
            for v in h.values:
                anchor = cards.value_anchor(h, v, f)
                path = cards.nnsight_path(f, h.path, v)  # model.model.layers[i].self_attn.o_proj.input
                entries.append({"text": f"{v.name} {host_label}.{v.name}" + (f" {path}" if path else ""),
                                "name": v.name, "kind": "value", "family": f.name,
                                "where": f"{host_label} ({h.cls})", "href": f"{f.name}.html#{anchor}"})
        # the matrix's cell links the value on its first text host (then vision), with one mark per load
        for h in sorted(f.hosts, key=lambda h: h.path == "vision" or h.path.startswith("vision.")):
            for v in h.values:
                if v.name not in matrix[f.name] and v.missing is None:
                    matrix[f.name][v.name] = cards.value_anchor(h, v, f)
        marks[f.name] = value_marks.load_marks(f)
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
            "mark_words": value_marks.MARK_WORDS,
            "two_loads": {f.name for f in atlas.families if len(value_marks.loads(f)) > 1},
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
