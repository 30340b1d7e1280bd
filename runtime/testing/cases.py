"""The inputs the checks run on: a drawn case (a tiny config, perturbed or not, and its inputs: ``draw_case``) and
the fixed inputs of a load (``_fixed_inputs``: padded on both sides, or a prompt with two images)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..inputs.validate import accepted_kwargs
from ..model import AtlasModel
from .layouts import draw_layout
from .tiny import (
    draw_inputs,
    draw_params,
    image_prompt_inputs,
    perturbed_params,
    shared_build,
    tiny_of,
    tiny_processor,
    variant_params,
)

PROMPT = "the eiffel tower is in the city of"
PERTURB_ODDS = 8  # a drawn case is perturbed unless a draw from range(PERTURB_ODDS) is 0 (the first example's)


class Case:
    """One drawn tiny config and its inputs."""

    def __init__(self, family: str, params: dict[str, Any], inputs: dict[str, torch.Tensor], seed: int,
                 variant: str | None = None, perturbed: bool = False):
        self.family, self.params, self.inputs, self.seed, self.variant = family, params, inputs, seed, variant
        self.perturbed = perturbed
        self._repr: str | None = None

    def model(self, attn_implementation: str = "eager", experts: str | None = None) -> AtlasModel:
        return shared_build(self.family, self.params, attn_implementation, seed=self.seed, experts=experts,
                            variant=self.variant, perturbed=self.perturbed)

    def __repr__(self) -> str:  # made once: every identity's message names the case
        if self._repr is None:
            self._repr = self._describe()
        return self._repr

    def _describe(self) -> str:
        shape = tuple(self.inputs["input_ids"].shape)
        mask = self.inputs.get("attention_mask")
        if mask is None:  # (a forward that takes no attention mask: padding ids are tokens)
            mask = torch.ones_like(self.inputs["input_ids"])
        pads = (mask == 0).sum(-1).tolist()
        side = "right" if bool((mask[:, -1] == 0).any()) else "left"
        grid = self.inputs.get("image_grid_thw")
        images = f", image grids {grid.tolist()}" if grid is not None else ""
        perturbed = ", at the config's defaults"
        if self.perturbed:
            drawn = perturbed_params(self.family, self.params, self.seed, self.variant)
            factors = {k: v for k, v in drawn.items() if v != self.params.get(k)}
            perturbed = f", perturbed (nnatlas.testing.perturb: factors {factors}, constant weights drawn)"
        return (f"Case({self.family}, {self.params}, inputs {shape}, {side} padding {pads}{images}, seed {self.seed}"
                f"{perturbed})")


def draw_case(family: str, choose: Callable[[str, list[Any]], Any], data: Any, variant: str | None = None) -> Case:
    from hypothesis import strategies as st

    tiny = tiny_of(family, variant)
    params = draw_params(family, choose)
    if variant is not None:
        params = variant_params(family, params, choose, variant)
    batch = data.draw(st.integers(*tiny["batch"]), label="batch")
    seq = data.draw(st.integers(*tiny["seq"]), label="seq")
    pads = [data.draw(st.integers(0, max(seq - 1, 0)), label="pad") for _ in range(batch)]
    side = data.draw(st.sampled_from(["left", "right"]), label="padding side")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    # the first (simplest) example is the plain tiny model at the config's defaults; every other is
    # perturbed with odds 7 in 8 (factors off their defaults, constant weights drawn): the perturbed
    # draw takes the place of a default one, the examples are as many
    perturbed = data.draw(st.integers(0, PERTURB_ODDS - 1), label="perturbed") != 0
    if perturbed and variant is None:  # its structural options drawn too (nnatlas.testing.layouts)
        import transformers

        params = draw_layout(getattr(transformers, tiny["config_class"]), params,
                             lambda label, options: data.draw(st.sampled_from(options), label=label),
                             tiny.get("layouts"), family)
    images = tiny.get("images")
    if images:
        count = data.draw(st.sampled_from(list(images["count"])), label="images")
        sizes = [tuple(data.draw(st.sampled_from(list(images["sizes"])), label="size")) for _ in range(count)]
        vocab = int(params.get("text_config", {}).get("vocab_size", params.get("vocab_size", 64)))
        proc = tiny_processor(tiny["processor"], vocab)
        return Case(family, params, image_prompt_inputs(proc, seq, sizes, seed), seed, variant,  # type: ignore[arg-type]
                    perturbed)
    vocab = int(params.get("vocab_size", 64))
    return Case(family, params, draw_inputs(vocab, batch, seq, pads, seed, side), seed, perturbed=perturbed)


FIXED_SIZES = [(16, 16), (24, 16)]


def _fixed_inputs(model: AtlasModel, text_only: bool = False) -> dict[str, torch.Tensor]:
    """Three sequences of token ids, one unpadded, one padded on the left, one on the right (both sides in one
    batch: the mask says which positions are real; three unpadded, without a mask, where the forward takes none), or
    (a family with images) one prompt with two images of different grids."""
    if model.processor is not None and not text_only:
        return image_prompt_inputs(model.processor, 5, FIXED_SIZES, seed=1)
    vocab = int(model.normalized_config["vocab_size"])
    accepted = accepted_kwargs(model.native)
    if accepted is not None and "attention_mask" not in accepted:  # a forward that takes no mask (xLSTM): no padding
        return {"input_ids": draw_inputs(vocab, 3, 6, [0, 0, 0], seed=1)["input_ids"]}
    left, right = draw_inputs(vocab, 2, 6, [0, 2], seed=1), draw_inputs(vocab, 1, 6, [2], seed=2, side="right")
    return {k: torch.cat([left[k], right[k]]) for k in left}
