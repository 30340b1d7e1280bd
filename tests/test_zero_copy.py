"""Saving a value copies nothing: a traced forward that saves every standard value allocates
exactly the bytes the plain forward allocates, and saved tensors are the model's own storage."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nnatlas
from nnatlas.testing.suite import Allocations, build, draw_inputs, standard_values


@pytest.mark.parametrize("family", sorted(nnatlas.all_families()))
def test_saving_every_value_allocates_nothing(family: str) -> None:
    model = build(family, attn_implementation="eager")
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 2, 5, [0, 1], seed=3)
    # values of a call with images need image inputs: this test feeds a text prompt
    values = standard_values(model, derived=False, needs_images=False)
    # a value the spec declares a copy (copy: true: a tensor the forward changes in place later,
    # Falcon's MLP output) is a copy by its definition
    values = [v for v in values if not (v._spec is not None and v._spec.copy)]
    assert len(values) > 10
    with torch.no_grad(), Allocations() as plain:
        model.native(**inputs)
    # once before measuring: the op dispatch builds its tables on first use in a process (small
    # probe tensors), which is no cost of saving a value
    with model.trace(inputs, order="any"):
        [v.save() for v in values]
    with Allocations() as traced, model.trace(inputs, order="any"):
        saved = [v.save() for v in values]
    tensors = [s for s in saved if isinstance(s, torch.Tensor)]
    assert len(tensors) > 10 and all(t.numel() for t in tensors)
    assert traced.bytes == plain.bytes, f"the trace allocated {traced.bytes - plain.bytes} bytes beyond the forward"


@pytest.mark.parametrize("family", sorted(nnatlas.all_families()))
def test_saved_values_share_the_models_storage(family: str) -> None:
    """In one forward, a plain forward hook and a saved value see the same memory."""
    model = build(family)
    inputs = draw_inputs(int(model.normalized_config["vocab_size"]), 1, 4, [0], seed=2)
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(model.layers):
        def hook(mod: Any, args: Any, out: Any, i: int = i) -> None:
            seen[i] = out if isinstance(out, torch.Tensor) else out[0]
        handles.append(layer._module.register_forward_hook(hook))
    try:
        with model.trace(inputs):
            saved = [layer.layer_output.save() for layer in model.layers]  # output[0] where the block returns a tuple
    finally:
        for h in handles:
            h.remove()
    for i, s in enumerate(saved):
        s = s if isinstance(s, torch.Tensor) else s.value
        s = s if isinstance(s, torch.Tensor) else s[0]
        assert s.data_ptr() == seen[i].data_ptr()
        assert s.untyped_storage().data_ptr() == seen[i].untyped_storage().data_ptr()
