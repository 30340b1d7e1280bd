"""What a trace reuses from the traces before it (its plan of wrappers, its targets, the checks of its inputs)
is reused only while the model it was made on is unchanged: a module swapped, the attention implementation
changed or a PEFT adapter put in between two traces gives a second trace the values of the model as it is
now. And what the fixed-cost cuts skip (the torch function stack where no op is counted, the OS hold where
one signal is wrapped) is skipped only where nothing can need it."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch

import nnatlas
from nnatlas.testing import build, draw_inputs, first_params
from nnatlas.trace import interrupts, op_scopes
from nnatlas.trace.installers import installer_of

PARAMS = {**first_params("llama"), "num_hidden_layers": 2}


def _inputs(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return draw_inputs(int(model.normalized_config["vocab_size"]), 1, 6, [0], seed=3)


def _hooked(root: torch.nn.Module, modules: list[torch.nn.Module], inputs: dict[str, torch.Tensor],
            **kwargs: Any) -> tuple[list[torch.Tensor], Any]:
    """Each module's output (its first element when a tuple) from torch forward hooks, and the output."""
    seen: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda _m, _a, o: seen.append(o[0] if isinstance(o, tuple) else o))
               for m in modules]
    try:
        with torch.no_grad():
            out = root(**inputs, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen, out


def _save(model: nnatlas.AtlasModel, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    with model.trace(inputs):
        mlp = model.layers[1].mlp.mlp_output.save()
        out = model.layers[1].layer_output.save()
    return mlp, out


def test_a_module_swapped_between_traces_is_the_one_served() -> None:
    model = build("llama", PARAMS, attn_implementation="sdpa")
    inputs = _inputs(model)
    block = model.native.model.layers[1]
    first = _save(model, inputs)
    assert len(installer_of(model).plans) == 1
    torch.manual_seed(7)
    block.mlp = type(block.mlp)(model.native.config)  # new weights: another MLP output, another block output
    second = _save(model, inputs)
    want, _ = _hooked(model.native, [block.mlp, block], inputs)
    for got, expected, before in zip(second, want, first, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        assert not torch.equal(got, before)
    # then the block list itself (``model.layers`` is found again), then a block (its host is found again)
    config = model.native.config
    for swap in (lambda: setattr(model.native.model, "layers", torch.nn.ModuleList(
                     type(block)(config, i) for i in range(config.num_hidden_layers))),
                 lambda: model.native.model.layers.__setitem__(1, type(block)(config, 1))):
        before = _save(model, inputs)
        swap()
        got = _save(model, inputs)
        new_block = model.native.model.layers[1]
        want, _ = _hooked(model.native, [new_block.mlp, new_block], inputs)
        for value, expected, old in zip(got, want, before, strict=True):
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
            assert not torch.equal(value, old)


def test_an_attention_implementation_changed_between_traces_is_served_as_it_is_now() -> None:
    """The probabilities under eager (the softmax's own output), then under sdpa (recomputed from the call's
    arguments: the plan's call handler decides on each call, under the name the call is routed by), then eager
    again: each equal to what eager attention returns."""
    model = build("llama", PARAMS, attn_implementation="eager")
    inputs = _inputs(model)
    _, out = _hooked(model.native, [], inputs, output_attentions=True)
    expected = out.attentions[1]
    seen = []
    for impl in ("eager", "sdpa", "eager"):
        model.native.set_attn_implementation(impl)
        with model.trace(inputs):
            probs = model.layers[1].self_attn.attention_probabilities.save()
            layer = model.layers[1].layer_output.save()
        torch.testing.assert_close(probs, expected, rtol=1e-6, atol=1e-7)
        assert model.native.config._attn_implementation == impl
        seen.append(layer)
    torch.testing.assert_close(seen[1], seen[0], rtol=1e-5, atol=1e-6)  # (sdpa's own sums)
    torch.testing.assert_close(seen[2], seen[0], rtol=0, atol=0)


def test_a_peft_adapter_put_in_between_traces_is_in_the_second() -> None:
    peft = pytest.importorskip("peft")
    model = build("llama", PARAMS, attn_implementation="sdpa")
    inputs = _inputs(model)
    first = _save(model, inputs)
    config = peft.LoraConfig(target_modules=["down_proj"], r=4, lora_alpha=8, init_lora_weights=False)
    torch.manual_seed(5)
    wrapped = peft.get_peft_model(model.native, config)  # (LoRA layers put into the same modules, in place)
    block = model.native.model.layers[1]
    want, _ = _hooked(wrapped, [block.mlp, block], inputs)
    for atlas in (model, nnatlas.wrap(wrapped, tokenizer=model.tokenizer)):  # the model wrapped before, and anew
        for got, expected, before in zip(_save(atlas, inputs), want, first, strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
            assert not torch.equal(got, before)


def test_a_mode_left_by_an_op_scope_is_taken_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that counts ops measures the torch function stack before its forward, and takes away a mode
    an interrupt left on it (between the mode's push and its ``with``); a plan of boundaries only has none
    to measure."""
    model = build("llama", PARAMS, attn_implementation="eager")
    inputs = _inputs(model)
    monkeypatch.setattr(op_scopes, "FORCE_OP_MODE", True)  # (every op read through an OpMode)

    def enter_then_interrupted(self: op_scopes.OpMode) -> op_scopes.OpMode:
        torch._C._push_on_torch_function_stack(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(op_scopes.OpMode, "__enter__", enter_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        with model.trace(inputs):
            model.layers[0].self_attn.attention_scores.save()
    assert torch._C._len_torch_function_stack() == 0
    monkeypatch.undo()
    with model.trace(inputs):
        layer = model.layers[0].layer_output.save()
    plan = next(iter(installer_of(model).plans.values()))
    assert layer.shape[-1] == model.hidden_size and torch._C._len_torch_function_stack() == 0
    assert not plan.scoped


def test_one_wrapped_signal_that_lands_as_it_is_put_back_reaches_its_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT alone wrapped (no OS hold): a Ctrl-C right after its handler is put back raises KeyboardInterrupt
    from the trace, once; one deferred in the same section goes with it, not to the next trace."""
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN)  # (only SIGINT has a handler)
    model = build("llama", PARAMS, attn_implementation="sdpa")
    inputs = _inputs(model)
    restore = interrupts._restore
    held: list[object] = []

    def restore_then_interrupted() -> None:
        interrupts._pending.append((int(signal.SIGINT), None))  # (one deferred earlier in the closing section)
        restore()
        signal.raise_signal(signal.SIGINT)  # (as if Ctrl-C came just now: the original handler raises)

    monkeypatch.setattr(interrupts, "_restore", restore_then_interrupted)
    monkeypatch.setattr(interrupts, "_hold", lambda: held.append(1))
    with pytest.raises(KeyboardInterrupt):
        with model.trace(inputs):
            model.layers[1].layer_output.save()
    assert held == [] and interrupts._pending == [] and not interrupts.installed()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.undo()
    with model.trace(inputs):  # nothing left over reaches the next trace
        out = model.layers[1].layer_output.save()
    assert out.numel()
