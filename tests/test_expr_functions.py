"""Every function a spec expression may call: compiled from an identity, evaluated on tensors, and
compared with a direct torch computation (or with transformers' own code: its masks, its delta-rule
kernels, Mamba's selective scan)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers

from nnatlas.compiler.language import expr
from nnatlas.trace import expressions


def evaluate(text: str, values: dict[str, Any]) -> tuple[Any, Any]:
    """Both sides of an identity, computed as the generated adapters compute them."""
    _, lhs, rhs = expr.compile_identity(text)
    scope = {"_fn": expressions}
    return eval(lhs.source, scope, {"v": values}), eval(rhs.source, scope, {"v": values})  # noqa: S307 - compiled spec source


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(2, 3, 5, generator=g), "y": torch.randn(2, 5, 4, generator=g),
            "pos": torch.rand(2, 3, 5, generator=g) + 0.1}


# ---- elementwise and reductions ---------------------------------------------------------------

DIRECT = {
    "tanh": ("tanh(x) == x", lambda v: torch.tanh(v["x"])),
    "silu": ("silu(x) == x", lambda v: v["x"] * torch.sigmoid(v["x"])),
    "gelu": ("gelu(x) == x", lambda v: 0.5 * v["x"] * (1 + torch.erf(v["x"] / 2 ** 0.5))),
    "gelu_tanh": ("gelu(x, approximate='tanh') == x",
                  lambda v: 0.5 * v["x"] * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (v["x"] + 0.044715 * v["x"] ** 3)))),
    "sigmoid": ("sigmoid(x) == x", lambda v: 1 / (1 + torch.exp(-v["x"]))),
    "softplus": ("softplus(x) == x", lambda v: torch.log1p(torch.exp(v["x"]))),
    "exp": ("exp(x) == x", lambda v: torch.exp(v["x"])),
    "log": ("log(pos) == x", lambda v: torch.log(v["pos"])),
    "cumsum": ("cumsum(x, 1) == x", lambda v: torch.stack([v["x"][:, : t + 1].sum(1) for t in range(3)], 1)),
    "cumsum_negative_dim": ("cumsum(x, -1) == x", lambda v: torch.stack([v["x"][..., : t + 1].sum(-1) for t in range(5)], -1)),
    "einsum": ("einsum('bsd,bde->bse', x, y) == x", lambda v: v["x"] @ v["y"]),
    "einsum_ellipsis": ("einsum('...d,...d->...', x, x) == x", lambda v: (v["x"] * v["x"]).sum(-1)),
    "einsum_in_an_expression": ("x[:, 0] + einsum('bsd->bds', x)[:, :, 0] * 2 == x",
                                lambda v: v["x"][:, 0] + v["x"].transpose(1, 2)[:, :, 0] * 2),
}


@pytest.mark.parametrize("case", sorted(DIRECT))
def test_function_against_torch(case: str) -> None:
    text, direct = DIRECT[case]
    v = tensors()
    lhs, _ = evaluate(text, v)
    torch.testing.assert_close(lhs, direct(v), atol=1e-6, rtol=1e-6)


def test_functions_are_the_runtime_helpers() -> None:
    """The one list in expr.py names a helper of nnatlas.trace.expressions for every entry, and nothing else."""
    for name, fn in expr.FUNCTIONS.items():
        assert callable(getattr(expressions, name, None)), f"nnatlas.trace.expressions.{name} is missing"
        assert fn.doc and fn.signature.startswith(f"{name}(")
    for name in expr.CONFIG_FUNCTIONS:
        assert callable(getattr(expressions, f"cfg_{name}", None)), f"nnatlas.trace.expressions.cfg_{name} is missing"


@pytest.mark.parametrize("text,message", [
    ("einsum('ij,jk->ik', x) == y", "equation 'ij,jk->ik' has 2 operand(s), the call gives 1"),
    ("einsum('ij->iz', x) == y", "output letter(s) z appear in no operand"),
    ("einsum('ij->ii', x) == y", "an output letter appears twice"),
    ("einsum('i-j', x) == y", "subscripts are letters and '...'"),
    ("einsum('......i', x) == y", "'...' at most once per operand"),
    ("einsum(x, y) == y", "argument 1 is a string literal"),
    ("gelu(x, approximate='fast') == y", "approximate is one of 'none', 'tanh'"),
    ("sigmoid(x, dim=1) == y", "sigmoid() takes positional arguments only, not keyword 'dim'"),
    ("masked(x, size=3) == y", "masked() takes the keywords window, chunk, sinks, not keyword 'size'"),
    ("cumsum(x) == y", "cumsum() takes 2 positional arguments, got 1: cumsum(x, dim)"),
    ("softplis(x) == y", "unknown function 'softplis'; did you mean 'softplus'? (allowed: abs, cat, chosen_weights, chunk, cumsum"),
])
def test_bad_calls_say_why(text: str, message: str) -> None:
    with pytest.raises(expr.ExprError) as info:
        expr.compile_identity(text)
    assert message in str(info.value)


def test_unknown_function_is_a_spec_error_listing_the_allowed(spec_root: Any) -> None:
    from nnatlas.compiler import SpecError, compile_atlas

    path = spec_root / "specs" / "llama.yaml"
    path.write_text(path.read_text().replace("      - masked(attention_probabilities) == 0",
                                             "      - frobnicate(attention_probabilities) == 0", 1))
    with pytest.raises(SpecError) as info:
        compile_atlas(spec_root / "specs", spec_root)
    (line,) = str(info.value).splitlines()
    allowed = ", ".join(sorted(expr.FUNCTIONS))
    assert line.startswith("specs/llama.yaml:") and line.endswith(f"identity: unknown function 'frobnicate' (allowed: {allowed})")


# ---- masked(): the masks transformers builds ------------------------------------------------------

def _inputs(batch: int = 2, seq: int = 9, left_pad: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :left_pad] = 0
    return ids, mask


def _hidden_count(pattern: torch.Tensor, mask: torch.Tensor) -> int:
    """The zeros of a pattern on real query rows: what the model's mask hid (a softmax gives no other zero)."""
    real = mask[:, None, -pattern.shape[-2]:, None].bool().expand_as(pattern)
    return int(((pattern == 0) & real).sum())


