"""What the site claims agrees with what each family's own page and spec say (issue 30): the index's
matrix per load, the trait tooltips, the config cells, the diagrams' parts and the search index.

Plain reads of the committed HTML in generated/docs (no browser)."""

from __future__ import annotations

import re
from functools import cache
from html import unescape

import pytest

from nnatlas.compiler import compile_atlas, default_root

ROOT = default_root()
DOCS = ROOT / "generated" / "docs"
FAMILIES = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml") if not p.stem.startswith("_"))


@cache
def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@cache
def _atlas():  # type: ignore[no-untyped-def]
    return compile_atlas(ROOT / "specs", ROOT)


def _family(name: str):  # type: ignore[no-untyped-def]
    return next(f for f in _atlas().families if f.name == name)


# ---- the matrix, per load, against each family page's support() tables ----

ROW = re.compile(r'<tr id="v-[^"]+"(?: class="(conditional|missing)")?>\s*<td><code>(?:⚠︎)?([A-Za-z0-9_]+)</code></td>'
                 r'\s*<td>.*?</td>\s*<td>(.*?)</td>', re.S)


def _page_marks(name: str) -> tuple[bool, dict[str, tuple[str, ...]]]:
    """(whether the page names an image-text load, value → (text-only mark, image-text mark)) as the
    family page's own rows say it: a value that needs or is served by the image-text load is not served
    on a text-only one; one no load serves is ○; one that needs another load ⚠︎; the rest ●."""
    html = _text(f"{name}.html")
    support = html[html.index('<section id="support"'):html.index('<section id="notes"')]
    rows: dict[str, list[tuple[str, str]]] = {}
    image = False
    for cls, value, what in ROW.findall(support):
        if cls == "missing":
            continue
        what = unescape(re.sub(r"<[^>]+>", " ", what))
        if "image-text load" in what:
            image = True
            pair = ("○", "●")
        elif "not served under any load" in what:
            pair = ("○", "○")
        elif cls == "conditional":
            pair = ("⚠︎", "⚠︎")
        else:
            pair = ("●", "●")
        rows.setdefault(value, []).append(pair)
    rank = {"●": 0, "⚠︎": 1, "○": 2}
    best = {v: tuple(min((p[k] for p in pairs), key=rank.__getitem__) for k in (0, 1)) for v, pairs in rows.items()}
    return image, best


def _matrix_cells() -> dict[tuple[str, str], str]:
    html = _text("index.html")
    matrix = html[html.index('<section id="matrix"'):]
    cells = {}
    for value, row in re.findall(r"<tr><td><code>([A-Za-z0-9_]+)</code></td>(.*?)</tr>", matrix, re.S):
        for fam, cell in re.findall(r'<td data-col-family="([a-z0-9_]+)">(.*?)</td>', row):
            cells[(value, fam)] = cell
    return cells


def test_the_matrix_marks_each_load_as_the_family_page_says_for_every_family() -> None:
    cells = _matrix_cells()
    values = {v for v, _ in cells}
    for name in FAMILIES:
        image, marks = _page_marks(name)
        for value in values:
            cell = cells[(value, name)]
            if value not in marks:
                assert cell == "", (name, value, cell)
                continue
            spans = re.findall(r"<span data-load=\"([a-z-]+)\">", cell)
            if image:
                got = tuple(re.findall(r'<span data-load="[a-z-]+">([^<]*)</span>', cell))
                assert spans == ["text-only", "image-text"], (name, value, cell)
                assert got == marks[value], (name, value, cell, marks[value])
            else:
                mark = re.sub(r"<[^>]+>", "", cell)
                assert mark == marks[value][0], (name, value, cell, marks[value])
    # the cases: the vision values are not served on a text-only load, on every family that has them
    for fam in ("qwen3_vl", "qwen3_5_text", "qwen2_vl", "llava", "gemma3"):
        for value in ("image_features", "patch_embeddings", "image_token_mask"):
            cell = cells[(value, fam)]
            assert '<span data-load="text-only">○</span><span data-load="image-text">●</span>' in cell, (fam, value)
    assert '<span class="mark none">○</span> not served on that load' in _text("index.html")


# ---- traits: a tooltip names only a mixer the family's own words name ----

MIXERS = ("DeltaNet", "Mamba", "short convolution", "short-convolution", "RG-LRU")


def test_trait_tooltips_name_only_the_mixers_the_family_has() -> None:
    for name in FAMILIES:
        f = _family(name)
        own = f"{f.title} {f.summary} {f.docstring}".lower()
        tips = re.findall(r'<li class="chip" tabindex="0">([^<]*)<span class="tip">([^<]*)</span>', _text(f"{name}.html"))
        assert [t for t, _ in tips] == [t for t, _ in f.traits], name
        for trait, tip in tips:
            for mixer in MIXERS:
                if mixer.lower() in unescape(tip).lower():
                    assert mixer.lower() in own, (name, trait, mixer)
    hybrid = dict(_family("bamba").traits)["Hybrid"]
    assert "DeltaNet" not in hybrid and "Gated DeltaNet" in dict(_family("qwen3_5_text").traits)


# ---- config cells: a value or "not served", never the exception a printout met ----

def test_no_page_shows_an_exception_in_place_of_a_config_value() -> None:
    pages = sorted(DOCS.glob("*.html")) + sorted(DOCS.glob("*.md"))
    assert len(pages) > 2 * len(FAMILIES)
    for page in pages:
        hit = re.search(r"error: [A-Z][A-Za-z]*", page.read_text(encoding="utf-8"))
        assert hit is None, (page.name, hit.group(0) if hit else "")
    vision = _text("qwen3_vl.html")
    row = re.search(r"<tr><td><code>model\.vision\.image_size</code></td><td><code>([^<]*)</code></td>(.*?)</tr>", vision)
    assert row is not None and "no one image size" in row.group(1)
    assert set(re.findall(r"<td>([^<]*)</td>", row.group(2))) == {"not served"}
    sizes = _text("index.html")
    mamba = re.search(r'<tr><td><a href="mamba\.html#sizes">mamba</a></td>(.*?)</tr>', sizes)
    assert mamba is not None and mamba.group(1).count("<td>not served</td>") == 3  # heads, kv heads, head_dim


def test_the_readout_note_names_nnatlas_own_call_not_another_librarys() -> None:
    # no page introduces nnterp: a stray mention of its project_on_vocab sat in qwen3_5_text's readout note
    for page in sorted(DOCS.glob("*.html")) + sorted(DOCS.glob("*.md")):
        assert "nnterp" not in page.read_text(encoding="utf-8"), page.name
    html = _text("qwen3_5_text.html")
    note = html.split("<h3>The readout is the plain projection</h3>", 1)[1].split("</article>", 1)[0]
    assert "model.unembed(x) is this projection" in " ".join(note.split())
