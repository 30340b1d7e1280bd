"""``model.cache()`` and :class:`nnatlas.Cache`: one forward's values under their standard paths."""

from __future__ import annotations

import pytest
import torch

import nnatlas
from nnatlas.errors import NnatlasError, Unavailable, UnknownName
from nnatlas.testing import Allocations, _fixed_inputs, _save_all, build, draw_inputs
from nnatlas.trace.requests import Box

LOADS = [(family, None) for family in sorted(nnatlas.all_families())] + [("qwen3_5_text", "image_text")]


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize(("family", "variant"), LOADS, ids=[f"{f}-{v}" if v else f for f, v in LOADS])
def test_cache_equals_the_saves_of_a_trace_for_every_value(family: str, variant: str | None) -> None:
    """values=None caches every value the load serves, each equal to what a trace saves (eager: the pattern too)."""
    model = build(family, variant=variant)
    inputs = _fixed_inputs(model)
    cache = model.cache(inputs)
    saved = _save_all(model, inputs)
    expected = {f"{label}.{name}" if label != "model" else name: holder for (label, name), (_, holder, _) in saved.items()}
    assert set(cache) == set(expected)
    for path, holder in expected.items():
        _same(cache[path], holder.value if isinstance(holder, Box) else holder, path)
        assert cache.layout(path) == next(v for (label, name), (v, _, _) in saved.items()
                                          if path in (name, f"{label}.{name}")).layout
    if model.processor is not None:  # an image call: the vision values are there
        assert any(p.startswith("vision.") for p in cache)


@pytest.fixture(scope="module")
def hybrid() -> nnatlas.AtlasModel:
    return build("qwen3_5_text")


@pytest.fixture(scope="module")
def llama_sdpa() -> nnatlas.AtlasModel:
    return build("llama", attn_implementation="sdpa")


def test_values_by_block_stack_and_layouts(hybrid: nnatlas.AtlasModel) -> None:
    inputs = draw_inputs(64, 2, 6, [0, 2])
    cache = hybrid.cache(inputs, values=["layer_output", "self_attn.attention_output"], layers=range(0, 4))
    attn = hybrid.attention_layers
    assert list(cache) == [*(f"layers[{i}].layer_output" for i in range(4)),
                           *(f"layers[{i}].self_attn.attention_output" for i in attn)]
    assert cache.layers("self_attn.attention_output") == attn  # only the blocks that have it
    stacked = cache.stack("layer_output")
    assert stacked.shape == (4, 2, 6, hybrid.hidden_size)
    with hybrid.trace(inputs):
        outs = [hybrid.layers[i].layer_output.save() for i in range(4)]
    assert torch.equal(stacked, torch.stack(outs))
    assert cache.layout("layers[2].layer_output").text == "Residual [batch seq hidden_size]"
    half = cache.to("cpu", torch.float16)
    assert half["layers[0].layer_output"].dtype == torch.float16 and cache["layers[0].layer_output"].dtype == torch.float32
    with pytest.raises(KeyError, match="layers\\[0\\].layer_output"):
        cache["layers[9].layer_output"]
    with pytest.raises(KeyError, match="block values: layer_output, self_attn.attention_output"):
        cache.stack("mlp_output")
    assert "Residual [batch seq hidden_size]" in repr(cache)


def test_a_full_path_a_model_value_and_one_name(hybrid: nnatlas.AtlasModel) -> None:
    inputs = draw_inputs(64, 1, 5, [0])
    cache = hybrid.cache(inputs, values=["logits", "layers[1].mlp.mlp_output"])
    assert list(cache) == ["logits", "layers[1].mlp.mlp_output"]
    only = hybrid.cache(inputs, values="layer_output", layers=[-1])
    assert list(only) == [f"layers[{len(hybrid.layers) - 1}].layer_output"]


def test_bad_names_are_refused_before_the_forward(hybrid: nnatlas.AtlasModel, llama_sdpa: nnatlas.AtlasModel) -> None:
    calls = []
    handles = [hybrid.native.register_forward_pre_hook(lambda *a: calls.append(1))]
    try:
        with pytest.raises(UnknownName, match="nearest: linear_attn"):
            hybrid.cache("the city", values=["self_atn.attention_output"])
        with pytest.raises(Unavailable, match="self_attn exists on layers\\[3\\]"):
            hybrid.cache("the city", values=["self_attn.attention_output"], layers=[0, 1])
        with pytest.raises(Unavailable, match="needs route_kernels"):  # a value this load does not serve
            hybrid.cache("the city", values=["linear_attn.state"])
        with pytest.raises(NnatlasError, match="layers\\[0\\] to layers\\[3\\]"):
            hybrid.cache("the city", layers=[7])
        with pytest.raises(UnknownName, match="layers\\[9\\].layer_output is no value"):
            hybrid.cache("the city", values=["layers[9].layer_output"])
    finally:
        for h in handles:
            h.remove()
    assert calls == []


def test_cache_copies_nothing(llama_sdpa: nnatlas.AtlasModel) -> None:
    """The cached tensors are the model's own (a trace's saves are views): the traced forward allocates
    no byte more than the plain one."""
    inputs = draw_inputs(64, 2, 8, [0, 3])
    with torch.no_grad(), Allocations() as plain:
        llama_sdpa.native(**inputs)
    with Allocations() as traced:
        cache = llama_sdpa.cache(inputs, values=["layer_output", "self_attn.attention_output", "mlp.mlp_output"])
    assert len(cache) == 9
    assert traced.bytes == plain.bytes