def _identity(text: str, pattern: torch.Tensor, mask: torch.Tensor, **config: Any) -> torch.Tensor:
    lhs, rhs = evaluate(text, {"attention_probabilities": pattern, "attention_mask": mask, **config})
    assert rhs == 0
    return lhs  # type: ignore[no-any-return]


def test_masked_sliding_window_on_a_tiny_mistral() -> None:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=3, attn_implementation="eager")
    torch.manual_seed(0)
    ids, mask = _inputs()
    with torch.no_grad():
        (p,) = MistralForCausalLM(cfg).eval()(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    hidden = _identity("masked(attention_probabilities, window=sliding_window) == 0", p, mask, sliding_window=3)
    assert torch.equal(hidden, torch.zeros_like(hidden))
    assert hidden.numel() == _hidden_count(p, mask)  # exactly the model's mask: no more, no less
    # the causal mask alone hides fewer entries than the model did
    assert _identity("masked(attention_probabilities) == 0", p, mask).numel() < hidden.numel()
    assert _identity("masked(attention_probabilities, window=None) == 0", p, mask).numel() < hidden.numel()


def test_masked_sliding_window_and_sinks_on_a_tiny_gpt_oss() -> None:
    """gpt-oss: sliding and full layers alternate; the softmax runs over the keys plus one sink column."""
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
                       layer_types=["sliding_attention", "full_attention"], attn_implementation="eager")
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).eval()
    ids, mask = _inputs()
    softmaxes: list[torch.Tensor] = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is F.softmax:
                softmaxes.append(out)
            return out

    with torch.no_grad(), Record():
        attentions = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    sliding, full = attentions
    hidden = _identity("masked(attention_probabilities, window=sliding_window) == 0", sliding, mask, sliding_window=3)
    assert hidden.numel() == _hidden_count(sliding, mask) and not hidden.any()
    hidden_full = _identity("masked(attention_probabilities) == 0", full, mask)
    assert hidden_full.numel() == _hidden_count(full, mask) and not hidden_full.any()
    # the softmax output keeps the sink column: with sinks=1 it is never hidden
    with_sink = [s for s in softmaxes if s.shape[-1] == ids.shape[1] + 1]
    assert len(with_sink) == 2
    for s, window in zip(with_sink, (3, None)):
        hidden = _identity("masked(attention_probabilities, window=w, sinks=1) == 0", s, mask, w=window)
        assert hidden.numel() == _hidden_count(s, mask) and not hidden.any()
        assert torch.equal(s[..., :-1], (sliding if window else full))  # the model drops the sink afterwards
    # rows that sum to less than one: the sink took the rest
    assert (sliding.sum(-1)[0] < 1).all()


