"""Finding things and reading on a phone (issue 17): notes and hook names in the search, the trait
filter's clear button, a skip link and a table of contents, copy buttons and highlighting, the
matrix's legend and sticky header, the coming-from filter, and the pinned card on a phone."""

from __future__ import annotations

from html import unescape
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser



def _search(page: Any, query: str) -> None:
    """Type a query and wait for its results: the search is debounced, its entries load on first use."""
    page.fill("#search", query)
    page.wait_for_function("q => document.getElementById('results').dataset.query === q", arg=query.strip().lower())

def _open(page: Any, path: Path) -> None:
    page.goto(path.as_uri())
    page.wait_for_load_state("load")


def _families(page: Any) -> list[str]:
    shown = page.locator("li.family:not([hidden])")
    return [shown.nth(i).get_attribute("data-family") for i in range(shown.count())]


def test_the_search_finds_words_of_the_notes_and_transformer_lens_hooks(page: Any, real_site: Path) -> None:
    _open(page, real_site / "index.html")
    assert page.evaluate("window.nnatlasSearch === undefined")  # the entries load on the search's first use
    results = page.locator("#results")
    _search(page, "attn_implementation")
    assert "note" in results.inner_text() and len(_families(page)) >= 3
    _search(page, "sae")
    assert "qwen3_5_text" in _families(page)
    assert results.locator("a[href^='qwen3_5_text.html#note-']").count() >= 1
    _search(page, "resid_post")
    assert results.locator("li").count() >= 1 and "qwen3_5_text" in _families(page)
    # real names (issue 30): a hook with its block number, module paths with indices, checkpoint ids
    for query, family, text in (("blocks.0.attn.hook_pattern", "llama", "is model.layers[i].self_attn.attention_probabilities"),
                                ("model.model.layers[0].self_attn.o_proj", "llama", "attention_premix"),
                                ("transformer.h[0].attn", "gpt2", "GPT2Attention"),
                                ("Qwen/Qwen3.5-0.8B", "qwen3_5_text", "checkpoint"),
                                ("openai-community/gpt2", "gpt2", "checkpoint")):
        _search(page, query)
        assert family in _families(page), query
        assert text in results.locator(f"li:has(a[href^='{family}.html'])").first.inner_text(), query
    _search(page, "blocks.{i}.hook_resid_post")
    assert len(_families(page)) == page.locator("li.family").count()  # every family serves it
    href = results.locator("a").first.get_attribute("href")
    results.locator("a").first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(href) and page.locator(":target").count() == 1
    assert page.errors == [] and page.requests == []


def test_the_trait_filter_has_a_clear_button(page: Any, real_site: Path) -> None:
    _open(page, real_site / "index.html")
    total = len(_families(page))
    page.click("button.trait-filter[data-trait='Hybrid']")
    page.click("button.trait-filter[data-trait='Mixture of experts']")
    _search(page, "router")
    assert len(_families(page)) < total
    page.click("#clear-filters")
    assert len(_families(page)) == total
    assert page.locator("button.trait-filter[aria-pressed='true']").count() == 0
    assert page.input_value("#search") == ""
    assert page.errors == []


def test_a_skip_link_and_a_table_of_contents_on_a_long_page(page: Any, real_site: Path) -> None:
    _open(page, real_site / "qwen3_5_text.html")
    page.keyboard.press("Tab")
    focused = page.evaluate("() => [document.activeElement.className, document.activeElement.getAttribute('href')]")
    assert focused == ["skip", "#main"]
    box = page.locator("a.skip").bounding_box()
    assert box is not None and box["x"] >= 0 and box["y"] >= 0  # on screen when focused
    page.keyboard.press("Enter")
    assert page.url.endswith("#main")
    toc = page.locator("nav.toc")
    notes = page.locator("#notes article.note")
    assert notes.count() >= 10
    assert toc.locator("ol.toc-notes li a").count() == notes.count()
    for target in ("#block", "#vision", "#sizes", "#coming-from", "#support", "#config", "#notes"):
        assert toc.locator(f"a[href='{target}']").count() == 1, target
    toc.locator("ol.toc-notes li a").nth(3).click()
    assert page.locator("article.note:target").count() == 1
    assert page.errors == []


