"""The shipped mixtures on layouts no recorded checkpoint has: dense MLP blocks among the mixture's, placed by the
config's own options as transformers places them (Qwen2-MoE, Qwen3-MoE and Qwen3-Next's ``mlp_only_layers`` and
``decoder_sparse_step``, ERNIE 4.5's ``moe_layer_interval``). Each model is built by transformers from such a
config and wrapped with its tree checked (``check=True``); then every block's output is compared with a torch
forward hook's, each mixture block's ``router_logits`` with transformers' own ``output_router_logits``, each dense
block's ``mlp_neurons`` with its down projection's input, and ``support()`` with what a trace serves.

Before the specs took MLP kinds from these options, a dense block among the mixture's fitted no spec: the tree
check named ``layers[0].mlp``'s class, and a trace of its ``router_logits`` failed with "no child module
'router'" (seen failing: the old qwen3_moe spec fails every case here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import nnatlas
from nnatlas.errors import Unavailable
from nnatlas.testing import draw_inputs
from nnatlas.testing import suite as T
from nnatlas.testing.layouts import structural_options

# family, the layout moved off the releases', the blocks that keep a dense MLP
LAYOUTS = [
    ("qwen3_moe", {"mlp_only_layers": [0], "decoder_sparse_step": 1, "num_hidden_layers": 3}, [0]),
    ("qwen3_moe", {"mlp_only_layers": [], "decoder_sparse_step": 2, "num_hidden_layers": 4}, [0, 2]),
    ("qwen2_moe", {"mlp_only_layers": [1], "decoder_sparse_step": 1, "num_hidden_layers": 3}, [1]),
    ("qwen2_moe", {"mlp_only_layers": [3], "decoder_sparse_step": 2, "num_hidden_layers": 4}, [0, 2, 3]),
    ("ernie4_5_moe", {"moe_layer_start_index": 0, "moe_layer_end_index": 3, "moe_layer_interval": 2,
                      "num_hidden_layers": 4}, [0, 2]),
    ("ernie4_5_moe", {"moe_layer_start_index": 1, "moe_layer_end_index": 2, "moe_layer_interval": 1,
                      "num_hidden_layers": 4}, [0, 3]),
    ("qwen3_next", {"mlp_only_layers": [0], "decoder_sparse_step": 1, "num_hidden_layers": 4}, [0]),
    ("qwen3_next", {"mlp_only_layers": [], "decoder_sparse_step": 2, "num_hidden_layers": 4,
                    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]},
     [0, 2]),
]


def _built(family: str, layout: dict[str, Any]) -> nnatlas.AtlasModel:
    tiny = T.tiny_of(family, None)
    params = {**T.first_params(family), **layout}
    config = getattr(transformers, tiny["config_class"])(**params)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = getattr(transformers, tiny["model_class"])(config).eval()
    return nnatlas.wrap(hf, check=True)  # the tree checked against the spec: every block's class and reads


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-dense{p[2]}")
def laid(request: pytest.FixtureRequest) -> tuple[nnatlas.AtlasModel, list[int], dict[str, torch.Tensor]]:
    family, layout, dense = request.param
    model = _built(family, layout)
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 2, 6, [0, 0], seed=3)
    return model, dense, inputs


def test_the_kinds_are_the_blocks_transformers_built(laid: Any) -> None:
    model, dense, _ = laid
    classes = [type(layer.mlp).__name__ for layer in model.native.model.layers]
    assert [i for i, c in enumerate(classes) if not c.endswith("SparseMoeBlock")] == dense
    assert model.dense_layers == dense
    assert model.moe_layers == [i for i in range(model.num_layers) if i not in dense]


def test_every_block_output_is_a_forward_hooks(laid: Any) -> None:
    model, _, inputs = laid
    hooked: dict[int, torch.Tensor] = {}
    handles = [layer.register_forward_hook(lambda _m, _a, out, i=i: hooked.__setitem__(i, out[0] if isinstance(
        out, tuple) else out)) for i, layer in enumerate(model.native.model.layers)]
    try:
        with torch.no_grad():
            logits = model.native(**inputs).logits
    finally:
        for h in handles:
            h.remove()
    with model.trace(inputs):
        outs = [model.layers[i].layer_output.save() for i in range(model.num_layers)]
        ours = model.logits.save()
    for i, out in enumerate(outs):
        assert torch.equal(out, hooked[i]), f"layers[{i}]"
    assert torch.equal(ours, logits)


def test_router_logits_on_mixture_blocks_and_neurons_on_dense_ones(laid: Any) -> None:
    model, dense, inputs = laid
    with torch.no_grad():
        native = model.native(**inputs, output_router_logits=True).router_logits
    moe = model.moe_layers
    assert len(native) == len(moe)  # transformers records a router on the mixture's blocks only
    with model.trace(inputs, order="any"):
        routers = [model.layers[i].mlp.router_logits.save() for i in moe]
        neurons = [model.layers[i].mlp.mlp_neurons.save() for i in dense]
    batch, seq = inputs["input_ids"].shape
    for got, want in zip(routers, native, strict=True):
        assert torch.equal(got, want.reshape(batch, seq, -1))
    width = int(model.config.intermediate_size)
    for i, got in zip(dense, neurons, strict=True):
        down = model.native.model.layers[i].mlp.down_proj
        seen: list[torch.Tensor] = []
        h = down.register_forward_hook(lambda _m, args, _o, seen=seen: seen.append(args[0]))
        try:
            with torch.no_grad():
                model.native(**inputs)
        finally:
            h.remove()
        assert got.shape == (batch, seq, width) and torch.equal(got, seen[0])
    for i in dense:
        with pytest.raises(Unavailable, match=rf"layers\[{i}\]\.mlp has no router_logits: .* is a dense block"):
            with model.trace(inputs):
                model.layers[i].mlp.router_logits.save()


def test_support_says_what_a_trace_serves(laid: Any) -> None:
    """Each kind's mlp (support() shows the first block of each): every value it marks available traces, every
    other one is refused; the dense kind serves the neurons and no router, the mixture the router and no neurons."""
    model, dense, inputs = laid
    rows = [r for r in model.support().rows if r.host.startswith("layers[") and r.host.endswith("].mlp")]
    shown = sorted({int(r.host[len("layers["):].split("]")[0]) for r in rows})
    assert shown == sorted({dense[0], model.moe_layers[0]})
    for i in shown:
        mine = {r.value: r.status for r in rows if r.host == f"layers[{i}].mlp"}
        if i in dense:
            assert "router_logits" not in mine and mine["mlp_neurons"] == "available"
        else:
            assert mine["router_logits"] == "available" and mine["mlp_neurons"] == "missing"
        host = model.layers[i].mlp
        for name, status in mine.items():
            if status == "available":
                with model.trace(inputs, order="any"):
                    getattr(host, name).save()
            else:
                with pytest.raises(Unavailable):
                    with model.trace(inputs):
                        getattr(host, name).save()


def test_the_periods_and_index_lists_are_structural_options() -> None:
    """The perturbed tiny models draw these options by rule from the config class (nnatlas.testing.layouts)."""
    qwen = structural_options(transformers.Qwen3MoeConfig(**{**T.first_params("qwen3_moe"), "mlp_only_layers": [],
                                                             "decoder_sparse_step": 1}))
    assert qwen["decoder_sparse_step"] == [1, 2] and qwen["mlp_only_layers"] == [[], [0]]
    ernie = structural_options(transformers.Ernie4_5_MoeConfig(**T.first_params("ernie4_5_moe")))
    assert ernie["moe_layer_interval"] == [1, 2]
    from nnatlas.testing.layouts import stack_periods

    moved = stack_periods({"expert_layer_period": 1, "expert_layer_offset": 2, "attn_layer_period": 8})
    assert moved == {"expert_layer_period": 2, "expert_layer_offset": 1}  # (a period above 1 is kept)


def test_the_printout_shows_each_kinds_values_on_its_blocks(laid: Any) -> None:
    """print(model): a block's children show the values of that block's kind (the mixture's router on a mixture
    block, the dense MLP's neurons on a dense one; before, a kind's host showed no values at all)."""
    model, dense, _ = laid
    text = str(model)
    blocks = text.split("Qwen3NextDecoderLayer(" if "Qwen3Next" in text else "DecoderLayer(")[1:]
    dense_part = next(b for b in blocks if "SparseMoeBlock" not in b.split("(input_layernorm)")[0])
    moe_part = next(b for b in blocks if "SparseMoeBlock" in b.split("(input_layernorm)")[0])
    assert "(mlp_neurons) -> Neurons" in dense_part and "(router_logits)" not in dense_part.split("(input_layernorm)")[0]
    assert "(router_logits) -> RouterLogits" in moe_part


def test_a_hybrids_printout_shows_its_mixers_values() -> None:
    model = T.shared_build("jamba")
    text = str(model)
    assert "(attention_queries) -> Queries" in text and "(state_output) ->" in text


def test_a_shipped_family_picked_by_model_type_is_checked_against_the_tree() -> None:
    """wrap(model) with no family= and no check= holds the tree against the shipped spec too: a block whose MLP is a
    class no kind of the spec names is refused, with what to do next (before, a shipped family picked by its model
    type was served unchecked)."""
    tiny = T.tiny_of("qwen3_moe", None)
    hf = getattr(transformers, tiny["model_class"])(getattr(transformers, tiny["config_class"])(
        **T.first_params("qwen3_moe"))).eval()
    hf.model.layers[1].mlp = torch.nn.Identity()  # a mixture block, by the config
    with pytest.raises(nnatlas.NnatlasError, match=r"(?s)the spec names class Qwen3MoeSparseMoeBlock, the module is "
                       r"Identity \(on layers\[1\]\.mlp\).*the shipped spec does not describe this model's layout: "
                       r"`nnatlas draft qwen3_moe --config FOLDER --out FILE`.*check=False serves it unchecked"):
        nnatlas.wrap(hf)
    assert nnatlas.wrap(hf, check=False).family == "qwen3_moe"