def test_masked_chunked_attention_on_a_tiny_llama4() -> None:
    """Llama 4's chunked attention: chunks start at each row's first real token (left padding counted)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    cfg = Llama4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64,
                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           num_local_experts=2, attention_chunk_size=3, moe_layers=[], attn_implementation="eager")
    assert cfg.layer_types == ["chunked_attention"]
    torch.manual_seed(0)
    for left_pad in (2, 1):  # the chunks of the padded row shift with its padding
        ids, mask = _inputs(left_pad=left_pad)
        with torch.no_grad():
            (p,) = Llama4ForCausalLM(cfg).eval()(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        hidden = _identity("masked(attention_probabilities, chunk=attention_chunk_size) == 0", p, mask,
                           attention_chunk_size=3)
        assert hidden.numel() == _hidden_count(p, mask) and not hidden.any()
        assert _identity("masked(attention_probabilities) == 0", p, mask).numel() < hidden.numel()


def test_masked_matches_transformers_mask_functions() -> None:
    """Position by position, against the mask functions transformers' masks are built from."""
    from transformers import masking_utils as mu

    q = k = 7
    mask = torch.ones(2, k, dtype=torch.long)
    mask[1, :3] = 0
    left = (mask.cumsum(-1) == 0).sum(-1)
    pattern = torch.arange(2 * q * k, dtype=torch.float).reshape(2, 1, q, k) + 1
    cases = {(None, None): mu.causal_mask_function, (3, None): mu.sliding_window_causal_mask_function(3),
             (None, 2): mu.chunked_causal_mask_function(2, left), (2, 4): mu.and_masks(
                 mu.sliding_window_causal_mask_function(2), mu.chunked_causal_mask_function(4, left))}
    for (window, chunk), fn in cases.items():
        keep = mu.and_masks(fn, mu.padding_mask_function(mask.bool()))
        allowed = torch.tensor([[[bool(keep(b, 0, torch.tensor(i), torch.tensor(j))) for j in range(k)] for i in range(q)]
                                for b in range(2)])
        rows = mask.bool()[:, :, None].expand(2, q, k)
        expect = pattern[:, 0][~allowed & rows]
        got = expressions.masked(pattern, {"attention_mask": mask}, window=window, chunk=chunk)
        assert torch.equal(got, expect), (window, chunk)


# ---- the delta rule, against transformers' kernels --------------------------------------------------

def _delta_inputs(key_heads: int, heads: int, seed: int = 0) -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, s, dk, dv = 2, 6, 4, 5
    yield torch.randn(b, s, key_heads, dk, generator=g)
    yield torch.randn(b, s, key_heads, dk, generator=g)
    yield torch.randn(b, s, heads, dv, generator=g)
    yield -torch.rand(b, s, heads, generator=g)  # log decay
    yield torch.rand(b, s, heads, generator=g)
    yield torch.randn(b, heads, dk, dv, generator=g) * 0.1


