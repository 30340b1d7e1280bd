"""The recomputed attention patterns: under sdpa and flex attention, every block's attention_scores and
attention_probabilities equal eager's, reading them changes nothing, and an edit of them names eager."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..errors import Unavailable
from ..trace.patterns import RECOMPUTED
from .cases import _fixed_inputs
from .flex import runs_on_cpu as flex_runs_on_cpu
from .flex import uncompiled_flex_attention
from .tiny import accepted_attention, adapter_module, attention_loads, draw_inputs, shared_build
from .values import _blocks_with, host_specs

PATTERN_VALUES = ("attention_scores", "attention_probabilities")


PATTERN_ERRORS: dict[tuple[str, str], float] = {}  # (family, attention load) -> largest error seen


def recomputed_pattern_loads(family: str, variant: str | None = None) -> tuple[str, ...]:
    """The loads the tests run ``family`` under (eager aside) where its pattern is recomputed: sdpa and
    flex attention for a pattern read inside eager attention (``call:attention > op:...``), sdpa for one
    read at eager's softmax in the forward with ``recompute: sdpa``; empty when it is read elsewhere."""
    fam = adapter_module(family).FAMILY
    reads = [v.read for h in fam.hosts for v in h.values if v.name in PATTERN_VALUES and v.read.kind == "op"]
    if any(r.call == "attention" for r in reads):
        # flex attention too where the class accepts it and transformers runs it on CPU (uncompiled: testing/flex.py)
        flex = ("flex_attention",) if "flex_attention" in accepted_attention(family, variant) \
            and flex_runs_on_cpu(family, fam.traits) else ()
        return tuple(a for a in attention_loads(family, variant) if a in RECOMPUTED) + flex
    # at eager's softmax in the forward, recomputed from the forward's own sdpa call (recompute: sdpa)
    marked = {r.recompute for r in reads if r.recompute}
    return tuple(a for a in attention_loads(family, variant) if a in marked)


def check_recomputed_patterns(family: str, attn: str, variant: str | None = None) -> float:
    """Under ``attn``, every block's attention_scores and attention_probabilities equal eager's (the same
    weights, inputs with and without padding) within 1e-6, reading them leaves the logits bit-identical
    to a trace that reads nothing, and an edit of them raises Unavailable naming eager. Returns the
    largest error. Flex attention runs uncompiled (:func:`uncompiled_flex_attention`)."""
    with uncompiled_flex_attention() if attn == "flex_attention" else contextlib.nullcontext():
        return _check_recomputed_patterns(family, attn, variant)


def _check_recomputed_patterns(family: str, attn: str, variant: str | None) -> float:
    eager = shared_build(family, attn_implementation="eager", variant=variant, perturbed=True)
    fused = shared_build(family, attn_implementation=attn, variant=variant, perturbed=True)
    vocab = int(eager.normalized_config["vocab_size"])
    layers: Any = fused.layers
    worst = 0.0
    for inputs in (_fixed_inputs(eager, text_only=True), draw_inputs(vocab, 1, 5, [0], seed=2)):
        # every block of the eager model gets the fused run's block input: the two attentions then see
        # the same queries and keys (upstream, sdpa and eager differ in the last bits)
        with torch.no_grad(), fused.trace(dict(inputs), order="any"):
            ours = [(i, name, getattr(host, name).save()) for name in PATTERN_VALUES
                    for i, host in _blocks_with(fused, name)]
            ins = [layers[i].layer_input.save() for i in range(len(layers))]
            logits = fused.logits.save()
        with torch.no_grad(), eager.trace(dict(inputs), order="any"):
            for i in range(len(layers)):
                eager.layers[i].layer_input = ins[i]
            theirs = [(i, name, getattr(host, name).save()) for name in PATTERN_VALUES
                      for i, host in _blocks_with(eager, name)]
        assert ours and len(ours) == len(theirs), f"{family} [{attn}]: {len(ours)} patterns served, eager {len(theirs)}"
        for (i, name, a), (_, _, b) in zip(ours, theirs, strict=True):
            what = f"{family} [{attn}]: layers[{i}] {name}, recomputed vs eager"
            assert a.shape == b.shape, f"{what}: {tuple(a.shape)} vs {tuple(b.shape)}"
            hidden = b <= torch.finfo(b.dtype).min / 2  # masked scores: finfo.min on both sides (sums of it differ)
            assert torch.equal(hidden, a <= torch.finfo(a.dtype).min / 2), f"{what}: the masks differ"
            err = float((a - b).abs().masked_fill(hidden, 0).max()) if a.numel() else 0.0
            assert err <= 1e-6, f"{what}: off by {err:.3g}"
            worst = max(worst, err)
        with torch.no_grad(), fused.trace(dict(inputs)):
            plain = fused.logits.save()
        assert torch.equal(logits, plain), f"{family} [{attn}]: reading the pattern changed the logits"
    host = _blocks_with(fused, "attention_probabilities")[0][1]
    for name in PATTERN_VALUES:
        if not any(sp.value(name) for sp in host_specs(fused, host)):
            continue
        try:
            with fused.trace(dict(inputs)):
                setattr(host, name, getattr(host, name) * 1)
        except Unavailable as e:
            assert "eager" in str(e) and attn in str(e), f"{family} [{attn}]: {e}"
        else:
            raise AssertionError(f"{family} [{attn}]: an edit of {name} under {attn} did not raise Unavailable")
    PATTERN_ERRORS[(family, attn)] = worst
    return worst
