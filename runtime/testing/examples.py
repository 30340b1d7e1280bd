"""The notes' examples, run on the tiny model."""

from __future__ import annotations

import torch

import nnatlas

from .cases import PROMPT
from .tiny import adapter_module, build


def run_example(family: str, source: str, where: str, load: str | None = None) -> None:
    """Run a note's example on the tiny config (on the image-text load when the note says so and the
    family has a second load for it)."""
    variant = "image_text" if load == "image-text-to-text" and adapter_module(family).TINY.get("image_text") else None
    model = build(family, attn_implementation="eager", variant=variant, perturbed=True)
    namespace = {"model": model, "prompt": PROMPT, "torch": torch, "nnatlas": nnatlas}
    if model.processor is not None:  # the pages' images: a red square and a wide one
        from PIL import Image

        namespace.update(red=Image.new("RGB", (16, 16), (255, 0, 0)), wide=Image.new("RGB", (32, 16), (0, 0, 255)))
    exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the notes' examples are code to run