@pytest.mark.parametrize("kernel", ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"])
@pytest.mark.parametrize("module", ["qwen3_5", "qwen3_next"])
def test_delta_rule_against_transformers_kernels(kernel: str, module: str) -> None:
    import importlib

    ref = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), kernel)
    q, k, v, g, beta, state = _delta_inputs(key_heads=2, heads=4)
    values = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state}
    # the module repeats the key heads up to the value heads before it calls the kernel
    rq, rk = q.repeat_interleave(2, 2), k.repeat_interleave(2, 2)
    want_out, want_state = ref(rq, rk, v, g, beta, initial_state=state, output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
    out, final = evaluate("delta_rule(q, k, v, g, beta, state)[0] == delta_rule(q, k, v, g, beta, state)[1]", values)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final, want_state, atol=1e-5, rtol=1e-4)
    no_state, _ = evaluate("delta_rule(q, k, v, g, beta)[0] == q", values)
    want, _ = ref(rq, rk, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(no_state, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kernel", ["recurrent_kimi_delta_attention", "chunk_kimi_delta_attention"])
def test_delta_rule_with_a_decay_per_channel_is_kimi_delta_attention(kernel: str) -> None:
    """g [batch seq heads key_dim]: each key channel's row of the state decays at its own rate (Kimi Delta
    Attention), as transformers' KDA kernels compute it; a g of another shape is one clear error."""
    import importlib

    ref = getattr(importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear"), kernel)
    q, k, v, _, beta, state = _delta_inputs(key_heads=4, heads=4)
    g = -torch.rand(*k.shape, generator=torch.Generator().manual_seed(1))  # a log decay per key channel
    values = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state}
    want_out, want_state = ref(q, k, v, g, beta, initial_state=state, output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
    out, final = evaluate("delta_rule(q, k, v, g, beta, state)[0] == delta_rule(q, k, v, g, beta, state)[1]", values)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final, want_state, atol=1e-5, rtol=1e-4)
    per_head, _ = evaluate("delta_rule(q, k, v, g[..., 0], beta, state)[0] == q", values)
    assert not torch.allclose(per_head, out, atol=1e-3)  # the channels' rates are not the first channel's
    with pytest.raises(ValueError, match=r"g is \[batch seq heads\] or \[batch seq heads key_dim\]"):
        evaluate("delta_rule(q, k, v, g[..., :2], beta)[0] == q", values)


# ---- the selective scan, against Mamba -------------------------------------------------------------

def test_selective_scan_against_mamba_selective_scan() -> None:
    from transformers.models.mamba.modeling_mamba import mamba_selective_scan

    g = torch.Generator().manual_seed(0)
    b, s, d, n = 2, 7, 6, 3
    x, dt, z = (torch.randn(b, d, s, generator=g) for _ in range(3))
    A = -torch.rand(d, n, generator=g) - 0.1  # noqa: N806 - Mamba's names
    B, C = torch.randn(b, n, s, generator=g), torch.randn(b, n, s, generator=g)  # noqa: N806
    D, bias = torch.randn(d, generator=g), torch.randn(d, generator=g)  # noqa: N806
    want, want_state = mamba_selective_scan(x, dt, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True,
                                            return_last_state=True)
    values = {"x": x.transpose(1, 2), "dt": F.softplus(dt + bias[:, None]).transpose(1, 2), "A": A,
              "B": B.transpose(1, 2), "C": C.transpose(1, 2), "D": D, "z": z.transpose(1, 2)}
    y, state = evaluate("selective_scan(x, dt + 0, A, B, C, D, z)[0] == selective_scan(x, softplus(log(exp(dt) - 1)), "
                        "A, B, C, D, z)[1]", values)
    torch.testing.assert_close(y, want.transpose(1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, want_state, atol=1e-5, rtol=1e-5)
    bare, _ = evaluate("selective_scan(x, dt, A, B, C)[0] == x", values)
    torch.testing.assert_close(bare, mamba_selective_scan(x, dt, A, B, C, delta_bias=bias, delta_softplus=True)
                               .transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_selective_scan_reproduces_a_tiny_mamba_forward() -> None:
    """The scan each MambaMixer of a tiny model runs, read at its call and recomputed by the reference."""
    from transformers import MambaConfig, MambaForCausalLM
    from transformers.models.mamba import modeling_mamba

    cfg = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=3,
                      time_step_rank=4)
    torch.manual_seed(0)
    model = MambaForCausalLM(cfg).eval()
    calls: list[tuple[Any, Any, Any]] = []
    original = modeling_mamba.mamba_selective_scan

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    modeling_mamba.mamba_selective_scan = spy
    try:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0)))
    finally:
        modeling_mamba.mamba_selective_scan = original
    assert len(calls) == cfg.num_hidden_layers
    for (x, dt, A, B, C), kw, out in calls:  # noqa: N806
        values = {"x": x.transpose(1, 2), "dt": dt.transpose(1, 2), "bias": kw["delta_bias"], "A": A,
                  "B": B.transpose(1, 2), "C": C.transpose(1, 2), "D": kw["D"], "z": kw["z"].transpose(1, 2),
                  "y": out[0].transpose(1, 2), "state": out[1]}
        lhs, rhs = evaluate("selective_scan(x, softplus(dt + bias), A, B, C, D, z)[0] == y", values)
        torch.testing.assert_close(lhs, rhs, atol=1e-5, rtol=1e-5)
        lhs, rhs = evaluate("selective_scan(x, softplus(dt + bias), A, B, C, D, z)[1] == state", values)
        torch.testing.assert_close(lhs, rhs, atol=1e-5, rtol=1e-5)


