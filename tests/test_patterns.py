"""Attention patterns under sdpa and flex attention (runtime/trace/patterns.py): recomputed only when read,
not editable, in the autograd graph of the queries and keys; flex attention's BlockMask in eager's
form. (Every family's generated tests compare the recomputed pattern with eager's under sdpa and, uncompiled,
flex attention: nnatlas.testing.flex.)"""

from __future__ import annotations

import sys

import pytest
import torch

import nnatlas
from nnatlas import testing as T
from nnatlas.trace import op_scopes, patterns


def _inputs(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return T.draw_inputs(model.vocab_size, 2, 6, [0, 2], seed=3)


def _count_eager(monkeypatch: pytest.MonkeyPatch, model: nnatlas.AtlasModel) -> list[int]:
    """Count the calls of the family's eager attention function (looked up at each call)."""
    module = sys.modules[type(model.native.model.layers[0].self_attn).__module__]
    original = module.eager_attention_forward
    calls = [0]

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", counted)
    return calls


def test_recomputed_only_when_a_pattern_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    model = T.build("llama", attn_implementation="sdpa")
    calls = _count_eager(monkeypatch, model)
    with model.trace(_inputs(model)):
        model.layers[0].self_attn.attention_queries.save()
        model.logits.save()
    assert calls[0] == 0
    with model.trace(_inputs(model)):
        p = model.layers[1].self_attn.attention_probabilities.save()
    assert calls[0] == 1 and p.shape[-2:] == (6, 6)  # block 1 only
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    assert float(p[1, :, 3, :2].abs().max()) == 0.0  # the second row's two pad tokens are masked


def test_edit_under_sdpa_names_eager_and_support_says_recomputed() -> None:
    model = T.build("llama", attn_implementation="sdpa")
    attn = model.layers[0].self_attn
    with pytest.raises(nnatlas.Unavailable, match="attn_implementation='sdpa'.*attn_implementation=\"eager\""):
        with model.trace(_inputs(model)):
            attn.attention_probabilities[:] = 0
    assert attn.attention_scores.unavailable() is None
    rows = {r.value: r for r in model.support().rows if r.host == "layers[0].self_attn"}
    assert rows["attention_scores"].status == "available"
    assert rows["attention_scores"].why.startswith(patterns.RECOMPUTED_WORDS)
    assert "recomputed under sdpa" in repr(model.support())
    eager = T.build("llama", attn_implementation="eager")
    with eager.trace(_inputs(eager)):  # under eager the same edit is the forward's
        eager.layers[0].self_attn.attention_probabilities[:] = 0
        logits = eager.logits.save()
    assert logits.isfinite().all()


def test_gradients_flow_through_the_recomputed_pattern() -> None:
    """Under grad=True a backward from the recomputed pattern reaches the queries and keys: the same
    gradients as from eager's pattern of the same block (block 0: the same queries and keys)."""
    grads = {}
    for impl in ("eager", "sdpa"):
        model = T.build("llama", attn_implementation=impl)
        attn = model.layers[0].self_attn
        with model.trace(_inputs(model), grad=True):
            q = attn.attention_queries.save()
            k = attn.attention_keys.save()
            p = attn.attention_probabilities.save()
        assert p.grad_fn is not None
        (p[:, :, -1] * torch.arange(6.0)).sum().backward()
        assert q.grad is not None and k.grad is not None and q.grad.abs().sum() > 0
        grads[impl] = (q.grad, k.grad)
    torch.testing.assert_close(grads["sdpa"], grads["eager"], rtol=0, atol=1e-6)


def test_flex_block_mask_in_eager_form() -> None:
    """A flex attention BlockMask (causal, with left padding) becomes eager's additive mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    pad = torch.tensor([[True] * 6, [False, False, True, True, True, True]])

    def mask_mod(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return (kv_idx <= q_idx) & pad[b, kv_idx]

    block = create_block_mask(mask_mod, 2, None, 6, 6, device="cpu")
    query, key = torch.zeros(2, 3, 6, 4), torch.zeros(2, 1, 6, 4)
    ours = patterns.eager_mask(block, query, key, torch.nn.Module(), None)
    assert ours is not None and ours.shape == (2, 3, 6, 6)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril() & pad[:, None, None, :]
    expected = torch.zeros(2, 1, 6, 6).masked_fill(~allowed, torch.finfo(torch.float32).min)
    assert torch.equal(ours, expected.expand(2, 3, 6, 6))


def test_sdpa_masks_in_eager_form() -> None:
    """None (causal when the call has several queries and the module is causal), boolean, additive."""
    q, k = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4)
    causal = torch.nn.Module()
    lowest = torch.finfo(torch.float32).min
    got = patterns.eager_mask(None, q, k, causal, None)
    assert got is not None and torch.equal(got == 0, torch.ones(3, 5, dtype=torch.bool).tril()[None, None])
    assert patterns.eager_mask(None, q[:, :, :1], k, causal, None) is None  # one query: sdpa masks nothing
    assert patterns.eager_mask(None, q, k, causal, False) is None  # is_causal=False (an encoder)
    boolean = torch.tensor([[[[True, False, True, True, False]]]])
    assert torch.equal(patterns.eager_mask(boolean, q, k, causal, None), torch.where(boolean, 0.0, lowest))
    additive = torch.randn(1, 1, 3, 5)
    assert patterns.eager_mask(additive, q, k, causal, None) is additive


def test_vision_pattern_recomputed_under_sdpa() -> None:
    """A vision encoder's attention (no mask, not causal: CLIP in LLaVA) is recomputed too: equal to
    eager's on the same images (block 0: the same queries and keys)."""
    from PIL import Image

    images = [Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (32, 16), (0, 0, 255))]
    got = {}
    for impl in ("eager", "sdpa"):
        model = T.build("llava", attn_implementation=impl)
        attn = model.vision.layers[0].self_attn  # type: ignore[attr-defined]
        with torch.no_grad(), model.trace(T.PROMPT, images=images):
            scores = attn.attention_scores.save()
            probs = attn.attention_probabilities.save()
        got[impl] = (scores, probs)
    assert got["sdpa"][1].shape[0] == 2
    torch.testing.assert_close(got["sdpa"], got["eager"], rtol=0, atol=1e-6)


