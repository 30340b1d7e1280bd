"""``model.unembed`` and ``model.logit_lens``: the readout the spec declares (final norm, head, and the model
host's identity ``logits == f(lm_head_output)``) reads the last block's output out as the logits, on every
family, with its softcaps, scales and multipliers moved off their defaults, and under grad."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nnatlas
from nnatlas import testing

PROMPT = "the eiffel tower is in paris"


def last_output(model: Any) -> Any:
    last = model.layers[len(model.layers) - 1]
    return last.layer_output if hasattr(last, "layer_output") else last.output


def traced(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    ids = model.tokenizer([PROMPT, "a big red city"], return_tensors="pt", padding=True)
    with model.trace(dict(ids)):
        x = last_output(model).save()
        logits = model.logits.save()
    return x, logits


@pytest.mark.parametrize("family", sorted(nnatlas.all_families()))
def test_unembed_of_the_last_block_is_the_logits(family: str) -> None:
    model = testing.build(family)
    x, logits = traced(model)
    torch.testing.assert_close(model.unembed(x), logits, rtol=1e-6, atol=1e-6)


# a factor past the head, moved off its default: without it the readout is off
MOVED = [("granite", "logits_scaling", 4.0), ("falcon_h1", "lm_head_multiplier", 0.25),
         ("cohere", "logit_scale", 0.5), ("gemma2", "final_logit_softcapping", 1.5),
         ("recurrent_gemma", "logits_soft_cap", 1.5)]


@pytest.mark.parametrize(("family", "entry", "value"), MOVED)
def test_factors_past_the_head_are_applied(family: str, entry: str, value: float) -> None:
    params = testing.first_params(family)
    params[entry] = value
    model = testing.build(family, params)
    assert getattr(model.native.config, entry) == value
    x, logits = traced(model)
    torch.testing.assert_close(model.unembed(x), logits, rtol=1e-6, atol=1e-6)
    r = nnatlas.tree.readout.readout(model)
    bare = r.head(r.norm(x) if r.norm is not None else x)
    assert (bare - logits).abs().max() > 1e-3  # the factor matters here: a readout without it would fail


def test_logit_lens_keeps_the_container_and_runs_under_grad() -> None:
    model = testing.build("llama")
    ids = model.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with model.trace(ids, grad=True):
        outs = [layer.layer_output.save() for layer in model.layers]
        logits = model.logits.save()
    lens = model.logit_lens(outs)
    assert isinstance(lens, list) and len(lens) == len(outs)
    assert all(t.shape == logits.shape for t in lens)
    torch.testing.assert_close(lens[-1], logits)
    assert set(model.logit_lens({"a": outs[0]})) == {"a"} and isinstance(model.logit_lens(tuple(outs)), tuple)
    steer = torch.zeros(model.hidden_size, requires_grad=True)
    model.unembed(outs[0].detach() + steer)[0, -1, 1].backward()
    assert steer.grad is not None and bool(steer.grad.abs().sum() > 0)
    lens[1][0, -1, 1].backward()  # through the saved value into the model
    assert model.native.lm_head.weight.grad is not None


def test_unembed_says_what_is_wrong() -> None:
    model = testing.build("llama")
    with pytest.raises(nnatlas.NnatlasError, match="expected \\[..., 16\\]"):
        model.unembed(torch.zeros(2, 3))
    with pytest.raises(nnatlas.NnatlasError, match="after the trace block"):
        with model.trace(PROMPT):
            model.unembed(model.layers[0].layer_output.save())
