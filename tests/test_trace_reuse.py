"""A trace laid out as an earlier one takes the tracer's short path (``Tracer._execute``: the plan reused, and
``serve``'s short path where every request is a plain save of a site of its own). What it gives must be what the
first trace of the same body gave: the same values, the same errors (out of order, never reached), the same
order rules, and nothing left on the model afterwards."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nnatlas.errors import NotReached, OutOfOrderError
from nnatlas.testing.suite import build, draw_inputs, first_params
from nnatlas.trace import interrupts, op_scopes, sites
from nnatlas.trace.installers import installer_of
from nnatlas.trace.requests import Request

from .test_cost import runtime_calls


@pytest.fixture(scope="module")
def llama() -> tuple[Any, dict[str, torch.Tensor]]:
    model = build("llama", {**first_params("llama"), "num_hidden_layers": 2}, attn_implementation="sdpa")
    return model, draw_inputs(int(model.normalized_config["vocab_size"]), 1, 6, [0], seed=2)


def _outputs(model: Any, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _a, o: seen.append(o[0] if isinstance(o, tuple) else o))
               for layer in model.native.model.layers]
    try:
        with torch.no_grad():
            model.native(**inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _clean(model: Any) -> None:
    assert all("forward" not in m.__dict__ for m in model.native.modules())
    assert model._tracer is None and not model._lock._is_owned() and not interrupts.installed()
    assert not op_scopes.patched_ops() and not sites.registered_names()
    live = installer_of(model).live
    assert live.mine is None and live.by_site == {}


def test_reused_saves_are_the_values_of_the_first_trace(llama: Any) -> None:
    model, inputs = llama
    want = _outputs(model, inputs)
    for order in ("strict", "any"):
        for _ in range(3):  # (the first builds the plan, the others reuse it)
            with model.trace(inputs, order=order) as tracer:
                got = [layer.layer_output.save() for layer in model.layers]
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert type(got[0]) is torch.Tensor and not got[0].__dict__
            _clean(model)
        assert tracer._saves  # (the last one took serve's short path)


def test_a_reused_trace_out_of_order_raises_as_the_first_did(llama: Any) -> None:
    model, inputs = llama
    messages = []
    for _ in range(3):
        with pytest.raises(OutOfOrderError) as info, model.trace(inputs):
            model.layers[1].layer_output.save()
            model.layers[0].layer_output.save()
        messages.append(str(info.value))
        _clean(model)
    assert len(set(messages)) == 1 and "layers[0].layer_output is computed before" in messages[0]
    with model.trace(inputs, order="any"):  # the same body, in any order: served
        late = model.layers[1].layer_output.save()
        early = model.layers[0].layer_output.save()
    want = _outputs(model, inputs)
    torch.testing.assert_close(early, want[0], rtol=0, atol=0)
    torch.testing.assert_close(late, want[1], rtol=0, atol=0)


def test_a_reused_trace_whose_site_never_fires_says_so(llama: Any) -> None:
    """The MLP's activation as a function (its module never called): the first trace builds the plan, the
    second reuses it; both say the activation's read point never fired."""
    model, inputs = llama
    mlp = model.native.model.layers[0].mlp

    def forward(x: torch.Tensor) -> torch.Tensor:
        return mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

    mlp.forward = forward
    messages = []
    try:
        for _ in range(3):
            with pytest.raises(NotReached) as info, model.trace(inputs):
                model.layers[0].mlp.mlp_activation.save()
                model.layers[1].layer_output.save()
            messages.append(str(info.value))
            assert "forward" in mlp.__dict__ and all("forward" not in m.__dict__ for m in model.native.model.layers)
    finally:
        del mlp.forward
    assert len(set(messages)) == 1 and messages[0].startswith("layers[0].mlp.mlp_activation was never computed")
    _clean(model)


def test_two_saves_of_one_site_and_an_edit_reuse_the_plan_and_serve_each(llama: Any) -> None:
    model, inputs = llama
    want = _outputs(model, inputs)
    for _ in range(3):
        with model.trace(inputs) as tracer:
            a = model.layers[0].layer_output.save()
            b = model.layers[0].layer_output.save()
        assert not tracer._saves  # (two requests at one site: the general serve)
        torch.testing.assert_close(a, want[0], rtol=0, atol=0)
        torch.testing.assert_close(b, want[0], rtol=0, atol=0)
        _clean(model)
    with model.trace(inputs):
        mid = model.layers[0].layer_mid.save()
    for _ in range(3):  # an edit of a module's output: the short path, the general serve
        with model.trace(inputs):
            model.layers[0].mlp.mlp_output[:] = 0
            out = model.layers[0].layer_output.save()
        torch.testing.assert_close(out, mid, rtol=0, atol=0)  # (the MLP's output zeroed: the block gives its input)
        _clean(model)


