"""What a saved value costs, counted rather than timed (``make bench`` times it): the Python calls
nnatlas makes per value in the forward, the torch function modes it enters, and the objects a
trace leaves to the garbage collector."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nnatlas.errors import Unavailable
from nnatlas.testing.suite import build, draw_inputs, first_params, standard_values
from nnatlas.trace import conditions, op_scopes, sites
from nnatlas.trace.tracer import Tracer
from nnatlas.tree.targets import ModelTargets

RUNTIME = str(Path(sites.__file__).parent.parent)  # runtime/, every room


@contextmanager
def runtime_calls_in_forward() -> Iterator[list[str]]:
    """The names of the nnatlas runtime functions called while traced forwards run (``Tracer._forward``)."""
    calls: list[str] = []
    forward = Tracer._forward

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(RUNTIME) and frame.f_code.co_name != "_forward":
            calls.append(frame.f_code.co_qualname)

    def counted(self: Tracer) -> Any:
        sys.setprofile(profile)
        try:
            return forward(self)
        finally:
            sys.setprofile(None)

    Tracer._forward = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        Tracer._forward = forward  # type: ignore[method-assign]


def _llama(layers: int = 3, attn: str = "sdpa") -> Any:
    # the tiny config's drawn entries with `layers` blocks (params given alone would replace them all:
    # LlamaConfig's defaults, a 4096-wide model of 4 GB at 3 blocks, 11 GB at 12)
    model = build("llama", {**first_params("llama"), "num_hidden_layers": layers}, attn_implementation=attn)
    assert model.hidden_size <= 64
    return model, draw_inputs(int(model.normalized_config["vocab_size"]), 1, 8, [0], seed=1)


@pytest.mark.parametrize("layers", [3, 12])
def test_a_layer_output_costs_one_wrapper_call_and_one_serve(layers: int) -> None:
    model, inputs = _llama(layers)
    with runtime_calls_in_forward() as calls, model.trace(inputs):
        saved = [layer.output.save() for layer in model.layers]
    assert all(s.shape[-2] == 8 for s in saved)
    # per layer: the wrapper of its forward, and the tracer serving the one request there; nothing else (the model
    # itself is called directly, with its inputs)
    wrapper, serve = "SiteInstaller._wrap_forward.<locals>.forward", "Tracer.serve"
    assert sorted(calls) == sorted([wrapper, serve] * layers)


def test_an_empty_trace_runs_no_nnatlas_code_in_the_forward() -> None:
    model, inputs = _llama()
    with runtime_calls_in_forward() as calls, model.trace(inputs):
        pass
    assert calls == []  # (the model itself is called directly, with its inputs)


def test_standard_values_of_llama_enter_no_torch_function_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every standard value of llama is served by a wrapper, an interface handler or a swapped torch
    callable: none sends each torch call of its scope through Python (``OpMode``)."""
    model, inputs = _llama(attn="eager")
    modes: list[set[str]] = []
    init: Callable[..., None] = op_scopes.OpMode.__init__

    def spy(self: op_scopes.OpMode, wanted: set[str], serve: Any) -> None:
        modes.append(wanted)
        init(self, wanted, serve)

    monkeypatch.setattr(op_scopes.OpMode, "__init__", spy)
    values = standard_values(model, needs_images=False)
    with runtime_calls_in_forward() as calls, model.trace(inputs, order="any"):
        saved = [v.save() for v in values]
    assert len(saved) > 50 and modes == []
    # and the forward's nnatlas calls stay few per value (wrappers, serving, the attention handler,
    # the swapped softmax and dropout): measured 3.7 per value
    assert len(calls) <= 4 * len(values), f"{len(calls)} runtime calls for {len(values)} values"


