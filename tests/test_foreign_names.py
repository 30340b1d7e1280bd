"""Names from elsewhere: TransformerLens hooks, SAE hook points, nnsight and transformers module paths resolve to
the standard values on purpose (``model.value``), and an unknown name that is one of them says what it stands for."""

from __future__ import annotations

import pytest
import torch

import nnatlas
from nnatlas import testing


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return testing.build("llama")


@pytest.fixture(scope="module")
def gpt2() -> nnatlas.AtlasModel:
    return testing.build("gpt2")


@pytest.mark.parametrize(("name", "label"), [
    ("layers[1].layer_output", "layers[1].layer_output"),
    ("model.layers[1].layer_output", "layers[1].layer_output"),
    ("blocks.1.hook_resid_post", "layers[1].layer_output"),
    ("blocks.0.hook_resid_pre", "layers[0].layer_input"),
    ("blocks.1.hook_resid_mid", "layers[1].layer_mid"),
    ("blocks.0.attn.hook_pattern", "layers[0].self_attn.attention_probabilities"),
    ("blocks.0.attn.hook_z", "layers[0].self_attn.attention_head_outputs"),
    ("blocks.1.hook_attn_out", "layers[1].self_attn.attention_output"),
    ("blocks.1.mlp.hook_post", "layers[1].mlp.mlp_neurons"),
    ("blocks.1.hook_mlp_out", "layers[1].mlp.mlp_output"),
    ("hook_embed", "token_embeddings"),
    ("ln_final.hook_normalized", "final_norm_output"),
    ("model.model.layers[1].output", "layers[1].output"),  # nnsight: the root envoy is called model
    ("model.model.layers.0.self_attn.o_proj.output", "layers[0].self_attn.o_proj.output"),
    ("model.layers.1.mlp.down_proj.input", "layers[1].mlp.down_proj.input"),  # transformers' own module path
])
def test_llama_names_resolve(llama: nnatlas.AtlasModel, name: str, label: str) -> None:
    assert llama.value(name).label == label


@pytest.mark.parametrize(("name", "label"), [
    ("blocks.0.attn.hook_pattern", "layers[0].self_attn.attention_probabilities"),
    ("transformer.h[0].attn.output", "layers[0].self_attn.output"),
    ("model.transformer.h.1.mlp.c_proj.output", "layers[1].mlp.c_proj.output"),
])
def test_gpt2_paths_resolve_to_standard_labels(gpt2: nnatlas.AtlasModel, name: str, label: str) -> None:
    assert gpt2.value(name).label == label


def test_a_foreign_name_reads_the_same_tensor(llama: nnatlas.AtlasModel) -> None:
    with llama.trace("the eiffel tower is in"):
        pattern = llama.value("blocks.0.attn.hook_pattern").save()
        probs = llama.layers[0].self_attn.attention_probabilities.save()
        tl = llama.value("blocks.1.hook_resid_post").save()
        std = llama.layers[1].layer_output.save()
    torch.testing.assert_close(tl, std, rtol=0, atol=0)
    torch.testing.assert_close(pattern, probs, rtol=0, atol=0)


def test_a_hybrid_block_without_attention_says_where_attention_is() -> None:
    model = testing.build("qwen3_5_text")
    full = model.attention_layers[0]
    assert model.value(f"blocks.{full}.attn.hook_pattern").label == f"layers[{full}].self_attn.attention_probabilities"
    assert model.value("blocks.0.hook_attn_out").label == "layers[0].linear_attn.attention_output"
    with pytest.raises(nnatlas.Unavailable, match=f"self_attn exists on layers\\[{full}\\]"):
        model.value("blocks.0.attn.hook_pattern")


@pytest.mark.parametrize(("expr", "says"), [
    ("model.resid_post", "'resid_post' (an SAE hook point) is layer_output: model.layers[i].layer_output"),
    ("model.blocks", "'blocks' is TransformerLens's name; nnatlas calls it layers (model.layers)"),
    ("model.layers[2].hook_resid_post", "'hook_resid_post' is TransformerLens's hook for layer_output: "
                                        "model.layers[2].layer_output"),
    ("model.layers[0].attn", "'attn' is TransformerLens's name; here it is model.layers[0].self_attn"),
    ("model.layers[0].self_attn.hook_pattern", "model.layers[0].self_attn.attention_probabilities"),
])
def test_unknown_names_from_elsewhere_suggest_the_standard_one(llama: nnatlas.AtlasModel, expr: str, says: str) -> None:
    with pytest.raises(nnatlas.UnknownName) as err:
        eval(expr, {"model": llama})
    assert says in str(err.value)
    assert "nearest: logits" not in str(err.value)


@pytest.mark.parametrize(("name", "says"), [
    ("resid_post", "an SAE hook point for layer_output (model.layers[i].layer_output): name a block"),
    ("nonsense", "expected a standard path (layers[3].layer_output), a TransformerLens hook"),
    ("model.model.layers[1]", "is the module layers[1], not a value: read model.layers[1].output"),
    ("blocks.99.hook_resid_post", "no value of llama"),
    ("", "expected a name"),
])
def test_value_says_what_it_expected(llama: nnatlas.AtlasModel, name: str, says: str) -> None:
    with pytest.raises(nnatlas.UnknownName, match=None) as err:
        llama.value(name)
    assert says in str(err.value)
