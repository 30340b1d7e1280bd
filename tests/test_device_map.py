"""``nnatlas.load(..., device_map=...)``: a model placed by accelerate, some blocks offloaded.

Built through a local save_pretrained / from_pretrained round trip (nothing is downloaded).
Offloaded blocks carry accelerate's AlignDevicesHook (their weights live on disk or in CPU
memory and are brought in for each forward); our hooks sit beside it. Every standard value
still reads and edits, comes back on the device it was computed on, and matches the model
loaded without a device map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import nnatlas
from nnatlas.testing.suite import build, draw_inputs, standard_values

pytest.importorskip("accelerate")


def _saved_values(model: Any, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    handles = standard_values(model)
    with model.trace(inputs, order="any"):
        saved = {h.label: (h, h.save()) for h in handles}
    return saved


def _execution_device(module: torch.nn.Module) -> torch.device:
    """Where accelerate runs ``module``: its own hook's execution device, else its parent's."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    params = list(module.parameters(recurse=False))
    return params[0].device if params else torch.device("cpu")


def _hook_counts(root: torch.nn.Module) -> list[tuple[str, int, int, Any]]:
    """Each module's hooks, and the forward on the instance (accelerate's; a trace wraps it and puts it back)."""
    return [(n, len(m._forward_hooks), len(m._forward_pre_hooks), m.__dict__.get("forward"))
            for n, m in root.named_modules()]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    params = {**nnatlas.testing.suite.first_params("llama"), "num_hidden_layers": 4}
    model = build("llama", params, attn_implementation="eager", seed=5)
    path = tmp_path_factory.mktemp("llama_ckpt")
    model.native.save_pretrained(path)
    return path


DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.layers.3": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


def test_offloaded_blocks_read_and_edit_like_the_plain_model(checkpoint: Path, tmp_path: Path) -> None:
    from accelerate.hooks import AlignDevicesHook

    ref = nnatlas.load(str(checkpoint), tokenizer=None, attn_implementation="eager")
    placed = nnatlas.load(str(checkpoint), tokenizer=None, attn_implementation="eager",
                          device_map=DEVICE_MAP, offload_folder=str(tmp_path / "offload"))
    assert placed.family == "llama"
    offloaded = [i for i, layer in enumerate(placed.native.model.layers)
                 if any(isinstance(getattr(m, "_hf_hook", None), AlignDevicesHook) and m._hf_hook.offload
                        for m in layer.modules())]
    assert offloaded == [1, 3], "accelerate did not offload the blocks the device map names"
    assert placed.native.model.layers[1].mlp.down_proj.weight.device == torch.device("meta")  # on disk
    hooks_before = _hook_counts(placed.native)
    inputs = draw_inputs(int(ref.normalized_config["vocab_size"]), 2, 6, [0, 2], seed=4)

    want = _saved_values(ref, inputs)
    got = _saved_values(placed, inputs)
    assert set(got) == set(want) and len(got) > 40
    for label, (handle, value) in got.items():
        value = value.value if isinstance(value, nnatlas.Box) else value
        expected = want[label][1]
        expected = expected.value if isinstance(expected, nnatlas.Box) else expected
        if isinstance(value, torch.Tensor):
            module = handle._host._module
            assert value.device == _execution_device(module), label
            torch.testing.assert_close(value, expected, msg=lambda m, label=label: f"{label}: {m}")
        else:
            assert value == expected, label

    # no hook of ours is left beside accelerate's, and accelerate's are still in place
    assert _hook_counts(placed.native) == hooks_before
    assert all(isinstance(getattr(m, "_hf_hook", None), AlignDevicesHook)
               for m in placed.native.model.layers[1].modules() if list(m.parameters(recurse=False)))

    # edits reach the model on offloaded blocks, and both models agree on the result
    for model in (ref, placed):
        with model.trace(inputs):
            for i in offloaded:
                model.layers[i].self_attn.attention_output = lambda x: x * 0.5
                model.layers[i].mlp.mlp_output[:] = 0
            edited = model.logits.save()
        model._edited = edited  # type: ignore[attr-defined]
    torch.testing.assert_close(placed._edited, ref._edited)  # type: ignore[attr-defined]
    with placed.trace(inputs):
        plain = placed.logits.save()
    assert not torch.equal(plain, placed._edited)  # type: ignore[attr-defined]
    torch.testing.assert_close(plain, want["logits"][1])