def test_cfg_reads_an_item_of_a_sequence_between_attributes() -> None:
    # gemma4_text: head_dim is a per-layer attribute whose global value the config refuses to give;
    # config.per_layer_config[0].head_dim is block 0's
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=4, global_head_dim=8,
                              layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(RuntimeError, match="per-layer attribute"):
        config.head_dim  # noqa: B018
    assert expressions.cfg(config, "per_layer_config[0].head_dim") == 4
    assert expressions.cfg(config, "per_layer_config[1].head_dim") == 8
    assert expressions.cfg({"a": [[1, 2]]}, "a[0][1]") == 2
    assert expressions.cfg(config, "missing[0].head_dim") is None


# ---- routing: the choice on a correction bias, within the best groups (DeepSeek-V3, GLM-4.5) ----

@pytest.mark.parametrize("groups,keep,k,normalize", [(1, 1, 2, True), (4, 2, 3, False), (2, 1, 2, True)])
def test_grouped_routing_is_transformers_router(groups: int, keep: int, k: int, normalize: bool) -> None:
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(hidden_size=16, n_routed_experts=8, num_experts_per_tok=k, n_group=groups,
                              topk_group=keep, norm_topk_prob=normalize, routed_scaling_factor=1.5)
    router = DeepseekV3TopkRouter(config)
    g = torch.Generator().manual_seed(groups * 10 + k)
    with torch.no_grad():
        router.weight.normal_(0, 0.5, generator=g)
        router.e_score_correction_bias.uniform_(-0.5, 0.5, generator=g)
    logits, weights, indices = router(torch.randn(2, 5, 16, generator=g))
    v = {"logits": logits, "bias": router.e_score_correction_bias, "indices": indices, "weights": weights,
         "k": k, "groups": groups, "keep": keep, "normalize": normalize}
    chosen, theirs = evaluate("grouped_topk_indices(sigmoid(logits) + bias, k, groups, keep) == indices", v)
    assert torch.equal(chosen.sort(-1).values, theirs.sort(-1).values)
    ours, theirs = evaluate("1.5 * chosen_weights(sigmoid(logits), indices, normalize) == weights", v)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    if groups > 1:  # the group limit changes the choice here: a plain top-k of the biased scores differs
        plain = torch.topk(logits.sigmoid() + router.e_score_correction_bias, k, dim=-1).indices
        assert not torch.equal(plain.sort(-1).values, theirs.sort(-1).values) or keep == groups


@pytest.mark.parametrize("method,groups,keep,k", [("greedy", 1, 1, 2), ("group_limited_greedy", 4, 2, 3),
                                                   ("group_limited_greedy", 2, 1, 2)])
