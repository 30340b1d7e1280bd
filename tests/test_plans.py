"""A trace's installation is built once per layout of sites and reused (``installers.Plan``): the
traces after it with the same sites put the same wrappers on and take them off again, and any change
to what a plan was built on (an instance's forward, the class's method, a child module, the attention
implementation) makes the next trace build afresh, serving what the model computes now."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

from nnatlas.testing import build, draw_inputs, first_params
from nnatlas.trace import installers, op_scopes, sites
from nnatlas.trace.installers import installer_of

LAYERS = 2


@pytest.fixture(scope="module")
def llama() -> tuple[Any, dict[str, torch.Tensor]]:
    model = build("llama", {**first_params("llama"), "num_hidden_layers": LAYERS}, attn_implementation="eager")
    return model, draw_inputs(int(model.normalized_config["vocab_size"]), 1, 8, [0], seed=1)


def _save(model: Any, inputs: Any) -> list[torch.Tensor]:
    """Every block's output and attention pattern, and the MLP's output of block 0."""
    with model.trace(inputs, order="any"):
        saved = [v.save() for layer in model.layers for v in (layer.layer_output, layer.self_attn.attention_probabilities)]
        saved.append(model.layers[0].mlp.mlp_output.save())
    return saved


def _reference(model: Any, inputs: Any) -> list[torch.Tensor]:
    """The same values from forward hooks on the modules and eager's own pattern output."""
    got: dict[str, torch.Tensor] = {}
    hf = model.native
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(f"out{i}", o if isinstance(o, torch.Tensor) else o[0]))
             for i, layer in enumerate(hf.model.layers)]
    hooks.append(hf.model.layers[0].mlp.register_forward_hook(lambda m, a, o: got.__setitem__("mlp", o)))
    try:
        with torch.no_grad():
            out = hf(**inputs, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return [t for i in range(LAYERS) for t in (got[f"out{i}"], out.attentions[i])] + [got["mlp"]]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def _nothing_left(model: Any) -> None:
    assert all("forward" not in m.__dict__ for m in model.native.modules())
    assert not op_scopes.patched_ops() and not sites.registered_names()


def test_a_second_trace_reuses_the_first_ones_wrappers(llama: Any) -> None:
    model, inputs = llama
    installer = installer_of(model)
    installer.plans.clear()
    first = _save(model, inputs)
    assert len(installer.plans) == 1
    (plan,) = installer.plans.values()
    finals = [sh.final for sh in plan.shadows.values()]
    _nothing_left(model)
    second = _save(model, inputs)
    assert list(installer.plans.values()) == [plan]
    assert [sh.final for sh in plan.shadows.values()] == finals
    _same(first, _reference(model, inputs))
    _same(second, first)
    _nothing_left(model)


def test_a_trace_keeps_nothing_of_the_trace_alive(llama: Any) -> None:
    model, inputs = llama
    with model.trace(inputs) as tracer:
        model.layers[0].layer_output.save()
    ref = weakref.ref(tracer)
    del tracer
    gc.collect()
    assert ref() is None
    live = installer_of(model).live
    assert live.mine is None and not live.by_site


def test_a_class_forward_patched_between_traces_is_the_one_run(llama: Any) -> None:
    model, inputs = llama
    before = _save(model, inputs)
    cls = type(model.native.model.layers[0].mlp)
    original = cls.forward

    def doubled(self: Any, x: torch.Tensor) -> torch.Tensor:
        return original(self, x) * 2

    cls.forward = doubled
    try:
        after = _save(model, inputs)
    finally:
        cls.forward = original
    torch.testing.assert_close(after[-1], before[-1] * 2, rtol=0, atol=0)
    _same(_save(model, inputs), before)


def test_an_instance_forward_set_between_traces_is_wrapped(llama: Any) -> None:
    model, inputs = llama
    before = _save(model, inputs)
    mlp = model.native.model.layers[0].mlp
    mlp.forward = lambda x: type(mlp).forward(mlp, x) + 1  # (as accelerate puts its hooks on an instance)
    try:
        after = _save(model, inputs)
        assert mlp.__dict__["forward"] is not None
    finally:
        del mlp.forward
    torch.testing.assert_close(after[-1], before[-1] + 1, rtol=0, atol=0)
    _same(_save(model, inputs), before)
    _nothing_left(model)


class _Permuting(torch.nn.Module):
    """A child that calls ``permute`` itself before its wrapped module (the same numbers)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.permute(0, 1, 2))


def test_a_child_put_in_between_traces_is_not_counted_as_its_parents_op() -> None:
    """Falcon reads its head outputs at the attention's own ``permute`` (an op scope over the module's
    forward, whose children's calls are not its ops): a child put in after the plan was built, which
    calls ``permute`` before the attention's own does, is a child too."""
    model = build("falcon", first_params("falcon"), attn_implementation="eager")
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 1, 8, [0], seed=1)
    attn = model.native.transformer.h[0].self_attention

    def heads() -> torch.Tensor:
        with model.trace(inputs):
            saved = model.layers[0].self_attn.attention_head_outputs.save()
        return saved

    before = heads()
    assert heads().shape == before.shape  # (the plan reused)
    old = attn.query_key_value
    attn.query_key_value = _Permuting(old)
    try:
        torch.testing.assert_close(heads(), before, rtol=0, atol=0)
    finally:
        attn.query_key_value = old
    torch.testing.assert_close(heads(), before, rtol=0, atol=0)
    _nothing_left(model)