def _flex_state() -> tuple[object, ...]:
    import torch.nn.attention.flex_attention as torch_flex
    import transformers.integrations.flex_attention as fa
    import transformers.masking_utils as masking

    return (fa.WrappedFlexAttention.__dict__.get("_instance"), masking.create_block_mask, fa.create_block_mask,
            torch_flex.create_block_mask, torch_flex.flex_attention, torch_flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG)


def test_uncompiled_flex_attention_restores_what_it_changed() -> None:
    """Inside, transformers' singleton hands out torch's uncompiled flex_attention, block masks are
    built uncompiled and torch runs the operator without tracing it; after, on success and on error,
    the singleton and the globals are what they were (also a singleton transformers made before, whose
    fields stay untouched)."""
    import transformers.integrations.flex_attention as fa
    import transformers.masking_utils as masking
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    before = _flex_state()
    with T.uncompiled_flex_attention():
        assert fa.WrappedFlexAttention(False)() is flex_attention
        assert fa.WrappedFlexAttention(True)() is flex_attention  # training or not: never compiled
        block = masking.create_block_mask(lambda b, h, q, k: k <= q, None, None, 4, 4, device="cpu")
        assert isinstance(block, BlockMask)
    assert _flex_state() == before
    with pytest.raises(KeyError), T.uncompiled_flex_attention():
        raise KeyError("inside")
    assert _flex_state() == before
    made = fa.WrappedFlexAttention(False)  # the singleton transformers makes (compiles lazily: nothing runs)
    fields = dict(vars(made))
    try:
        with T.uncompiled_flex_attention():
            assert fa.WrappedFlexAttention(False) is not made
        assert fa.WrappedFlexAttention.__dict__["_instance"] is made and vars(made) == fields
    finally:
        fa.WrappedFlexAttention._instance = before[0]  # type: ignore[misc]
    assert _flex_state() == before


def test_gpt_oss_sinks_are_refused_under_flex_on_cpu() -> None:
    """Why gpt_oss has no flex pattern test: transformers refuses attention sinks under flex on CPU."""
    from nnatlas.testing import flex

    assert flex.REFUSED_ON_CPU in nnatlas.families.gpt_oss.FAMILY.traits  # type: ignore[attr-defined]
    assert T.recomputed_pattern_loads("gpt_oss") == ()
    with T.uncompiled_flex_attention():
        model = T.build("gpt_oss", attn_implementation="flex_attention")
        with pytest.raises(ValueError, match="Attention sinks cannot be run on CPU with flex attention"):
            model.native(**_inputs(model))


