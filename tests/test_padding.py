"""Padding: next_token_probs follows the attention mask (each row's last real token, whichever side the
padding is on), ids holding the pad id without a mask warn once, and model.cache says which tokens are real."""

from __future__ import annotations

import warnings

import pytest
import torch

import nnatlas
from nnatlas.inputs.prepare import PaddingWarning
from nnatlas.testing import build

PROMPTS = ["the eiffel tower is in the city of", "paris is", "the old red tower"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request: pytest.FixtureRequest) -> nnatlas.AtlasModel:
    return build(request.param)


def _padded(model: nnatlas.AtlasModel, side: str) -> dict[str, torch.Tensor]:
    tok = model.tokenizer
    before = tok.padding_side
    tok.padding_side = side
    try:
        return dict(tok(PROMPTS, return_tensors="pt", padding=True))
    finally:
        tok.padding_side = before


@pytest.mark.parametrize("side", ["right", "left"])
def test_next_token_probs_reads_each_rows_last_real_token(model: nnatlas.AtlasModel, side: str) -> None:
    inputs = _padded(model, side)
    assert not bool(inputs["attention_mask"].all())  # (the batch is padded)
    with model.trace(inputs):
        probs = model.next_token_probs.save()
        logits = model.logits.save()
    mask = inputs["attention_mask"]
    for i, prompt in enumerate(PROMPTS):
        last = int(mask[i].nonzero().max())
        assert torch.equal(probs[i], torch.softmax(logits[i, last].float(), -1)), f"row {i} ({side} padding)"
        if side == "right":  # a causal model's real tokens do not see the pads after them: the prompt alone
            with model.trace(prompt):
                alone = model.next_token_probs.save()
            torch.testing.assert_close(probs[i], alone[0], atol=1e-5, rtol=1e-4, msg=f"row {i} ({side} padding)")


def test_next_token_probs_in_generation_steps_reads_the_new_token(model: nnatlas.AtlasModel) -> None:
    with model.generate(PROMPTS, max_new_tokens=2) as tracer:
        steps = []
        for _ in tracer.iter[0:2]:
            steps.append((model.next_token_probs.save(), model.logits.save()))
    for probs, logits in steps:
        torch.testing.assert_close(probs, torch.softmax(logits[:, -1].float(), -1))


def test_ids_holding_the_pad_id_without_a_mask_warn_once() -> None:
    model = build("llama")
    pad = model.tokenizer.pad_token_id
    real = model.tokenizer("the eiffel tower", return_tensors="pt")["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaddingWarning)
        with model.trace(real):  # no pad id: no warning
            pass
        with model.trace({"input_ids": real, "attention_mask": torch.ones_like(real)}):
            pass
    padded = torch.cat([real, torch.full((1, 2), pad)], 1)
    with pytest.warns(PaddingWarning, match=f"pad id {pad}.*no attention mask"):
        with model.trace(padded):
            pass
    with warnings.catch_warnings():  # once per model
        warnings.simplefilter("error", PaddingWarning)
        with model.trace({"input_ids": padded}):
            pass
    other = build("llama")
    with pytest.warns(PaddingWarning):  # a dict without a mask warns too
        with other.trace({"input_ids": padded}):
            pass


def test_cache_carries_the_attention_mask_and_positions(model: nnatlas.AtlasModel) -> None:
    cache = model.cache(PROMPTS, values=["logits"])
    expected = _padded(model, "left")["attention_mask"]
    assert torch.equal(cache.attention_mask, expected)
    assert list(cache) == ["logits"]  # (attributes, not entries)
    lengths = expected.sum(-1)
    for i in range(len(PROMPTS)):
        n, seq = int(lengths[i]), expected.shape[1]
        assert cache.positions[i].tolist() == [-1] * (seq - n) + list(range(n))
    moved = cache.to("cpu")
    assert torch.equal(moved.attention_mask, cache.attention_mask) and torch.equal(moved.positions, cache.positions)
    single = model.cache(torch.tensor([[5, 6, 7]]), values=["logits"])
    assert single.attention_mask.tolist() == [[1, 1, 1]] and single.positions.tolist() == [[0, 1, 2]]


def test_the_generated_tests_draw_both_sides_of_padding() -> None:
    """The generated tests' inputs: drawn cases pad on the left or the right (a hypothesis draw), and the fixed
    inputs every oracle, edit and gradient check runs hold an unpadded, a left-padded and a right-padded row."""
    from nnatlas import testing as T

    right = T.draw_inputs(64, 2, 5, [0, 2], seed=1, side="right")
    assert right["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert right["input_ids"][1, 3:].tolist() == [0, 0]
    left = T.draw_inputs(64, 2, 5, [0, 2], seed=1)
    assert left["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    fixed = T._fixed_inputs(T.build("llama"))["attention_mask"]
    assert fixed[:, 0].tolist() == [1, 0, 1] and fixed[:, -1].tolist() == [1, 1, 0]
    case = T.Case("llama", T.first_params("llama"), right, 0)
    assert "right padding [0, 2]" in repr(case)
    with pytest.raises(ValueError, match="side"):
        T.draw_inputs(64, 1, 3, [1], side="middle")
