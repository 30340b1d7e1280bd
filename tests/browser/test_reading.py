"""Reading the site (issue 30): heading permalinks and section numbers that match the contents,
the search and the matrix's family in the address, cards kept in the window, a tap on a tick, each
checkpoint's hub and paper links, and the API reference. (Dark mode: every page's contrast is measured in
test_site.py's walk.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

def _open(page: Any, path: Path) -> None:
    page.goto(path.as_uri())
    page.wait_for_load_state("load")


def test_sections_are_numbered_as_the_contents_list_them_and_headings_have_permalinks(page: Any, real_site: Path) -> None:
    for name in ("llama.html", "qwen3_5_text.html"):
        _open(page, real_site / name)
        toc = page.eval_on_selector_all("nav.toc details > ol > li > a", "els => els.map(e => e.getAttribute('href'))")
        heads = page.eval_on_selector_all("main > section > h2", "els => els.map(e => ['#' + e.parentElement.id, "
                                          "e.querySelector('.num').textContent])")
        assert [h for h, _ in heads] == toc
        assert [n for _, n in heads] == [str(k) for k in range(1, len(toc) + 1)]  # 1..N, no 01b, 02a
        links = page.eval_on_selector_all("main h2 a.permalink", "els => els.map(e => e.getAttribute('href'))")
        assert links == toc
        assert page.locator("#notes article.note h3 a.permalink").count() == page.locator("#notes article.note").count()
    page.locator("#sizes h2 a.permalink").click()
    assert page.url.endswith("#sizes")
    assert page.errors == []


def test_the_search_and_the_matrix_family_live_in_the_address(page: Any, real_site: Path) -> None:
    _open(page, real_site / "index.html")
    page.click("button.trait-filter[data-trait='Mixture of experts']")
    page.fill("#search", "router_logits")
    page.wait_for_function("() => document.getElementById('results').dataset.query === 'router_logits'")
    shown = page.eval_on_selector_all("li.family:not([hidden])", "els => els.map(e => e.dataset.family)")
    assert "q=router_logits" in page.url and "trait=Mixture" in page.url
    page.reload()
    page.wait_for_function("() => document.getElementById('results').dataset.query === 'router_logits'")
    assert page.input_value("#search") == "router_logits"
    assert page.get_attribute("button.trait-filter[data-trait='Mixture of experts']", "aria-pressed") == "true"
    assert page.eval_on_selector_all("li.family:not([hidden])", "els => els.map(e => e.dataset.family)") == shown
    page.click("#clear-filters")
    assert "?" not in page.url
    _open(page, real_site / "matrix.html")
    page.select_option("#matrix-family", "mixtral")
    assert page.url.endswith("matrix.html?family=mixtral")
    page.reload()
    assert page.input_value("#matrix-family") == "mixtral"
    assert page.locator("table.matrix thead tr:first-child th[data-col-family]:visible").count() == 1
    assert page.errors == []


def test_a_card_stays_in_the_window_and_a_tick_picks_its_block(page: Any, real_site: Path) -> None:
    _open(page, real_site / "llama.html")
    part = page.locator("section#block .kind:not([hidden]) button.part.role-mlp")
    # the part on the window's last lines: a card drawn below it would be below the fold
    part.evaluate("e => window.scrollTo(0, e.getBoundingClientRect().bottom + window.scrollY - 890)")
    part.hover()
    card = page.locator("#" + part.get_attribute("data-card"))
    assert card.is_visible()
    cb, pb = card.bounding_box(), part.bounding_box()
    assert cb is not None and pb is not None
    assert pb["y"] + pb["height"] > 800  # the part is low in the window
    assert 0 <= cb["y"] and cb["y"] + cb["height"] <= 900 and 0 <= cb["x"] and cb["x"] + cb["width"] <= 1280
    _open(page, real_site / "deepseek_v3.html")
    page.locator("section#block .tick").nth(5).click()
    assert page.locator("section#block .pick-i").inner_text() == "i = 5"
    assert page.locator("section#block input.slider").input_value() == "5"
    assert page.errors == []


def test_each_checkpoint_links_its_hub_page_and_its_paper_where_one_is_known(page: Any, real_site: Path) -> None:
    import yaml

    from .conftest import ROOT

    papers = yaml.safe_load((ROOT / "specs" / "_papers.yaml").read_text(encoding="utf-8"))
    _open(page, real_site / "mistral.html")
    row = page.locator("table.sizes tbody tr").first
    assert row.locator("a", has_text="hub").get_attribute("href") == "https://huggingface.co/mistralai/Mistral-7B-v0.1"
    assert row.locator("a", has_text="paper").get_attribute("href") == f"https://arxiv.org/abs/{papers['mistralai/Mistral-7B-v0.1']}"
    _open(page, real_site / "gpt2.html")
    row = page.locator("table.sizes tbody tr").first
    assert row.locator("a", has_text="hub").get_attribute("href") == "https://huggingface.co/openai-community/gpt2"
    assert row.locator("a", has_text="paper").count() == 0  # specs/_papers.yaml: {none: ...}
    assert page.errors == [] and page.requests == []


def test_the_api_reference_names_every_public_name_and_is_linked_from_the_index(page: Any, real_site: Path) -> None:
    import nnatlas

    _open(page, real_site / "index.html")
    assert page.locator("header .crumbs a[href='api.html']").count() == 1
    assert page.locator("header .crumbs a[href='cookbook.html']").count() == 1
    _open(page, real_site / "api.html")
    ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
    assert {f"api-{n}" for n in nnatlas.__all__} <= ids, {f"api-{n}" for n in nnatlas.__all__} - ids
    for method in ("trace", "generate", "cache", "support", "value", "unembed", "logit_lens"):
        assert f"api-AtlasModel-{method}" in ids, method
    sig = page.locator("#api-AtlasModel-trace .api-sig").inner_text()
    assert re.search(r"trace\(inputs: Any=None, \*, order: str='strict', grad: bool=False", sig), sig
    assert "docstring" not in page.locator("#api-load").inner_text()  # load's own docstring is shown
    assert page.locator("main pre code").count() == 0  # no code example on it to keep running: those are the cookbook's
    assert page.errors == []