def test_deepseek_v2_routing_is_transformers_router(method: str, groups: int, keep: int, k: int) -> None:
    """DeepSeek-V2's router: softmax, the best groups by their largest score (best=1), scaled, never
    renormalized (specs/deepseek_v2.yaml's identities)."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    config = DeepseekV2Config(hidden_size=16, num_attention_heads=4, n_routed_experts=8, num_experts_per_tok=k, n_group=groups,
                              topk_group=keep, topk_method=method, routed_scaling_factor=2.5, norm_topk_prob=True)
    router = DeepseekV2TopkRouter(config)
    mismatched = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed * 10 + k)
        with torch.no_grad():
            router.weight.normal_(0, 1.0, generator=g)
        logits, weights, indices = router(torch.randn(2, 9, 16, generator=g))
        grouped = method == "group_limited_greedy"
        v = {"logits": logits, "indices": indices, "weights": weights, "k": k, "groups": groups if grouped else 1,
             "keep": keep if grouped else 1}
        chosen, theirs = evaluate("grouped_topk_indices(softmax(logits, -1), k, groups, keep, 1) == indices", v)
        assert torch.equal(chosen.sort(-1).values, theirs.sort(-1).values)
        ours, theirs = evaluate("2.5 * chosen_weights(softmax(logits, -1), indices, False) == weights", v)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
        v3_style, _ = evaluate("grouped_topk_indices(softmax(logits, -1), k, groups, keep) == indices", v)
        mismatched += not torch.equal(v3_style.sort(-1).values, chosen.sort(-1).values)
    if (groups, keep) == (4, 2):  # scoring a group by its two best (V3's rule) chooses other experts here
        assert mismatched


def test_last_token_follows_the_mask_on_either_side_of_padding() -> None:
    v = tensors()
    x = v["x"]  # [2 3 5]
    masks = {"right": [[1, 1, 0], [1, 0, 0]], "left": [[0, 1, 1], [0, 0, 1]], "none": [[1, 1, 1], [1, 1, 1]]}
    rows = {"right": (1, 0), "left": (2, 2), "none": (2, 2)}
    for side, mask in masks.items():
        lhs, _ = evaluate("last_token(x, m) == x", {**v, "m": torch.tensor(mask)})
        assert torch.equal(lhs, torch.stack([x[0, rows[side][0]], x[1, rows[side][1]]])), side
    for mask in (None, torch.ones(2, 7, dtype=torch.long)):  # no mask, or one of a generation step's length
        lhs, _ = evaluate("last_token(x, m) == x", {**v, "m": mask})
        assert torch.equal(lhs, x[:, -1])


# ---- linear attention, against MiniMax's lightning attention ------------------------------------------

def test_linear_attention_is_minimax_lightning_attention() -> None:
    """linear_attention token by token equals the lightning attention's block-by-block output (blocks of 2 over
    7 tokens) and final state; a slope that is not one per head is one clear error."""
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    config = transformers.MiniMaxConfig(hidden_size=16, num_attention_heads=2, head_dim=8, num_hidden_layers=3,
                                        block_size=2, layer_types=["linear_attention"] * 3)
    torch.manual_seed(0)
    module = MiniMaxLightningAttention(config, 1).eval()
    x = torch.randn(2, 7, 16)
    seen: dict[str, torch.Tensor] = {}
    handle = module.norm.register_forward_hook(lambda m, args, out: seen.update(heads=args[0]))
    try:
        with torch.no_grad():
            _, state = module(x, None, None)
            qkv = module.act_fn(module.qkv_proj(x)).reshape(2, 7, 2, 24)
    finally:
        handle.remove()
    q, k, v = (t.transpose(1, 2) for t in torch.split(qkv, 8, dim=3))
    values = {"q": q, "k": k, "v": v, "slope": module.slope_rate}
    out, final = evaluate("linear_attention(q, k, v, slope)[0] == linear_attention(q, k, v, slope)[1]", values)
    torch.testing.assert_close(out.transpose(1, 2).reshape(2, 7, 16), seen["heads"], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(final, state, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="a slope per head"):
        evaluate("linear_attention(q, k, v, slope[:1])[0] == q", values)
