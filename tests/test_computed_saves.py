"""Saving what the body computes from values (nnatlas.save, .save() on an expression): the real tensor after the
block, computed where the forward produced the values it reads (before later edits), gradients kept under
grad=True, nested containers kept, one-line errors, and nothing left behind."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

import nnatlas
from nnatlas.errors import InputError, NnatlasError
from nnatlas.testing import build

from .test_runtime import assert_clean

PROMPT = "the eiffel tower is in"


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return build("llama")


@pytest.fixture(scope="module")
def W(llama: nnatlas.AtlasModel) -> torch.Tensor:
    return torch.randn(llama.config.hidden_size, 6, generator=torch.Generator().manual_seed(1))


def test_expressions_save_the_real_tensor(llama: nnatlas.AtlasModel, W: torch.Tensor) -> None:
    with llama.trace(PROMPT):
        out1 = llama.layers[1].layer_output.save()
        x = llama.layers[1].layer_output
        proj = (x @ W).save()
        norm = x.norm(dim=-1).save()
        feats = torch.relu(x @ W - 0.1).save()
        two = (x - llama.layers[2].layer_output).save()  # (strict order: the earlier value first)
        probs = (llama.next_token_probs * 2).save()  # a derived value inside the expression
        with pytest.raises(NnatlasError, match=r"computed from layers\[1\]\.layer_output.*exists only after"):
            _ = proj.shape
        out2 = llama.layers[2].layer_output.save()
        plain = llama.next_token_probs.save()
    assert type(proj) is torch.Tensor and proj.shape == (1, out1.shape[1], 6)
    assert torch.equal(proj, out1 @ W) and torch.equal(norm, out1.norm(dim=-1))
    assert torch.equal(feats, torch.relu(out1 @ W - 0.1)) and torch.equal(two, out1 - out2)
    assert torch.equal(probs, plain * 2)
    assert_clean(llama)


def test_nnatlas_save_keeps_containers(llama: nnatlas.AtlasModel, W: torch.Tensor) -> None:
    Pair = namedtuple("Pair", "proj norm")
    with llama.trace(PROMPT):
        x = llama.layers[0].layer_output
        saved = nnatlas.save({"pair": Pair(x @ W, x.norm(dim=-1)), "list": [x[0, -1], x.sum()], "value": x})
        kept = llama.layers[0].layer_output.save()
        assert nnatlas.save(kept) is kept  # saved already: the same tensor
    assert isinstance(saved["pair"], Pair) and isinstance(saved["list"], list)
    assert torch.equal(saved["pair"].proj, kept @ W) and torch.equal(saved["pair"].norm, kept.norm(dim=-1))
    assert torch.equal(saved["list"][0], kept[0, -1]) and torch.equal(saved["list"][1], kept.sum())
    assert torch.equal(saved["value"], kept)


def test_computed_where_the_values_are_before_a_later_edit(llama: nnatlas.AtlasModel) -> None:
    with llama.trace(PROMPT):
        before = llama.layers[1].layer_output.save()
    with llama.trace(PROMPT):
        x = llama.layers[1].layer_output
        norm = x.norm(dim=-1).save()
        llama.layers[1].layer_output[:] = 0  # the edit lands after the norm was taken
        after = llama.layers[2].layer_input.norm(dim=-1).save()
    assert torch.equal(norm, before.norm(dim=-1))
    assert torch.equal(after, torch.zeros_like(after))


def test_grad_reaches_the_saved_expression_and_the_values(llama: nnatlas.AtlasModel, W: torch.Tensor) -> None:
    with llama.trace(PROMPT, grad=True):
        x = llama.layers[1].layer_output
        proj = (x @ W).save()
        out = llama.layers[1].layer_output.save()
    assert proj.requires_grad
    (proj * 3).sum().backward()
    torch.testing.assert_close(proj.grad, torch.full_like(proj, 3.0), atol=0, rtol=0)
    torch.testing.assert_close(out.grad, torch.full_like(proj, 3.0) @ W.T)  # d/dx of sum(3 x W)
    assert llama.native.model.layers[0].mlp.down_proj.weight.grad is not None  # and the model's weights
    llama.native.zero_grad(set_to_none=True)
    with llama.trace(PROMPT):  # without grad=True nothing keeps a graph
        plain = (llama.layers[1].layer_output @ W).save()
    assert not plain.requires_grad and torch.equal(plain, proj.detach())


def test_errors_are_one_line(llama: nnatlas.AtlasModel, W: torch.Tensor) -> None:
    with pytest.raises(NnatlasError, match=r"^nnatlas\.save: \['w'\] is a tensor that exists already") as info:
        with llama.trace(PROMPT):
            nnatlas.save({"w": W})
    assert "\n" not in str(info.value)
    with pytest.raises(NnatlasError, match=r"^nnatlas\.save: \[1\] is an int: nnatlas\.save keeps tensors"):
        with llama.trace(PROMPT):
            nnatlas.save([llama.layers[0].layer_output, 3])
    with pytest.raises(NnatlasError, match="nnatlas.save: its argument is a tensor that exists already"):
        nnatlas.save(torch.ones(2))  # outside a trace
    with llama.trace(PROMPT):
        late = llama.layers[0].layer_output @ W
    with pytest.raises(NnatlasError, match="computed in a trace whose block has ended"):
        late.save()
    with pytest.raises(NnatlasError, match="read inside `with model.trace"):
        nnatlas.save(llama.layers[0].layer_output)
    with pytest.raises(NnatlasError, match=r"is a Size, not a tensor: save tensors"):
        with llama.trace(PROMPT):
            llama.layers[0].layer_output.shape.save()
    with pytest.raises(InputError, match=r"computed from layers\[0\]\.layer_output: the expression .* failed"):
        with llama.trace(PROMPT):
            (llama.layers[0].layer_output @ W.T).save()  # shapes that do not multiply: said at the forward
    assert_clean(llama)


def test_after_an_exception_in_the_body_nothing_is_computed_or_left(llama: nnatlas.AtlasModel, W: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="in the body"):
        with llama.trace(PROMPT) as tracer:
            proj = (llama.layers[0].layer_output @ W).save()
            value = llama.layers[0].layer_output.save()
            raise ValueError("in the body")
    assert tracer.computed is not None  # recorded, never served: the forward did not run
    for held in (proj, value):  # still placeholders, saying why they hold nothing
        with pytest.raises(NnatlasError, match="the trace's block raised before its forward ran"):
            _ = held.shape
        assert "never filled" in repr(held)
    assert_clean(llama)
    with llama.trace(PROMPT) as tracer:  # and the model traces again
        again = (llama.layers[0].layer_output @ W).save()
    assert again.shape[-1] == 6 and tracer.computed is None
    assert "_finish" not in tracer.__dict__  # (the bound method put on the instance for the forward: gone, no cycle)