def test_generated_pattern_test_exactly_where_a_load_recomputes() -> None:
    """The compiler renders test_pattern_recomputed_equals_eager for a family exactly when the tests
    recompute its pattern under some load (no empty parametrization: that would be a skip)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "generated" / "tests"
    for family in nnatlas.all_families():
        has = "def test_pattern_recomputed_equals_eager" in (root / f"test_{family}.py").read_text()
        assert has == bool(T.recomputed_pattern_loads(family)), family


def test_falcon_pattern_recomputed_from_its_own_sdpa_call() -> None:
    """Falcon calls scaled_dot_product_attention itself under sdpa (recompute: sdpa): a trace that reads
    the pattern serves eager's softmax computed from that call's arguments (multi-query: one key head),
    bit for bit eager's on block 0 (the same queries and keys), with padding; the forward's output is the
    sdpa call's, and nothing stays swapped."""

    inputs = _inputs(T.build("falcon", attn_implementation="eager"))
    got = {}
    for impl in ("eager", "sdpa"):
        model = T.build("falcon", attn_implementation=impl)
        attn = model.layers[0].self_attn
        with torch.no_grad(), model.trace(dict(inputs)):
            got[impl] = (attn.attention_scores.save(), attn.attention_probabilities.save(), model.logits.save())
        assert op_scopes.patched_ops() == []
    sdpa = T.build("falcon", attn_implementation="sdpa")
    with torch.no_grad(), sdpa.trace(dict(inputs)):
        plain = sdpa.logits.save()
    scores, probs, logits = got["sdpa"]
    assert torch.equal(logits, plain)  # reading the pattern leaves the forward alone
    assert probs.shape == (2, sdpa.num_heads, 6, 6)
    hidden = got["eager"][0] <= torch.finfo(torch.float32).min / 2
    assert torch.equal(hidden, scores <= torch.finfo(torch.float32).min / 2) and hidden[1, :, :, :2].all()
    assert torch.equal(scores.masked_fill(hidden, 0), got["eager"][0].masked_fill(hidden, 0))
    assert torch.equal(probs, got["eager"][1])


def test_falcon_with_alibi_is_not_recomputed_under_sdpa() -> None:
    """The alibi branch (not in the spec's tiny configs) scales after adding alibi: a read under sdpa says so."""
    params = {**T.first_params("falcon"), "alibi": True}
    model = T.build("falcon", params, attn_implementation="sdpa")
    with pytest.raises(nnatlas.Unavailable, match="alibi.*attn_implementation='eager'"), model.trace(_inputs(model)):
        model.layers[0].self_attn.attention_probabilities.save()  # type: ignore[attr-defined]


@pytest.mark.parametrize("family,loads", [
    ("llama", "attn_implementation='eager' (read in the forward) or 'sdpa' or 'flex_attention' (recomputed from the call)"),
    ("falcon", "attn_implementation='eager' (read in the forward) or 'sdpa' (recomputed from the call)")])
def test_a_load_that_neither_forms_nor_recomputes_the_pattern_names_those_that_do(family: str, loads: str) -> None:
    """Flash attention never forms the pattern and nnatlas does not recompute it there (no GPU here to
    verify a recompute against): a read under it says which loads serve the pattern, before any forward."""
    model = T.build(family, attn_implementation="sdpa")
    model.native.config._attn_implementation_internal = "flash_attention_2"  # what a GPU load sets; never run here
    assert model.native.config._attn_implementation == "flash_attention_2"
    attn = model.layers[0].self_attn
    with pytest.raises(nnatlas.Unavailable) as e, model.trace(_inputs(model)):
        attn.attention_probabilities.save()  # type: ignore[attr-defined]
    assert str(e.value) == (f"layers[0].self_attn.attention_probabilities is unavailable under this load "
                            f"(attn_implementation='flash_attention_2'): it needs {loads}. "
                            f"Fix: load with attn_implementation=\"eager\" (nnatlas.load(..., attn_implementation=\"eager\"))")
