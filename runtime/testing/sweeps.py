"""The sweep's check, run by every family's generated tests: ``patching.sweep`` equals the loop it replaces."""

from __future__ import annotations

import warnings

import torch

from .. import patching
from ..patching import causal, where
from .tiny import shared_build

SWEEP_ATOL = 1e-5  # float32: a row's blocks computed in a batch of other rows, and skipped blocks served


def sweep_prompts(vocab: int, seq: int = 6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two one-row prompts of ``seq`` token ids that differ at positions 1 and seq - 2."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(4, vocab, (1, seq), generator=g)
    corrupt = clean.clone()
    for p in (1, seq - 2):
        corrupt[0, p] = 4 + (int(clean[0, p]) - 4 + 1 + int(torch.randint(0, vocab - 5, (1,), generator=g))) % (vocab - 4)
    return clean, corrupt


def check_sweep(family: str) -> None:
    """On the family's tiny model: ``patching.sweep`` of ``layer_output`` over every block and three
    positions, three rows per forward (rows patched at different blocks in one forward), equals the loop
    of one traced forward per patch within :data:`SWEEP_ATOL`; a family whose blocks write into something a
    later block reads is said to fall back (a :class:`patching.SweepFallback`), and only such a family."""
    model = shared_build(family, attn_implementation="eager", perturbed=True)
    clean, corrupt = sweep_prompts(int(model.normalized_config["vocab_size"]))
    with torch.no_grad(), model.trace(clean):
        logits = model.logits.save()
    answer, other = logits[0, -1].topk(2).indices.tolist()

    def metric(logits: torch.Tensor) -> torch.Tensor:
        # the logit difference (tiny models' log-probs are flat), plus one logit of position 0: the positions
        # before a patch count too (the causal limit serves them from the corrupt run)
        return logits[:, -1, answer] - logits[:, -1, other] + logits[:, 0, other]

    positions = [1, clean.shape[1] - 2, clean.shape[1] - 1]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        swept = patching.sweep(model, clean, corrupt, metric=metric, positions=positions, batch_size=3)
    expected = patching.loop(model, clean, corrupt, metric=metric, positions=positions)
    limit, _ = causal.past(model, where.one_row(model, corrupt, "corrupt"))
    if limit is not None:  # the limit was used: without it too
        torch.testing.assert_close(
            patching.sweep(model, clean, corrupt, metric=metric, positions=positions, batch_size=3, causal=False),
            expected, atol=SWEEP_ATOL, rtol=0, msg=lambda m: f"{family}: patching.sweep(causal=False) vs the loop\n{m}")
    fallbacks = [w for w in said if issubclass(w.category, patching.SweepFallback)]
    record = patching.recorded(model, corrupt)
    assert len(fallbacks) == (1 if record.writers else 0), (
        f"{family}: {len(fallbacks)} fallback warnings, blocks that cannot be skipped: {sorted(record.writers)}")
    assert swept.shape == (model.num_layers, len(positions)), swept.shape
    torch.testing.assert_close(swept, expected, atol=SWEEP_ATOL, rtol=0,
                               msg=lambda m: f"{family}: patching.sweep vs the loop\n{m}")
    assert float(swept.max()) > float(swept.min()), f"{family}: no patch moved the metric\n{swept}"
