"""nnatlas.show.attention in a real browser, as a notebook renders its _repr_html_: two views on one page (a notebook
holds many), each renders its grid, its head picker repaints it with that head's weights, hovering a cell shows the
weight in its card, hostile tokens stay text, and nothing errs or asks the network for anything. The notebook views
of a model, its support() and a cache render too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import nnatlas
from nnatlas.testing import build

pytestmark = pytest.mark.browser

NASTY = "</script><script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def traced() -> dict:
    model = build("llama")
    with model.trace("the eiffel tower is"):
        pattern = model.layers[1].self_attn.attention_probabilities.save()
    ids = model.tokenizer("the eiffel tower is")["input_ids"]
    tokens = [model.tokenizer.decode([t]) for t in ids]
    return {"model": model, "pattern": pattern, "tokens": [NASTY, *tokens[1:]]}


def _weights(page: Any, view: int) -> list[list[float]]:
    return page.evaluate("""v => {
        const root = document.querySelectorAll('.nnatlas-attention')[v];
        const rows = [];
        root.querySelectorAll('.nn-grid tbody tr').forEach(tr =>
            rows.push([...tr.querySelectorAll('td')].map(td => Number(td.dataset.w))));
        return rows;
    }""", view)


def test_the_attention_view_renders_picks_heads_and_shows_weights(page: Any, traced: dict, tmp_path: Path) -> None:
    pattern, tokens = traced["pattern"], traced["tokens"]
    views = [nnatlas.show.attention(pattern, tokens), nnatlas.show.attention(pattern * 0.5, tokens)]
    file = tmp_path / "notebook.html"
    file.write_text("<!doctype html><meta charset=utf-8><body>" + "".join(v._repr_html_() for v in views) + "</body>",
                    encoding="utf-8")
    page.goto(file.as_uri())
    page.wait_for_load_state("load")
    assert page.evaluate("window.__pwned === undefined")
    first = page.locator(".nnatlas-attention").nth(0)
    assert first.locator("thead th").nth(1).inner_text() == NASTY  # the token, as text
    assert first.locator("select option").count() == pattern.shape[1]
    torch.testing.assert_close(torch.tensor(_weights(page, 0)), pattern[0, 0], atol=5e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(_weights(page, 1)), pattern[0, 0] * 0.5, atol=5e-5, rtol=0)
    h = pattern.shape[1] - 1
    assert h > 0
    first.locator("select").select_option(str(h))  # the picker repaints its own view only
    torch.testing.assert_close(torch.tensor(_weights(page, 0)), pattern[0, h], atol=5e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(_weights(page, 1)), pattern[0, 0] * 0.5, atol=5e-5, rtol=0)
    q, k = pattern.shape[2] - 1, 1
    first.locator(f"td[data-q='{q}'][data-k='{k}']").hover()
    card = first.locator(".nn-card")
    assert card.is_visible()
    assert card.inner_text() == f"head {h}  {tokens[q]} \u2192 {tokens[k]}: {float(pattern[0, h, q, k]):.4f}"
    background = first.locator(f"td[data-q='{q}'][data-k='{k}']").evaluate("td => getComputedStyle(td).backgroundColor")
    assert background.startswith("rgba(33, 102, 172")
    page.mouse.move(1, 1)
    first.locator("table").dispatch_event("mouseleave")
    assert not card.is_visible()
    assert page.errors == [] and page.requests == []  # type: ignore[attr-defined]


def test_the_notebook_views_of_a_model_its_support_and_a_cache_render(page: Any, traced: dict, tmp_path: Path) -> None:
    model = traced["model"]
    cache = model.cache("the eiffel tower", values=["layer_output"], layers=[0, 1])
    parts = [model._repr_html_(), model.support()._repr_html_(), cache._repr_html_()]
    file = tmp_path / "views.html"
    file.write_text("<!doctype html><meta charset=utf-8><body>" + "".join(parts) + "</body>", encoding="utf-8")
    page.goto(file.as_uri())
    page.wait_for_load_state("load")
    text = page.locator("body").inner_text()
    assert f"family {model.family}" in text and "layers[0].layer_output" in text and "LlamaDecoderLayer" in text
    assert page.locator("table").count() >= 3
    assert page.errors == [] and page.requests == []  # type: ignore[attr-defined]
