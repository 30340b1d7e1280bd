"""nnatlas.patching by hand, beyond the generated per-family check (testing.check_sweep): other values, the order
asked, the fallback said once per call, nothing left on the model, the progress bar, attribute against the
cookbook's recipe, and one-line errors."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
import torch

from nnatlas import InputError, UnknownName, patching
from nnatlas.patching import activation
from nnatlas.testing import suite as T


@pytest.fixture(scope="module")
def llama() -> Any:
    return T.build("llama", {"num_hidden_layers": 3}, seed=3)


@pytest.fixture(scope="module")
def prompts(llama: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return T.sweep_prompts(int(llama.normalized_config["vocab_size"]), seq=7)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 5] - logits[:, -1, 9] + logits[:, 2, 5]


def untouched(model: Any) -> None:
    for module in model.native.modules():
        assert "forward" not in module.__dict__, type(module).__name__
        assert not module._forward_hooks and not module._forward_pre_hooks, type(module).__name__


@pytest.mark.parametrize("value", ["attention_output", "mlp.mlp_output", "self_attn.attention_head_outputs"])
def test_inner_values_equal_the_loop(llama: Any, prompts: Any, value: str) -> None:
    clean, corrupt = prompts
    swept = patching.sweep(llama, clean, corrupt, value=value, metric=metric, batch_size=4)
    torch.testing.assert_close(swept, patching.loop(llama, clean, corrupt, value=value, metric=metric), atol=1e-5, rtol=0)
    assert swept.shape == (3, 7)
    untouched(llama)


def test_a_hybrids_attention_output_is_each_blocks_mixers(prompts: Any) -> None:
    """qwen3_5_text: attention_output is linear_attn's on DeltaNet blocks, self_attn's on attention blocks."""
    model = T.shared_build("qwen3_5_text", perturbed=True)
    clean, corrupt = T.sweep_prompts(int(model.normalized_config["vocab_size"]), seq=5)
    swept = patching.sweep(model, clean, corrupt, value="attention_output", metric=metric, positions=[1, -1])
    torch.testing.assert_close(swept, patching.loop(model, clean, corrupt, value="attention_output", metric=metric,
                                                    positions=[1, -1]), atol=1e-5, rtol=0)
    assert swept.shape == (model.num_layers, 2)


def test_layers_and_positions_in_the_order_asked(llama: Any, prompts: Any) -> None:
    clean, corrupt = prompts
    full = patching.sweep(llama, clean, corrupt, metric=metric)
    part = patching.sweep(llama, clean, corrupt, metric=metric, layers=[2, 0], positions=[-1, 1], batch_size=1)
    torch.testing.assert_close(part, full[[2, 0]][:, [6, 1]], atol=1e-5, rtol=0)


def test_the_fallback_is_said_once_per_call() -> None:
    model = T.shared_build("gemma4_text", perturbed=True)
    clean, corrupt = T.sweep_prompts(int(model.normalized_config["vocab_size"]))
    for _ in range(2):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("default")
            patching.sweep(model, clean, corrupt, metric=metric, positions=[1])
        fallbacks = [w for w in said if issubclass(w.category, patching.SweepFallback)]
        assert len(fallbacks) == 1 and "layers[0] writes into an object that layers[1] receives" in str(fallbacks[0].message)
    untouched(model)


def test_a_failing_metric_leaves_nothing_behind(llama: Any, prompts: Any) -> None:
    def broken(logits: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        patching.sweep(llama, *prompts, metric=broken)
    untouched(llama)


def test_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    assert activation._progress(False, 10) is None
    import io

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert activation._progress(None, 10) is None
    bar = activation._progress(True, 10)
    assert bar is not None and bar.total == 10
    bar.close()
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # tqdm not installed: no bar, no error
    assert activation._progress(True, 10) is None


def test_attribute_is_the_cookbooks_recipe(llama: Any, prompts: Any) -> None:
    clean, corrupt = prompts
    got = patching.attribute(llama, clean, corrupt, metric=metric, positions=[0, 3, -1])
    with torch.no_grad(), llama.trace(corrupt):
        corrupt_out = [layer.layer_output.save() for layer in llama.layers]
    with llama.trace(clean, grad=True):
        clean_out = [layer.layer_output.save() for layer in llama.layers]
        logits = llama.logits.save()
    metric(logits).sum().backward()
    expected = torch.stack([((c - k) * k.grad)[0].sum(-1)[[0, 3, 6]] for c, k in zip(corrupt_out, clean_out)])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert bool((got != 0).any())
    untouched(llama)


@pytest.mark.parametrize("call,message", [
    (lambda m, a, b: patching.sweep(m, a, b[:, :-1], metric=metric), "clean has 7 tokens and corrupt 6"),
    (lambda m, a, b: patching.sweep(m, ["a b", "c d"], b, metric=metric), "clean: expected one prompt, got 2"),
    (lambda m, a, b: patching.sweep(m, a, b, value="nope", metric=metric), "nope is no block value of llama"),
    (lambda m, a, b: patching.sweep(m, a, b, layers=[3], metric=metric), "layers: 3 is not a block index"),
    (lambda m, a, b: patching.sweep(m, a, b, layers=2, metric=metric), "layers: expected a list of block indices"),
    (lambda m, a, b: patching.sweep(m, a, b, positions=[7], metric=metric), "positions: 7 is outside the prompt's 7"),
    (lambda m, a, b: patching.sweep(m, a, b, positions=[], metric=metric), "positions: an empty list"),
    (lambda m, a, b: patching.sweep(m, a, b), "metric: expected a function of the logits"),
    (lambda m, a, b: patching.sweep(m, a, b, metric=lambda x: x[:, -1]), "metric: expected a tensor of one number per row"),
    (lambda m, a, b: patching.sweep(m, a, b, metric=metric, batch_size=0), "batch_size: expected a positive number"),
    (lambda m, a, b: patching.sweep(m, a, b, metric=metric, progress="yes"), "progress: expected True, False or None"),
    (lambda m, a, b: patching.sweep(m.native, a, b, metric=metric), "expected a model from nnatlas.wrap"),
    (lambda m, a, b: patching.attribute(m, a, b, metric=lambda x: x[:, -1]), "metric: expected a tensor of one number"),
])
def test_bad_input_is_one_line(llama: Any, prompts: Any, call: Any, message: str) -> None:
    with pytest.raises((InputError, UnknownName)) as e:
        call(llama, *prompts)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_causal_true_where_it_is_not_exact() -> None:
    model = T.shared_build("mistral", perturbed=True)  # a sliding window's cache cuts its keys
    clean, corrupt = T.sweep_prompts(int(model.normalized_config["vocab_size"]))
    with pytest.raises(InputError, match="causal=True: mistral cannot reuse the corrupt run's keys and values"):
        patching.sweep(model, clean, corrupt, metric=metric, causal=True)
