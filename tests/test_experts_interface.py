"""The experts interface, child-scoped operations and call dims, on a tiny Qwen3-Next mixture.

Routing through transformers' experts interface must leave nothing behind (registry entries,
config attributes), also when the body or the forward raises; two models must not see each
other's routes; edits of the routing must reach the logits under every implementation.
"""

from __future__ import annotations

import pytest
import torch

import nnatlas
from nnatlas import testing as T
from nnatlas.trace import sites

IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")


def _model(experts: str = "grouped_mm", seed: int = 0) -> nnatlas.AtlasModel:
    return T.build("qwen3_next", experts=experts, seed=seed)


def _inputs(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return T.draw_inputs(int(model.vocab_size), 2, 6, [0, 2], seed=3)


def _implementations(model: nnatlas.AtlasModel) -> set[str | None]:
    return {m.config._experts_implementation for m in model.native.modules() if type(m).__name__.endswith("Experts")}


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_nothing_left_behind(experts: str) -> None:
    model = _model(experts)
    before = _implementations(model)
    with model.trace(_inputs(model)):
        model.layers[0].mlp.expert_weights.save()
        if experts != "eager":
            model.layers[0].mlp.expert_outputs.save()
        model.layers[0].mlp.routed_output.save()
    assert sites.registered_names() == set()
    assert _implementations(model) == before == {experts}


def test_nothing_left_behind_when_the_forward_raises() -> None:
    model = _model()

    def boom(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.trace(_inputs(model)):
            model.layers[0].mlp.expert_outputs.save()
            model.layers[0].mlp.routed_output = boom
    assert sites.registered_names() == set()
    assert _implementations(model) == {"grouped_mm"}
    for m in model.native.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    with model.trace(_inputs(model)):  # and the model still traces
        out = model.layers[0].mlp.expert_outputs.save()
    assert out.shape[2] == model.top_k


def test_the_default_is_grouped_mm_and_it_serves_every_value() -> None:
    model = T.build("qwen3_next")
    assert _implementations(model) == {"grouped_mm"}
    rows = {r.value: r.status for r in model.support().rows if r.host == "layers[0].mlp"}
    assert rows["expert_outputs"] == "available"
    assert rows["mlp_activation"] == rows["mlp_neurons"] == "missing"


def test_two_models_do_not_see_each_others_routes() -> None:
    a, b = _model(seed=0), _model(seed=1)
    inputs = _inputs(a)
    with a.trace(inputs):
        clean_a = a.logits.save()
    with b.trace(inputs):
        clean_b = b.logits.save()
    with a.trace(inputs):
        a.layers[0].mlp.expert_outputs[:] = 0  # routed through a's experts only
        zeroed_a = a.logits.save()
    with b.trace(inputs):
        again_b = b.logits.save()
    assert not torch.equal(clean_a, zeroed_a)
    assert torch.equal(clean_b, again_b)


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_zeroing_one_expert_reaches_the_logits_and_keeps_the_other_slots(experts: str) -> None:
    model = _model(experts)
    moe = model.layers[1].mlp
    inputs = _inputs(model)
    with model.trace(inputs):
        before = moe.expert_weights.save()
        indices = moe.expert_indices.save()
        clean = model.logits.save()
    e = int(indices[0, -1, 0])
    with model.trace(inputs):
        moe.expert_weights = moe.expert_weights.masked_fill(moe.expert_indices == e, 0)
        after = moe.expert_weights.save()
        ablated = model.logits.save()
    hit = indices == e
    assert hit.any()
    assert torch.equal(after[~hit], before[~hit])
    assert bool((after[hit] == 0).all())
    assert not torch.equal(clean, ablated)
    with model.trace(inputs):
        moe.shared_expert_output[:] = 0
        no_shared = model.logits.save()
    assert not torch.equal(clean, no_shared)


@pytest.mark.parametrize("experts", IMPLEMENTATIONS)
def test_routed_plus_shared_is_the_mixture_exactly(experts: str) -> None:
    model = _model(experts)
    inputs = _inputs(model)
    assert model.dense_layers  # (the tiny qwen3_next keeps a dense block among the mixture's: no routed output)
    for i in model.moe_layers:
        moe = model.layers[i].mlp
        with model.trace(inputs):
            routed = moe.routed_output.save()
            shared = moe.shared_expert_output.save()
            out = moe.mlp_output.save()
        assert torch.equal(routed + shared, out)


def test_the_shared_expert_runs_before_the_router() -> None:
    model = _model()
    moe = model.layers[1].mlp
    with pytest.raises(nnatlas.OutOfOrderError) as err:
        with model.trace(_inputs(model)):
            moe.router_logits.save()
            moe.shared_experts.output.save()
    assert err.value.earlier == "layers[1].mlp.router_logits"
    assert err.value.later == "layers[1].mlp.shared_experts.output"
    assert sites.registered_names() == set()
    with model.trace(_inputs(model)):  # the forward's own order is served
        moe.shared_experts.output.save()
        moe.router_logits.save()
        moe.routed_output.save()
        moe.shared_expert_output.save()


def test_an_op_of_the_host_is_counted_in_its_own_forward_only() -> None:
    """op:mul#0 of the mixture is the gate product, whatever muls its children (the experts) run."""
    for experts in IMPLEMENTATIONS:
        model = _model(experts)
        moe = model.layers[0].mlp
        inputs = _inputs(model)
        with model.trace(inputs):
            x = moe.input.save()
            ungated = moe.shared_experts.mlp_output.save()
            shared = moe.shared_expert_output.save()
        gate = torch.sigmoid(moe._module.shared_expert_gate(x))
        assert torch.equal(gate * ungated, shared), experts


def test_call_dims_follow_each_call() -> None:
    model = _model()
    for batch, seq in ((1, 1), (3, 5)):
        ids = torch.randint(4, int(model.vocab_size), (batch, seq))
        with model.trace({"input_ids": ids}):
            logits = model.layers[0].mlp.router_logits.save()
            slots = model.layers[0].mlp.expert_outputs.save()
        assert logits.shape == (batch, seq, model.num_experts)
        assert slots.shape == (batch, seq, model.top_k, model.hidden_size)


def test_hosts_show_the_normalized_config() -> None:
    model = _model()
    assert model.layers[1].mlp.top_k == model.top_k == model.config.num_experts_per_tok
    with pytest.raises(nnatlas.UnknownName):
        model.layers[1].mlp.not_a_value  # noqa: B018