def test_a_trace_leaves_nothing_to_the_garbage_collector() -> None:
    """A trace makes no reference cycles (an op scope's entry frame, a derived value and its inputs):
    what it allocated goes with its last reference, not at a collection, which would also keep the
    forward's tensors alive until then."""
    model, inputs = _llama(attn="eager")
    values = standard_values(model, needs_images=False)
    assert any(v._read.kind == "derived" for v in values)

    def trace() -> None:
        with model.trace(inputs, order="any"):
            [v.save() for v in values]

    trace()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        trace()
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_a_value_with_a_load_condition_saved_again_skips_target_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value saved before, with a load condition (``needs: eager``), takes the save's fast path: no
    target resolution, and whether the load serves it asked once per trace for each (read point,
    condition, config). The answer is not kept across traces: a load that stops serving the condition
    raises at the save."""
    model, inputs = _llama(attn="eager")
    values = [v for v in standard_values(model, needs_images=False) if v._spec is not None and v._spec.needs]
    assert len(values) >= 3

    def trace() -> list[Any]:
        with model.trace(inputs, order="any"):
            return [v.save() for v in values]

    first = trace()
    trace()  # (a handle keeps its target from its second resolution)
    configs = {(id(v._read), id(v._spec.needs),  # (transformers gives each layer its own config view)
                id(getattr(v._target().module, "config", None) or model.config)) for v in values}
    asked: list[str] = []
    resolved: list[str] = []
    why, target = ModelTargets._why_unavailable, ModelTargets._target

    def counted_why(self: ModelTargets, value: Any, edit: bool = False) -> Any:
        asked.append(value.label)
        return why(self, value, edit)

    def counted_target(self: ModelTargets, value: Any, edit: bool = False) -> Any:
        resolved.append(value.label)
        return target(self, value, edit)

    monkeypatch.setattr(ModelTargets, "_why_unavailable", counted_why)
    monkeypatch.setattr(ModelTargets, "_target", counted_target)
    again = trace()
    assert resolved == [] and sorted(asked) == sorted(set(asked)) and len(asked) == len(configs)
    assert all(a.equal(b) for a, b in zip(first, again, strict=True))
    monkeypatch.setattr(conditions, "load_met", lambda *args: False)
    with pytest.raises(Unavailable, match="is unavailable"), model.trace(inputs, order="any"):
        values[0].save()


@contextmanager
def runtime_calls() -> Iterator[list[str]]:
    """The names of the nnatlas runtime functions called inside the block."""
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(RUNTIME):
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_a_value_saved_again_runs_no_other_nnatlas_function() -> None:
    """The save's fast path: a value saved before (here a block's output, and a value read in a child
    module: its path walked again) makes its holder and its request inline, in ``Value.save`` alone
    (no target resolution, no holder helper, no ``Tracer.add``)."""
    model, inputs = _llama()
    values = [model.layers[1].layer_mid, model.layers[1].layer_output]  # (layer_mid: at post_attention_layernorm)
    for _ in range(2):  # (a handle keeps its target from its second resolution)
        with model.trace(inputs):
            [v.save() for v in values]
    with model.trace(inputs):
        with runtime_calls() as calls:
            saved = [v.save() for v in values]
    assert calls == ["Value.save", "Value.save"]
    assert saved[0].shape[-2] == 8 and saved[1].shape[-2] == 8  # (served)


def test_a_derived_value_saved_again_looks_nothing_up() -> None:
    """A derived value saved again finds its inputs' handles kept (no attribute lookup on a host, no
    ``Tracer.add``): what runs is the save, the derived path and each input's cached target."""
    model, inputs = _llama()
    derived = [v for v in standard_values(model, needs_images=False) if v._read.kind == "derived"]
    assert derived
    for _ in range(2):
        with model.trace(inputs, order="any"):
            [v.save() for v in derived]
    with model.trace(inputs, order="any"):
        with runtime_calls() as calls:
            saved = [v.save() for v in derived]
    deps = sum(len(v._spec.read.deps) for v in derived)
    assert not any(c.endswith("__getattr__") or c == "Tracer.add" or "config" in c for c in calls), calls
    assert calls.count("Value._derived") == len(derived) and calls.count("ModelTargets._target") == deps
    # per value: save, label (twice), the holder (and a Box's __init__), _derived; per input: its target
    assert len(calls) <= len(derived) * 6 + deps, calls
    assert all(s is not None for s in saved)


def test_a_block_list_found_before_is_one_lookup() -> None:
    """``model.layers`` again: the root's attribute lookup goes to the child it found before, before
    any config entry or block-kind lookup."""
    model, _ = _llama()
    layers = model.layers
    with runtime_calls() as calls:
        again = model.layers
    assert again is layers and calls == ["ModelTree.__getattr__"]  # (the child's lookup inlined there)


def test_the_common_tracer_holds_what_init_would_give_it() -> None:
    """``model.trace``'s common tracer (body order, no grad) is made without ``Tracer.__init__`` (``Tracer._plain``):
    it must hold the same attributes, with the same values, as ``__init__`` gives it, so that the two cannot drift."""
    model, inputs = _llama()
    made = model.trace(inputs)
    assert type(made) is Tracer
    init = Tracer(model, None, "strict", False, inputs=made.inputs, call=made._call)
    assert made.__dict__.keys() == init.__dict__.keys(), (made.__dict__.keys(), init.__dict__.keys())
    for name, value in init.__dict__.items():
        assert made.__dict__[name] is value or made.__dict__[name] == value, name
    assert type(model.trace(inputs, order="any")) is Tracer and not model.trace(inputs, order="any").strict


def test_a_trace_finds_its_token_count_only_when_asked() -> None:
    """``model.trace(...)`` reads no size of the inputs: the token count ``tracer.iter`` walks is
    found the first time it is asked (most traces never ask)."""
    model, inputs = _llama()
    tracer = model.trace(inputs)
    assert tracer._tokens is None
    assert tracer.calls == inputs["input_ids"].shape[1] == 8 and tracer._tokens == 8


def test_a_trace_makes_its_condition_records_only_when_a_value_has_a_condition() -> None:
    """A trace whose values have no load condition makes no record of conditions asked or found served
    (two containers less per trace); one with such a value makes them on its first save."""
    model, inputs = _llama(attn="eager")
    with model.trace(inputs) as tracer:
        model.layers[0].layer_output.save()
    assert "conditions" not in vars(tracer) and "available" not in vars(tracer)
    value = next(v for v in standard_values(model, needs_images=False) if v._spec is not None and v._spec.needs)
    with model.trace(inputs) as tracer:
        value.save()
    assert vars(tracer)["conditions"] and "available" not in vars(tracer)  # (first save: the full path asks)
    with model.trace(inputs) as tracer:
        value.save()
    with model.trace(inputs) as tracer:
        value.save()
    assert vars(tracer)["available"]  # (a save again: the fast path records the condition as served)
