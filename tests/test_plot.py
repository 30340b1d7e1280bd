"""nnatlas.plot draws what it is given (each heatmap's data, its axes' labels, the logit lens's cell texts), refuses
what it cannot draw in one line, and says which extra to install when matplotlib is missing; nnatlas.show's attention
view is one self-contained, escaped HTML string (its behaviour in a browser: tests/browser/test_views.py)."""

from __future__ import annotations

import sys

import pytest
import torch

import nnatlas
from nnatlas.errors import InputError, NnatlasError
from nnatlas.testing import build

pytest.importorskip("matplotlib")  # (the test extra installs it; nnatlas[plot] for users)

PROMPT = "the eiffel tower is in"


@pytest.fixture(scope="module")
def traced() -> dict:
    model = build("llama")
    with model.trace(PROMPT):
        pattern = model.layers[0].self_attn.attention_probabilities.save()
        stream = [layer.layer_output.save() for layer in model.layers]
    ids = model.tokenizer(PROMPT)["input_ids"]
    return {"model": model, "pattern": pattern, "stream": stream, "tokens": [model.tokenizer.decode([t]) for t in ids]}


def _ticks(labels: list) -> list[str]:
    return [t.get_text() for t in labels]


def test_attention_draws_one_heatmap_per_head(traced: dict) -> None:
    pattern, tokens = traced["pattern"], traced["tokens"]
    heads = pattern.shape[1]
    fig = nnatlas.plot.attention(pattern, tokens)
    drawn = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert [ax.get_title() for ax in drawn] == [f"head {h}" for h in range(heads)]
    for h, ax in enumerate(drawn):
        assert torch.equal(torch.tensor(ax.images[0].get_array()), pattern[0, h])
        assert _ticks(ax.get_xticklabels()) == tokens and _ticks(ax.get_yticklabels()) == tokens
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("key", "query") and ax.images[0].get_clim() == (0.0, 1.0)
    picked = nnatlas.plot.attention(pattern[0], tokens, heads=[1])  # without the batch dim, one head
    drawn = [ax for ax in picked.axes if ax.get_visible() and ax.images]
    assert [ax.get_title() for ax in drawn] == ["head 1"]
    assert torch.equal(torch.tensor(drawn[0].images[0].get_array()), pattern[0, 1])


def test_logit_lens_labels_every_cell_with_its_top_token(traced: dict) -> None:
    model, stream, tokens = traced["model"], traced["stream"], traced["tokens"]
    fig = nnatlas.plot.logit_lens(model, stream, tokens)
    ax = fig.axes[0]
    probs = torch.stack([block[0].softmax(-1) for block in model.logit_lens(stream)])  # [blocks, seq, vocab]
    top, ids = probs.max(-1)
    torch.testing.assert_close(torch.tensor(ax.images[0].get_array()), top)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert len(texts) == top.numel()
    for (b, s), text in texts.items():
        assert text == repr(model.tokenizer.decode([int(ids[b, s])]))[1:-1]
    assert _ticks(ax.get_xticklabels()) == tokens
    assert _ticks(ax.get_yticklabels()) == [str(b) for b in range(model.num_layers)]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("position", "block")


def test_sweep_draws_the_effect_around_zero(traced: dict) -> None:
    effect = torch.tensor([[0.5, -2.0, 0.0], [1.0, 0.25, -0.75]])
    fig = nnatlas.plot.sweep(effect, tokens=["a", "b", "c"], layers=["L0", "L1"])
    ax = fig.axes[0]
    assert torch.equal(torch.tensor(ax.images[0].get_array()), effect)
    assert ax.images[0].get_clim() == (-2.0, 2.0)  # symmetric: 0 is the middle colour
    assert _ticks(ax.get_xticklabels()) == ["a", "b", "c"] and _ticks(ax.get_yticklabels()) == ["L0", "L1"]
    assert _ticks(nnatlas.plot.sweep(effect).axes[0].get_yticklabels()) == ["0", "1"]


def test_bad_input_is_refused_in_one_line(traced: dict) -> None:
    pattern, tokens = traced["pattern"], traced["tokens"]
    cases = [
        (lambda: nnatlas.plot.attention(torch.cat([pattern, pattern]), tokens), "a batch of 2 prompts"),
        (lambda: nnatlas.plot.attention(pattern, tokens[:-1]), f"{len(tokens) - 1} tokens for {len(tokens)} positions"),
        (lambda: nnatlas.plot.attention(pattern, tokens, heads=[pattern.shape[1]]), "heads"),
        (lambda: nnatlas.plot.attention([1, 2], tokens), "expected a tensor"),
        (lambda: nnatlas.plot.sweep(torch.zeros(3)), r"expected \[layers, positions\]"),
        (lambda: nnatlas.plot.sweep(torch.zeros(2, 2), layers=[0]), "1 layer labels for 2 rows"),
        (lambda: nnatlas.plot.logit_lens(traced["model"], traced["stream"][0], tokens), "a list of saved block outputs"),
        (lambda: nnatlas.show.attention(pattern, "the eiffel"), "tokens is a list of strings"),
    ]
    for call, message in cases:
        with pytest.raises(InputError, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def test_without_matplotlib_the_error_names_the_extra(traced: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # (import matplotlib.figure raises ImportError)
    with pytest.raises(NnatlasError, match=r"^nnatlas\.plot draws with matplotlib.*pip install 'nnatlas\[plot\]'$"):
        nnatlas.plot.sweep(torch.zeros(2, 2))
    assert "weights" in nnatlas.show.attention(traced["pattern"], traced["tokens"])._repr_html_()  # show needs none


def test_the_attention_view_is_one_self_contained_escaped_string(traced: dict) -> None:
    pattern = traced["pattern"]
    nasty = ['</script><script>alert(1)</script>', '<b>&amp;</b>', '"q"', *traced["tokens"][3:]]
    page = nnatlas.show.attention(pattern, nasty)._repr_html_()
    assert page.count("<script>") == 1 and page.count("</script>") == 1  # only its own
    assert "<b>" not in page and "&lt;b&gt;&amp;amp;&lt;/b&gt;" in page  # the header cell, escaped
    for outside in ("http:", "https:", "src=", "<link", "@import", "url("):
        assert outside not in page
    assert page.count("<option") == pattern.shape[1] and page.count("<td ") == pattern.shape[2] ** 2
    second = nnatlas.show.attention(pattern, nasty)._repr_html_()
    assert second.split('"', 2)[1] != page.split('"', 2)[1]  # each view its own id
    assert repr(nnatlas.show.attention(pattern)) == (f"<attention view: {pattern.shape[1]} heads, "
                                                     f"{pattern.shape[2]} queries x {pattern.shape[3]} keys>")
