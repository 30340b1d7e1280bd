"""A saved tensor inside the trace body is a placeholder: reading its shape, data or items raises, saying
the value exists after the block, instead of answering for an empty tensor of shape [0]."""

from __future__ import annotations

import pytest
import torch

import nnatlas
from nnatlas.errors import NnatlasError
from nnatlas.testing import build


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return build("llama")


READS = {
    "shape": lambda h: h.shape,
    "size()": lambda h: h.size(),
    "data": lambda h: h.data,
    "item()": lambda h: h.item(),
    "numel()": lambda h: h.numel(),
    "dim()": lambda h: h.dim(),
    "len": lambda h: len(h),
    "tolist()": lambda h: h.tolist(),
    "index": lambda h: h[0],
    "arithmetic": lambda h: h * 2,
    "sum()": lambda h: h.sum(),
    "bool": lambda h: bool(h),
    "torch.function": lambda h: torch.softmax(h, -1),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_placeholder_read_in_the_body_raises(llama: nnatlas.AtlasModel, read: str) -> None:
    with llama.trace("the eiffel tower"):
        h = llama.layers[0].layer_output.save()
        with pytest.raises(NnatlasError, match=r"layers\[0\]\.layer_output.*exists only after the trace's block ends"):
            READS[read](h)
    assert type(h) is torch.Tensor  # a plain tensor after the block, with the value's shape
    assert h.shape == (1, 3, llama.config.hidden_size)


def test_the_placeholders_of_a_derived_value_and_a_second_save_raise_and_fill(llama: nnatlas.AtlasModel) -> None:
    with llama.trace("the eiffel tower"):
        probs = llama.next_token_probs.save()
        first = llama.layers[1].layer_output.save()
        again = llama.layers[1].layer_output.save()  # (the second save of a value takes the fast path)
        assert "next_token_probs" in repr(probs)
        for h in (probs, first, again):
            with pytest.raises(NnatlasError, match="exists only after"):
                _ = h.shape
    assert probs.shape == (1, llama.config.vocab_size)
    assert torch.equal(first, again) and type(again) is torch.Tensor and first.shape[1] == 3
    assert not hasattr(again, "_nnatlas_label")


def test_grad_saves_still_fill_their_grad(llama: nnatlas.AtlasModel) -> None:
    with llama.trace("the eiffel tower", grad=True):
        h = llama.layers[0].layer_output.save()
        logits = llama.logits.save()
    logits.sum().backward()
    assert type(h) is torch.Tensor and h.grad is not None and h.grad.shape == h.shape