def test_a_plan_whose_forward_raised_is_built_again(llama: Any) -> None:
    model, inputs = llama
    installer = installer_of(model)
    _save(model, inputs)
    keys = set(installer.plans)
    mlp = model.native.model.layers[0].mlp
    cls = type(mlp)
    original = cls.forward

    def broken(self: Any, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    cls.forward = broken
    try:
        with pytest.raises(RuntimeError, match="boom"):
            _save(model, inputs)
    finally:
        cls.forward = original
    _nothing_left(model)
    assert set(installer.plans) <= keys  # the failed trace's plan was dropped
    _same(_save(model, inputs), _reference(model, inputs))


def test_plans_are_bounded(llama: Any) -> None:
    model, inputs = llama
    installer = installer_of(model)
    installer.plans.clear()
    names = ("layer_input", "layer_output", "layer_mid", "attention_norm_output", "mlp_norm_output")
    layouts = [(i, name) for i in range(LAYERS) for name in names]  # 10 layouts of one value, then pairs
    layouts += [(0, a, b) for a in names for b in names if a < b]
    assert len(layouts) > installers.PLANS_KEPT
    for layer, *values in layouts:
        with model.trace(inputs, order="any"):
            for name in values:
                getattr(model.layers[layer], name).save()
    assert len(installer.plans) == installers.PLANS_KEPT
    _nothing_left(model)


def test_an_attention_implementation_changed_between_traces(llama: Any) -> None:
    """The pattern read under eager, then under sdpa (recomputed), then eager again: the same values."""
    model, inputs = llama
    eager = _save(model, inputs)
    model.native.set_attn_implementation("sdpa")
    try:
        _same(_save(model, inputs)[1::2], eager[1::2])
    finally:
        model.native.set_attn_implementation("eager")
    _same(_save(model, inputs), eager)
    _nothing_left(model)


def test_falcon_pattern_read_under_eager_then_under_sdpa() -> None:
    """Falcon's pattern is read at the softmax in its own forward; under sdpa the plan recomputes it
    from the sdpa call (``recompute: sdpa``), a choice made when the plan is built: a load changed
    between two traces builds afresh."""
    model = build("falcon", first_params("falcon"), attn_implementation="eager")
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 1, 8, [0], seed=1)

    def pattern() -> torch.Tensor:
        with model.trace(inputs):
            saved = model.layers[0].self_attn.attention_probabilities.save()
        return saved

    eager = pattern()
    config = model.native.config  # (Falcon's class takes no set_attn_implementation: its forward reads the config)
    config._attn_implementation = "sdpa"
    try:
        torch.testing.assert_close(pattern(), eager, rtol=0, atol=0)
    finally:
        config._attn_implementation = "eager"
    torch.testing.assert_close(pattern(), eager, rtol=0, atol=0)
    _nothing_left(model)


def test_a_module_replaced_between_traces_is_dropped_by_the_next_build(llama: Any) -> None:
    """A plan holds the modules it wraps; once one is replaced in the model, the next trace that builds a
    plan drops the plans holding a module no longer in the model, so that no plan keeps the old module
    (its weights) alive. Here the swap in drops the plan of the original, and the swap back (a layout
    built again) the plan of the copy."""
    model, inputs = llama
    installer = installer_of(model)
    layer = model.native.model.layers[0]
    original = layer.mlp
    copy = type(original)(original.config)
    copy.load_state_dict(original.state_dict())
    with model.trace(inputs):
        before = model.layers[0].mlp.mlp_output.save()
    layer.mlp = copy
    try:
        with model.trace(inputs):
            after = model.layers[0].mlp.mlp_output.save()
    finally:
        layer.mlp = original
    torch.testing.assert_close(after, before, rtol=0, atol=0)

    def holding(module: torch.nn.Module) -> int:
        return sum(id(module) in p.modules for p in installer.plans.values())

    assert holding(copy) == 1 and holding(original) == 0
    with model.trace(inputs):
        again = model.layers[0].mlp.mlp_output.save()
    torch.testing.assert_close(again, before, rtol=0, atol=0)
    assert holding(copy) == 0 and holding(original) == 1
    _nothing_left(model)


def test_modules_swapped_in_and_out_in_a_loop_are_freed(llama: Any) -> None:
    """An ablation loop that puts a new module in, traces, and puts the original back: nothing of
    nnatlas' keeps the modules it swapped in (neither the plans nor the cache of resolved targets, which
    holds one entry per value, not per module)."""
    model, inputs = llama
    layer = model.native.model.layers[0]
    original = layer.mlp
    with model.trace(inputs):
        model.layers[0].mlp.mlp_output.save()
    entries = len(model._targets_cache)
    refs = []
    for _ in range(3):
        copy = type(original)(original.config)
        refs.append(weakref.ref(copy))
        layer.mlp = copy
        try:
            with model.trace(inputs):
                model.layers[0].mlp.mlp_output.save()
        finally:
            layer.mlp = original
        del copy
        with model.trace(inputs):
            model.layers[0].mlp.mlp_output.save()
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert len(model._targets_cache) == entries
    _nothing_left(model)
