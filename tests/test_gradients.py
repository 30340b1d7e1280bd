"""trace(grad=True): saved values in the graph, .grad after backward, differentiable edits, the
docs/concepts.md's steering example; and without grad=True, saves without autograd as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import nnatlas
from nnatlas import testing as T

CONCEPTS = Path(__file__).resolve().parent.parent / "docs" / "concepts.md"


def _inputs(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return T.draw_inputs(model.vocab_size, 2, 6, [0, 2], seed=3)


def test_without_grad_saves_carry_no_history() -> None:
    model = T.build("llama")
    with model.trace(_inputs(model)):
        out = model.layers[0].layer_output.save()
        logits = model.logits.save()
    assert out.grad_fn is None and not out.requires_grad and logits.grad_fn is None


def test_grad_mode_off_around_the_trace_wins() -> None:
    model = T.build("llama")
    with torch.no_grad(), model.trace(_inputs(model), grad=True):
        logits = model.logits.save()
    assert logits.grad_fn is None


def test_saved_values_fill_grad_views_included() -> None:
    model = T.build("llama")
    with model.trace(_inputs(model), grad=True):
        out0 = model.layers[0].layer_output.save()
        in1 = model.layers[1].layer_input.save()
        q = model.layers[1].self_attn.attention_queries.save()  # a per-head view
        logits = model.logits.save()
    logits[0, -1, 3].backward()
    assert out0.grad is not None and q.grad is not None and logits.grad is not None
    torch.testing.assert_close(out0.grad, in1.grad, rtol=0, atol=0)  # one tensor, one gradient
    assert out0.grad[:, -1].abs().sum() > 0 and logits.grad.sum() == 1
    assert all(p.grad is not None for p in model.native.parameters() if p.requires_grad and p.dim() > 1)


def test_backward_twice_accumulates_like_autograd() -> None:
    model = T.build("llama")
    with model.trace(_inputs(model), grad=True):
        out = model.layers[0].layer_output.save()
        logits = model.logits.save()
    logits[0, -1, 3].backward(retain_graph=True)
    first = out.grad.clone()
    logits[0, -1, 3].backward()
    torch.testing.assert_close(out.grad, 2 * first)


def test_an_edit_by_a_function_of_another_value_carries_its_gradient() -> None:
    model = T.build("llama")
    scale = torch.tensor(1.0, requires_grad=True)
    with model.trace(_inputs(model), grad=True):
        model.layers[1].mlp.mlp_output = model.layers[0].mlp.mlp_output * scale
        logits = model.logits.save()
    logits.sum().backward()
    assert scale.grad is not None and scale.grad != 0


def test_the_manual_steering_example_runs() -> None:
    """docs/concepts.md's steering vector: three optimizer steps through trace(grad=True) lower the loss."""
    text = CONCEPTS.read_text()
    section = text.split("## Gradients", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/concepts.md's Gradients section has no example"
    model = T.build("llama")
    namespace = {"model": model, "prompt": T.PROMPT, "torch": torch, "nnatlas": nnatlas}
    exec(compile(code[0], "docs/concepts.md (Gradients)", "exec"), namespace)  # noqa: S102
    steer = namespace["steer"]
    assert steer.grad is not None and steer.abs().sum() > 0

    def loss(steering: torch.Tensor) -> float:
        with model.trace(T.PROMPT):
            model.layers[0].layer_output = model.layers[0].layer_output + steering
            logits = model.logits.save()
        return float(-logits[0, -1].log_softmax(-1)[1])
    assert loss(steer.detach()) < loss(torch.zeros_like(steer))


def test_edits_under_grad_reach_the_logits_as_without() -> None:
    """An edit gives the same logits with grad=True as without, also of a tensor its op keeps for
    the backward (the softmax's output: edited on a copy in its place), and the backward runs."""
    model = T.build("llama")
    edits = {
        "zero a head's pattern": lambda m: m.layers[0].self_attn.attention_probabilities.__setitem__(
            (slice(None), 0), 0.0),
        "scale the pattern": lambda m: setattr(m.layers[0].self_attn, "attention_probabilities",
                                               m.layers[0].self_attn.attention_probabilities * 0.5),
        "zero an mlp_output row": lambda m: m.layers[0].mlp.mlp_output.__setitem__(0, 0.0),
    }
    for what, edit in edits.items():
        results = []
        for grad in (False, True):
            with model.trace(_inputs(model), grad=grad):
                edit(model)
                logits = model.logits.save()
            results.append(logits)
        torch.testing.assert_close(results[1].detach(), results[0], msg=what)
        results[1].sum().backward()
        with model.trace(_inputs(model)):
            plain = model.logits.save()
        assert not torch.equal(plain, results[0]), f"{what}: the edit did not reach the logits"


@pytest.mark.parametrize("family, traces, kinds, kernels", [
    ("llama", 105, tuple(T.SOAK_KINDS), False),  # dense
    ("qwen3_moe", 42, tuple(T.SOAK_KINDS), False),  # a mixture of experts
    ("qwen3_5_text", 28, tuple(T.SOAK_KINDS), False),  # hybrid: DeltaNet and attention blocks
    ("qwen3_5_text", 6, ("every", "every+backward"), True),  # its per-token step, saved at every token
])
def test_grad_traces_leave_nothing_alive(family: str, traces: int, kinds: tuple[str, ...], kernels: bool) -> None:
    """Once the saves are dropped, nothing of a grad=True trace's graph stays alive, with or without
    a backward, with or without edits: no autograd node of any trace's graph (each node tagged,
    weakly referenced), no saved tensor, and no more live tensors (gc) after the soak than before.
    (A hook on the forward's tensor that held the saved view kept every traced graph alive: a cycle
    through autograd's C++ nodes that Python's collector cannot see.)"""
    soak = T.grad_soak(T.build(family), traces, kinds=kinds, kernels=kernels)
    assert not soak.leaks(), f"{family}: after {traces} grad traces, alive: {'; '.join(soak.leaks())}"
    assert soak.tensors <= 2, f"{family}: {soak.tensors} more live tensors after {traces} grad traces"