def test_a_module_swapped_in_gets_a_new_plan_on_the_short_path(llama: Any) -> None:
    """The plan the short path reuses is checked on every trace: a block swapped in between two traces
    (the tree changed) is wrapped afresh, and its values are the new block's."""
    model, inputs = llama
    installer = installer_of(model)
    for _ in range(2):
        with model.trace(inputs):
            model.layers[1].layer_output.save()
    (key,) = [k for k in installer.plans if len(k[0]) == 1 and k[0][0].module == id(model.native.model.layers[1])]
    plan = installer.plans[key]
    layers = model.native.model.layers
    old = layers[1]
    torch.manual_seed(3)
    layers[1] = type(old)(model.native.config, 1)
    try:
        with model.trace(inputs):
            got = model.layers[1].layer_output.save()
        torch.testing.assert_close(got, _outputs(model, inputs)[1], rtol=0, atol=0)
        assert all(p is not plan for p in installer.plans.values())  # (a new plan, for the new block)
        _clean(model)
    finally:
        layers[1] = old


def test_a_forward_patched_between_reused_traces_is_the_one_run(llama: Any) -> None:
    """The short path checks the plan it reuses: a block whose class forward, or whose own ``forward``, was
    patched since the plan was built is wrapped afresh, and the value saved is what the patched forward gives."""
    model, inputs = llama
    block = model.native.model.layers[1]
    cls = type(block)
    original = cls.forward
    for _ in range(2):
        with model.trace(inputs):
            model.layers[1].layer_output.save()

    def doubled(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        return out * 2 if isinstance(out, torch.Tensor) else (out[0] * 2, *out[1:])

    want = _outputs(model, inputs)[1]
    cls.forward = doubled  # type: ignore[method-assign]  # (every block's: block 1 reads block 0's doubled output too)
    try:
        patched = _outputs(model, inputs)[1]
        assert not torch.equal(patched, want)
        for _ in range(2):
            with model.trace(inputs):
                got = model.layers[1].layer_output.save()
            torch.testing.assert_close(got, patched, rtol=0, atol=0)
            _clean(model)
    finally:
        cls.forward = original  # type: ignore[method-assign]
    block.forward = lambda *args, **kwargs: original(block, *args, **kwargs) * 3  # (the instance's own, as accelerate puts)
    try:
        with model.trace(inputs):
            got = model.layers[1].layer_output.save()
        torch.testing.assert_close(got, want * 3, rtol=0, atol=0)
        assert "forward" in block.__dict__ and block.__dict__["forward"] is not None
    finally:
        del block.forward
    _clean(model)


def test_a_trace_recorded_as_the_one_before_is_replayed_with_no_request_and_no_plan_made(
        llama: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The structure that makes the fixed cost of a trace: a body that saves what the trace before it saved
    (plain saves, each at a site of its own) records no Request, builds no plan and groups nothing; the
    tracer finds the earlier trace's replay by its targets and runs it (nnatlas.trace.replay). Its values
    are the first trace's, and nothing is left on the model."""
    model, inputs = llama
    want = _outputs(model, inputs)

    def body() -> list[torch.Tensor]:
        with model.trace(inputs):
            saved = [model.layers[0].layer_output.save(), model.layers[1].layer_output.save()]
        return saved

    for _ in range(3):  # (the first builds the plan, the second leaves its replay)
        body()
    made: list[str] = []
    init = Request.__init__

    def counted(self: Request, *args: Any, **kwargs: Any) -> None:
        made.append(args[1])
        init(self, *args, **kwargs)

    monkeypatch.setattr(Request, "__init__", counted)
    with runtime_calls() as calls:
        got = body()
    assert made == [], made
    general = ("SiteInstaller.install", "SiteInstaller.reuse", "SiteInstaller._build", "Tracer._materialize",
               "Tracer._execute_general")
    assert "execute" in calls and not [c for c in calls if c in general], calls
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert type(got[0]) is torch.Tensor and not got[0].__dict__
    _clean(model)
    with model.trace(inputs):  # another body: the general way again (requests made), and served
        other = model.layers[1].layer_output.save()
    assert made == ["layers[1].layer_output"]
    torch.testing.assert_close(other, want[1], rtol=0, atol=0)