def test_code_blocks_have_a_copy_button_and_python_is_highlighted(page: Any, real_site: Path) -> None:
    _open(page, real_site / "qwen3_5_text.html")
    code = page.locator("#notes pre code.language-python").first
    highlighted = code.locator("span.tok-keyword, span.tok-string, span.tok-comment, span.tok-number")
    assert highlighted.count() > 0
    assert page.locator("#notes code.language-python span.tok-keyword", has_text="with").count() >= 1
    assert page.locator("#notes code.language-python span.tok-comment").count() >= 1
    source = page.evaluate("() => document.querySelector('#notes pre code.language-python').textContent")
    # the text is the note's own: highlighting wraps tokens, it changes no character
    html = (real_site / "qwen3_5_text.html").read_text(encoding="utf-8")
    notes = html[html.index('<section id="notes"'):]
    start = notes.index('<code class="language-python">') + len('<code class="language-python">')
    assert source == unescape(notes[start:notes.index("</code>", start)])
    page.evaluate("""() => { window.__copied = null;
        Object.defineProperty(navigator, 'clipboard', {configurable: true,
          value: {writeText: (t) => { window.__copied = t; return Promise.resolve(); }}}); }""")
    button = page.locator("#notes .code-wrap").first.locator("button.copy")
    assert button.inner_text() == "copy"
    button.click()
    page.wait_for_function("() => window.__copied !== null")
    first_pre = page.evaluate("() => document.querySelector('#notes .code-wrap pre').textContent")
    assert page.evaluate("() => window.__copied") == first_pre
    assert button.inner_text() == "copied"
    assert page.locator("main pre").count() == page.locator("main .code-wrap button.copy").count()
    assert page.errors == [] and page.requests == []


def test_the_matrix_has_a_legend_and_its_header_stays_in_view(page: Any, real_site: Path) -> None:
    _open(page, real_site / "matrix.html")  # its own page (issue 30), linked from the index
    legend = page.locator("#matrix .legend")
    assert legend.is_visible() and "●" in legend.inner_text() and "⚠︎" in legend.inner_text()
    legend_box, table_box = legend.bounding_box(), page.locator("table.matrix").bounding_box()
    assert legend_box is not None and table_box is not None and legend_box["y"] < table_box["y"]
    scroller = page.locator(".matrix-scroll")
    scroller.scroll_into_view_if_needed()
    scroller.evaluate("el => { el.scrollTop = 600; }")
    head = page.locator("table.matrix thead th").nth(1).bounding_box()
    box = scroller.bounding_box()
    assert head is not None and box is not None and abs(head["y"] - box["y"]) <= 2
    cell = page.locator("table.matrix tr", has=page.locator("td:first-child code", has_text="layer_output")).first
    # a mark per load on an image-text family (issue 30): text-only, then image-text
    assert cell.locator("td[data-col-family='qwen3_5_text'] span").all_inner_texts() == ["●", "●"]
    assert cell.locator("td[data-col-family='llama']").inner_text() == "●"
    vision = page.locator("table.matrix tr", has=page.locator("td:first-child code", has_text="image_features")).first
    assert vision.locator("td[data-col-family='qwen3_5_text'] span").all_inner_texts() == ["○", "●"]
    page.select_option("#matrix-family", "qwen3_5_text")  # the family picker: one family's column
    assert page.locator("table.matrix th[data-col-family]:visible").count() == 2  # its head and its tests
    assert vision.locator("td[data-col-family]:visible").count() == 1
    page.select_option("#matrix-family", "")
    assert vision.locator("td[data-col-family]:visible").count() == page.locator("#matrix-family option").count() - 1
    assert page.errors == []


def test_the_coming_from_table_filters(page: Any, real_site: Path) -> None:
    _open(page, real_site / "qwen3_5_text.html")
    rows = page.locator("#coming-from-table tbody tr:not([hidden])")
    total = rows.count()
    assert total >= 10
    page.fill("#coming-from-filter", "hook_resid_post")
    assert rows.count() == 1 and "model.layers[i].layer_output" in rows.first.inner_text()
    page.fill("#coming-from-filter", "linear_attn")  # every row a DeltaNet block serves
    assert 1 <= rows.count() < total
    page.fill("#coming-from-filter", "")
    assert rows.count() == total
    assert page.errors == []


