"""The notebook views (_repr_html_) of a model, its support() and a cache show what their text printouts show, row for
row (read back out of the HTML here), with every string escaped."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest

import nnatlas
from nnatlas.testing import build
from nnatlas.tree.describe import Row, Support


class Cells(HTMLParser):
    """The text of every <td>/<th>, row by row, and of every <pre>."""

    def __init__(self, page: str):
        super().__init__()
        self.rows: list[list[str]] = []
        self.pre: list[str] = []
        self._cell: list[str] | None = None
        self._in_pre = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "pre":
            self._in_pre = True
            self.pre.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif self._in_pre:
            self.pre[-1] += data


@pytest.fixture(scope="module")
def hybrid() -> nnatlas.AtlasModel:
    return build("qwen3_5_text")  # blocks of two kinds


def test_the_support_view_holds_the_printouts_rows(hybrid: nnatlas.AtlasModel) -> None:
    found = hybrid.support()
    cells = Cells(found._repr_html_()).rows
    assert cells[0] == ["host", "class", "", "value", "layout", "note"]
    assert len(cells) - 1 == len(found.rows)
    printed = repr(found).splitlines()
    for r, row in zip(found.rows, cells[1:]):
        host, cls, mark, value, layout, note = row
        assert (host, cls, value, layout) == (r.host, r.cls, r.value, r.layout)
        assert f"  {mark} {value:<26} {layout}{'  ' + note if note else ''}" in printed  # the same line, in the text
    assert any(row[2] == "⚠︎" and row[5] for row in cells[1:])  # a conditional or missing value says why


def test_the_cache_and_model_views_hold_the_printouts(hybrid: nnatlas.AtlasModel) -> None:
    cache = hybrid.cache("the eiffel tower", values=["layer_output", "mlp.mlp_output"], layers=[0, 3])
    cells = Cells(cache._repr_html_()).rows
    text = repr(cache).splitlines()
    assert cells[0] == ["value", "shape", "layout"] and len(cells) - 1 == len(cache) == len(text) - 1
    for (path, shape, layout), line in zip(cells[1:], text[1:]):
        assert line == f"  {path}: {shape}  {layout}" and shape.startswith(f"{tuple(cache[path].shape)} float32")

    page = Cells(hybrid._repr_html_())
    facts = {row[0]: row[1] for row in page.rows if len(row) == 2}
    assert facts["family"] == "qwen3_5_text" and facts["class"] == type(hybrid.native).__name__
    assert facts["attention"] == hybrid.config._attn_implementation and facts["blocks"] == str(hybrid.num_layers)
    blocks = [row for row in page.rows if len(row) == 3]
    kinds = hybrid.layer_kinds
    assert blocks[0] == ["blocks", "class", "kind"]
    expanded = []
    for span, cls, kind in blocks[1:]:
        lo, _, hi = span.partition("-")
        expanded += [(cls, kind)] * (int(hi or lo) - int(lo) + 1)
    assert expanded == [(type(layer._module).__name__, kinds[i]) for i, layer in enumerate(hybrid.layers)]
    assert len(blocks) - 1 < hybrid.num_layers  # runs are folded, as print(model) folds them
    assert page.pre == [repr(hybrid)]  # the printout itself, folded below


def test_the_views_escape_what_they_show() -> None:
    nasty = "</td><script>alert(1)</script>"
    found = Support(nasty, [Row("layers[0]", nasty, "layer_output", "Residual", "unavailable", nasty, True)])
    page = found._repr_html_()
    assert "<script>" not in page and html.escape(nasty) in page
    assert Cells(page).rows[1] == ["layers[0]", nasty, "⚠︎", "layer_output", "Residual", nasty]
