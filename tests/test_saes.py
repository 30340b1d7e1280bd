"""model.value(sae): an SAE's own hook name resolves to the standard value there, checked against the SAE (its
d_in, no reshaping of its own), each refusal one line naming the hook; a hybrid's hook on an attention block is
that block's attention (not the other kind's mixer). A minimal class with sae-lens's interface stands in here
(cfg.metadata.hook_name, encode, decode); the cookbook runs sae-lens's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import nnatlas
from nnatlas.errors import UnknownName
from nnatlas.testing import build


class TinySAE(torch.nn.Module):
    def __init__(self, hook_name: str, d_in: int, d_sae: int, reshape: str = "none"):
        super().__init__()
        self.cfg = SimpleNamespace(d_in=d_in, d_sae=d_sae, reshape_activations=reshape,
                                   metadata=SimpleNamespace(hook_name=hook_name))
        g = torch.Generator().manual_seed(d_sae)
        self.W_enc = torch.nn.Parameter(torch.randn(d_in, d_sae, generator=g) * 0.3)
        self.W_dec = torch.nn.Parameter(torch.randn(d_sae, d_in, generator=g) * 0.3)
        self.b_dec = torch.nn.Parameter(torch.randn(d_in, generator=g) * 0.1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu((x - self.b_dec) @ self.W_enc)

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.W_dec + self.b_dec


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return build("llama")


def test_the_sae_splices_by_its_hook_name(llama: nnatlas.AtlasModel) -> None:
    sae = TinySAE("blocks.1.hook_resid_post", llama.hidden_size, 3 * llama.hidden_size)
    assert llama.value(sae).label == "layers[1].layer_output"
    with torch.no_grad():
        with llama.trace("the eiffel tower"):
            clean = llama.layers[1].layer_output.save()
            clean_logits = llama.logits.save()
        with llama.trace("the eiffel tower"):
            x = llama.value(sae)
            features = sae.encode(x).save()
            x[:] = sae.decode(sae.encode(x))
            logits = llama.logits.save()
        handle = llama.native.model.layers[1].register_forward_hook(lambda m, a, o: sae.decode(sae.encode(o)))
        try:
            by_hand = llama.native(**llama.tokenizer("the eiffel tower", return_tensors="pt")).logits
        finally:
            handle.remove()
    torch.testing.assert_close(features, sae.encode(clean), atol=0, rtol=0)
    torch.testing.assert_close(logits, by_hand, atol=0, rtol=0)  # the same splice as a hand-written hook
    assert not torch.equal(logits, clean_logits)


def test_an_sae_that_does_not_fit_is_refused_in_one_line(llama: nnatlas.AtlasModel) -> None:
    heads = llama.num_heads * llama.head_dim
    cases = [
        (TinySAE("blocks.0.attn.hook_z", heads, 4, reshape="hook_z"),
         r"^blocks\.0\.attn\.hook_z: this SAE reshapes its input itself \(reshape_activations='hook_z'.*"
         r"layers\[0\]\.self_attn\.attention_head_outputs is \[batch seq num_heads head_dim\]"),
        (TinySAE("blocks.1.hook_resid_post", llama.hidden_size + 1, 4),
         rf"^blocks\.1\.hook_resid_post: this SAE reads d_in={llama.hidden_size + 1} features, but layers\[1\]\.layer_output"
         rf" \(Residual \[batch seq hidden_size\]\) has hidden_size={llama.hidden_size}"),
        (TinySAE("blocks.9.hook_resid_post", llama.hidden_size, 4),
         r"^blocks\.9\.hook_resid_post: the hook this SAE reads has no standard value on llama"),
        (SimpleNamespace(cfg=SimpleNamespace(metadata=SimpleNamespace(hook_name=None))), "has no hook name"),
    ]
    for sae, message in cases:
        with pytest.raises(UnknownName, match=message) as info:
            llama.value(sae)
        assert "\n" not in str(info.value)


def test_a_hybrids_attention_hook_is_its_attention_block() -> None:
    model = build("qwen3_5_text")
    kinds = model.layer_kinds
    full = kinds.index("attention")
    linear = kinds.index("linear_attention")
    assert model.value(f"blocks.{full}.attn.hook_z").label == f"layers[{full}].self_attn.attention_head_outputs"
    assert model.value(f"blocks.{full}.attn.hook_pattern").label == f"layers[{full}].self_attn.attention_probabilities"
    assert model.value(f"blocks.{linear}.attn.hook_z").label == f"layers[{linear}].linear_attn.attention_head_outputs"