def test_the_pinned_card_is_on_screen_on_a_phone(page: Any, real_site: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    for name in ("llama.html", "qwen3_5_text.html"):
        _open(page, real_site / name)
        part = page.locator("section#block .kind:not([hidden]) button.part.role-mlp")
        part.scroll_into_view_if_needed()
        part.click()
        card = page.locator("#" + part.get_attribute("data-card"))
        assert card.is_visible() and part.get_attribute("aria-pressed") == "true"
        box = card.bounding_box()
        assert box is not None
        assert box["y"] >= 0 and box["y"] + box["height"] <= 844 and box["x"] >= 0 and box["x"] + box["width"] <= 390
        assert card.locator(".card-std").inner_text() == "mlp_output"
        if name == "qwen3_5_text.html":  # the contents start folded on a phone
            assert page.locator("nav.toc details").get_attribute("open") is None
        page.keyboard.press("Escape")
        assert card.is_hidden()
    assert page.errors == []


def test_qwen3_5_text_draws_the_image_path_without_warnings_on_what_its_load_serves(page: Any, real_site: Path) -> None:
    _open(page, real_site / "qwen3_5_text.html")
    vision = page.locator("section#vision")
    chain = vision.locator(".chain button.part .part-name").evaluate_all("els => els.map(e => e.firstChild.textContent.trim())")
    assert chain == ["image", "patch_embed", "layers", "projector", "image_features", "layers[0].input"]
    assert vision.locator(".chain .count").inner_text() == "× 12"
    assert vision.locator("input.slider").get_attribute("max") == "11"
    feats = vision.locator(".chain button.part[data-std='image_features']")
    feats.hover()
    card = page.locator("#" + feats.get_attribute("data-card"))
    assert card.is_visible() and "ImageFeatures" in card.inner_text() and "⚠︎" not in card.inner_text()
    assert page.errors == []


def test_qwen3_vl_draws_deepstack_on_its_first_blocks(page: Any, real_site: Path) -> None:
    _open(page, real_site / "qwen3_vl.html")
    section = page.locator("section#block")
    slider = section.locator("input.slider")
    slider.fill("1")
    shown = section.locator(".kind:not([hidden])")
    assert "deepstack" in shown.get_attribute("data-label")
    assert shown.locator("button.part[data-std='deepstack_output']").count() == 1
    slider.fill("3")
    shown = section.locator(".kind:not([hidden])")
    assert shown.locator("button.part[data-std='deepstack_output']").count() == 0
    assert page.locator("section#vision .chain button.part[data-std='projector']").count() == 1
    assert page.locator("table.config thead").first.locator("th").count() == 2 + 4  # standard, native, 2B 4B 8B 32B
    assert page.errors == []


def test_the_index_links_the_manual_and_its_search_finds_the_manual_words(page: Any, real_site: Path) -> None:
    """The manual's pages (docs/, compiler/guide.py) beside the families: linked from the index, each section
    found by its words, a hit opening its section."""
    _open(page, real_site / "index.html")
    assert page.locator("nav.guides a[href='guide-getting-started.html']").count() == 1
    results = page.locator("#results")
    _search(page, "fcntl.flock")  # a word of docs/caching.md only
    hit = results.locator("li:has(a[href^='guide-caching.html#'])")
    assert hit.count() >= 1 and "section · manual · Caching" in hit.first.inner_text()
    href = hit.first.locator("a").get_attribute("href")
    hit.first.locator("a").click()
    page.wait_for_load_state("load")
    assert page.url.endswith(href) and page.locator(":target").count() == 1
    assert page.title() == "Caching · nnatlas manual"
    assert page.locator("header .crumbs [aria-current='page']").inner_text() == "Caching"
    page.locator("header .crumbs a[href='guide-concepts.html']").click()
    page.wait_for_load_state("load")
    assert page.locator("main pre[data-runs='true']").count() >= 5  # the page's python, each block run by tests/test_docs.py
    assert page.errors == [] and page.requests == []
