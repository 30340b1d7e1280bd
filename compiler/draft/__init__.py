"""``nnatlas draft MODEL_TYPE``: a first spec for a transformers model type, written by machine.

    tiny.py      the tiny random model (shrunk config, the draw ranges of the spec's tiny:), from
                 tiny_config.py (the size tables, the Tiny plan), tiny_stack.py (block counts, sections,
                 per-layer overrides) and tiny_build.py (the model built, perturbed; other sizes to try)
    recorder.py  one forward, recorded (module calls, modeling-module functions, torch ops)
    matcher.py   the recorded dataflow matched against the vocabulary (a Proposal): the whole model and its
                 blocks, with match_attention.py (the mixers), match_mlp.py (dense MLPs and mixtures),
                 match_base.py (the match's state, config entries of measured sizes), measure.py (tensors,
                 tolerances, the patterns of module classes)
    writer.py    the Proposal as commented YAML (the only place that knows the spec's forms)
    check.py     compile the draft, run its generated tests, compare with a hand-written spec
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .proposal import Proposal
from .tiny import DraftError


@dataclass
class Draft:
    proposal: Proposal
    text: str


def draft(model_type: str, model_path: str | None = None, extends: str | None = None, seed: int = 0) -> Draft:
    """Build, record, match and write (raises DraftError when the model type cannot be drafted)."""
    import torch
    import transformers

    from . import matcher, recorder, tiny, writer

    first = tiny.plan(model_type, model_path)
    failed: Exception | None = None
    for plan, why in [(first, ""), *tiny.alternatives(first)]:  # (the others: when the first one's forward fails)
        params = tiny.perturbed(plan, plan.first(), seed)
        try:
            model = tiny.build(plan, params, seed=seed, perturb=True)
        except DraftError:
            if failed is None:
                raise
            continue
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(4, int(params.get("vocab_size", 96)), (2, 7), generator=gen)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if not tiny.takes_mask(model):  # (xLSTM's forward: nnatlas refuses the mask as an input)
            del inputs["attention_mask"]
        try:
            rec = recorder.record(model, inputs)
        except Exception as e:  # noqa: BLE001 - a forward that fails on the tiny model: the next sizes, else report it
            failed = failed or e
            continue
        if failed is not None:
            plan.notes.append(f"{why} (the drafter's first tiny sizes fail the forward: {type(failed).__name__}: "
                              f"{str(failed).splitlines()[0][:120]})")
        break
    else:
        assert failed is not None
        raise DraftError(f"{first.model_class}: the tiny model's forward failed: {type(failed).__name__}: {failed}"
                         ) from failed
    proposal = matcher.match(rec, plan, params)
    proposal.extends = extends
    return Draft(proposal, writer.write(proposal, transformers.__version__))


__all__ = ["Draft", "DraftError", "draft"]
