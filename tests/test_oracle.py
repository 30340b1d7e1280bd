"""The oracle of the generated tests (``nnatlas.testing.check_oracle``): nnatlas's values against
transformers' own outputs on the same tiny model. Each comparison passes on the family as written
and fails, naming the value, when the spec reads the wrong tensor."""

from __future__ import annotations

import dataclasses

import pytest

from nnatlas import registry
from nnatlas.testing import suite as T


def _misread(family: str, path: str, name: str, source: str) -> object:
    """The family with ``path``'s value ``name`` read where ``source`` is read (a wrong spec line)."""
    fam = registry.get(family)
    hosts = []
    for h in fam.hosts:
        if h.path == path:
            src = h.value(source)
            assert src is not None
            h = dataclasses.replace(h, values=tuple(dataclasses.replace(v, read=src.read, view=src.view)
                                                    if v.name == name else v for v in h.values))
        hosts.append(h)
    return dataclasses.replace(fam, hosts=tuple(hosts))


def test_checks_follow_the_family() -> None:
    assert T.oracle_checks("llama") == (("hidden_states", "eager"), ("logits", "eager"), ("hidden_states", "sdpa"),
                                        ("logits", "sdpa"), ("attentions", "eager"))
    assert ("hidden_states", "sdpa") not in T.oracle_checks("gemma2")  # the class refuses sdpa
    assert ("router_logits", "eager") in T.oracle_checks("qwen3_next")
    assert ("router_logits", "eager") not in T.oracle_checks("llama")
    assert ("image_hidden_states", "eager") in T.oracle_checks("qwen3_vl")


@pytest.mark.parametrize("family,check,attn", [("llama", "hidden_states", "sdpa"), ("gemma2", "logits", "eager"),
                                               ("gpt2", "attentions", "eager"), ("qwen3_next", "router_logits", "eager")])
def test_passes_as_written(family: str, check: str, attn: str) -> None:
    T.check_oracle(family, check, attn)


@pytest.mark.parametrize("family,path,name,source,check,says", [
    ("llama", "layers[i]", "layer_output", "layer_mid", "hidden_states", "layers[0].layer_output vs hidden_states[1]"),
    ("llama", "layers[i]", "layer_input", "layer_mid", "hidden_states", "layers[0].layer_input vs hidden_states[0]"),
    ("llama", "model", "final_norm_output", "token_embeddings", "hidden_states", "after the final norm"),
    ("llama", "layers[i].self_attn", "attention_probabilities", "attention_scores", "attentions",
     "attention_probabilities vs attentions"),
    ("gemma2", "model", "logits", "lm_head_output", "logits", "logits, plain forward"),  # before the softcap
])
def test_a_wrong_read_fails(monkeypatch: pytest.MonkeyPatch, family: str, path: str, name: str, source: str,
                            check: str, says: str) -> None:
    monkeypatch.setitem(registry.all_families(), family, _misread(family, path, name, source))
    with pytest.raises(AssertionError, match=says.replace("[", r"\[").replace("]", r"\]")):
        T.check_oracle(family, check, "eager")


def test_a_pattern_forgotten_on_some_blocks_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where transformers returns one entry per block and the family serves the value on some blocks
    (MiniMax's lightning blocks return their states there), each served block is compared with its own
    entry; a skipped entry shaped like the served ones is a pattern the spec forgot, and fails."""
    from nnatlas.testing import oracle

    served = oracle._blocks_with
    monkeypatch.setattr(oracle, "_blocks_with", lambda model, value: [b for b in served(model, value) if b[0] != 1])
    with pytest.raises(AssertionError, match=r"attentions\[1\] shaped .* nnatlas serves no layers\[1\]"):
        T.check_oracle("llama", "attentions", "eager")
