"""A model as it comes: a PEFT (LoRA) model is served with its adapter; a compiled one is refused in one line
before anything compiles."""

from __future__ import annotations

import pytest
import torch

import nnatlas
from nnatlas.errors import InputError
from nnatlas.testing import build

peft = pytest.importorskip("peft")

PROMPT = "the eiffel tower is in"


def _lora(seed: int = 0) -> tuple[torch.nn.Module, object]:
    """A tiny llama with a LoRA adapter on q_proj (random A and B: its delta is not zero), and the tokenizer."""
    base = build("llama", seed=seed)
    config = peft.LoraConfig(target_modules=["q_proj"], r=4, lora_alpha=8, init_lora_weights=False)
    torch.manual_seed(seed + 1)
    return peft.get_peft_model(base.native, config), base.tokenizer


def _native(peft_model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_proj's output in layers[0], layers[1]'s output, the logits) of a plain forward of the PeftModel."""
    inner = peft_model.base_model.model
    seen: dict[str, torch.Tensor] = {}
    hooks = [inner.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, a, o: seen.setdefault("q", o)),
             inner.model.layers[1].register_forward_hook(lambda m, a, o: seen.setdefault("layer", o))]
    try:
        with torch.no_grad():
            logits = peft_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    finally:
        for h in hooks:
            h.remove()
    return seen["q"], seen["layer"], logits


def _traced(model: nnatlas.AtlasModel, inputs: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with model.trace(inputs):
        q = model.layers[0].self_attn.q_proj.output.save()
        layer = model.layers[1].layer_output.save()
        logits = model.logits.save()
    return q, layer, logits


def test_a_lora_model_serves_the_values_of_its_own_forward_adapter_included() -> None:
    peft_model, tok = _lora()
    model = nnatlas.wrap(peft_model, tokenizer=tok)
    assert model.family == "llama" and model.peft is peft_model and model.native is peft_model.base_model.model
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    expected = _native(peft_model, ids)
    for inputs in (PROMPT, ids, {"input_ids": ids}, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}):
        for got, want in zip(_traced(model, inputs), expected):
            assert torch.equal(got, want)
    # the adapter's delta is in q_proj's output (the base layer alone gives another value)
    with model.trace(PROMPT):
        x = model.layers[0].self_attn.q_proj.input.save()
        q = model.layers[0].self_attn.q_proj.output.save()
    lora_q = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        base_q = lora_q.base_layer(x)
        delta = lora_q.lora_B["default"](lora_q.lora_A["default"](x)) * lora_q.scaling["default"]
    assert not torch.allclose(q, base_q)
    torch.testing.assert_close(q, base_q + delta)
    # generation runs through the PeftModel too: its tokens and each step's logits
    with model.generate(PROMPT, max_new_tokens=2) as tracer:
        steps = [model.logits.save() for _ in tracer.iter[0:2]]
    ref = peft_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                              do_sample=False, pad_token_id=tok.pad_token_id, output_logits=True,
                              return_dict_in_generate=True)
    assert torch.equal(tracer.output, ref.sequences)
    for got, want in zip(steps, ref.logits):
        torch.testing.assert_close(got[:, -1], want, atol=1e-5, rtol=1e-4)


def test_disabled_merged_and_unloaded_adapters() -> None:
    peft_model, tok = _lora()
    model = nnatlas.wrap(peft_model, tokenizer=tok)
    plain = build("llama")  # the same weights without the adapter
    _, _, with_adapter = _traced(model, PROMPT)
    _, _, without = _traced(plain, PROMPT)
    with peft_model.disable_adapter():
        q, layer, logits = _traced(model, PROMPT)
    assert torch.equal(logits, without) and not torch.allclose(logits, with_adapter)
    peft_model.merge_adapter()
    _, _, merged = _traced(model, PROMPT)
    torch.testing.assert_close(merged, with_adapter, atol=1e-5, rtol=1e-4)
    peft_model.unmerge_adapter()
    unloaded = nnatlas.wrap(peft_model.merge_and_unload(), tokenizer=tok)
    assert unloaded.peft is None
    torch.testing.assert_close(_traced(unloaded, PROMPT)[2], with_adapter, atol=1e-5, rtol=1e-4)


def test_a_prompt_learning_adapter_is_refused() -> None:
    base = build("llama")
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    with pytest.raises(InputError, match="virtual tokens"):
        nnatlas.wrap(peft.get_peft_model(base.native, config), tokenizer=base.tokenizer)


def _never(gm: torch.fx.GraphModule, example_inputs: object) -> object:
    raise AssertionError("torch.compile ran: nnatlas should have refused the compiled model before the forward")


def test_compiled_models_are_refused_before_anything_compiles() -> None:
    base = build("llama")
    hf, tok = base.native, base.tokenizer
    with pytest.raises(InputError, match=r"torch\.compile.*wrap the uncompiled model, compiled\._orig_mod"):
        nnatlas.wrap(torch.compile(hf, backend=_never), tokenizer=tok)
    with pytest.raises(InputError, match=r"torch\.compile"):
        nnatlas.families.llama.wrap(torch.compile(hf, backend=_never), tokenizer=tok)
    fresh = build("llama").native
    fresh.model.layers[1].compile(backend=_never)
    with pytest.raises(InputError, match=r"layers\.1 is compiled in place"):
        nnatlas.wrap(fresh, tokenizer=tok)
    # compiled in place after it was wrapped: the trace refuses, before the forward
    model = nnatlas.wrap(hf, tokenizer=tok)
    hf.compile(backend=_never)
    try:
        with pytest.raises(InputError, match=r"compiled in place"):
            with model.trace(PROMPT):
                model.logits.save()
        with pytest.raises(InputError, match=r"compiled in place"):
            with model.generate(PROMPT, max_new_tokens=1):
                model.logits.save()
        with pytest.raises(InputError, match=r"compiled in place"):
            nnatlas.wrap(hf, tokenizer=tok)
    finally:
        hf._compiled_call_impl = None
    _traced(model, PROMPT)  # (uncompiled again: it traces)


def test_a_peft_model_compiled_in_place_after_wrapping_is_refused_at_the_trace() -> None:
    peft_model, tok = _lora()
    model = nnatlas.wrap(peft_model, tokenizer=tok)
    peft_model.compile(backend=_never)
    with pytest.raises(InputError, match=r"compiled in place"):
        with model.trace(PROMPT):
            model.logits.save()
