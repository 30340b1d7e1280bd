"""What ``trace`` accepts, turned into the forward's keyword arguments."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import InputError, NnatlasError
from ..trace.protocols import WrappedModel
from .processing import image_prompt
from .validate import accepted_kwargs, check_ids, check_inputs

_CPU = torch.device("cpu")


def _device(model: WrappedModel) -> torch.device:
    """Where the inputs go: the device of the model's first parameter (as transformers' ``model.device``),
    found once and then read from its module (``.to()`` moves a parameter in place; a replaced one is
    found afresh)."""
    where = model.__dict__.get("_first_parameter")
    if where is not None:
        param = where[0]._parameters.get(where[1])
        if param is not None:
            return param.device  # type: ignore[no-any-return]
    for module in model._module.modules():
        for name, param in module._parameters.items():
            if param is not None:
                model.__dict__["_first_parameter"] = (module, name)
                return param.device  # type: ignore[no-any-return]
    return _CPU


def prepare(model: WrappedModel, inputs: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """A prompt, a list of prompts (left-padded), token ids (1-D or 2-D), or a dict of inputs;
    ``images=[...]`` (PIL images) goes with a prompt through the model's processor. Everything is
    checked before the forward (``validate``): a bad input is an InputError saying what was expected."""
    images = None
    if extra:
        extra = dict(extra)
        images = extra.pop("images", None)
    out: dict[str, Any]
    mask_made = False  # a mask of ones made here for ids given without one
    if images is None and isinstance(inputs, dict):  # the common case first: a dict of tensors
        out = dict(inputs)
    elif images is not None:
        out = _accepted(model, _with_images(model, inputs, images))
    elif inputs is None:
        out = {}
    elif isinstance(inputs, str) or (isinstance(inputs, list | tuple) and inputs and all(isinstance(x, str) for x in inputs)):
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if any(not t.strip() for t in texts):
            raise InputError("the prompt is empty: expected some text (at least one token)")
        out = _accepted(model, _tokenize(model, inputs))
    elif isinstance(inputs, torch.Tensor):
        check_ids(inputs)
        ids = inputs if inputs.dim() == 2 else inputs.unsqueeze(0)
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        mask_made = True
    elif isinstance(inputs, list | tuple) and inputs and all(isinstance(x, int) and not isinstance(x, bool)
                                                             for x in inputs):
        ids = torch.tensor([list(inputs)])
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        mask_made = True
    elif isinstance(inputs, Mapping):
        # a tokenizer's or processor's own output keeps only what the forward takes (a fast
        # tokenizer adds token_type_ids that Llama's forward would ignore); a plain dict is checked
        out = _accepted(model, inputs) if type(inputs).__name__ == "BatchEncoding" else dict(inputs)
    elif isinstance(inputs, list | tuple) and not inputs:
        raise InputError("an empty list: expected a prompt, a list of prompts, token ids or a dict of inputs")
    else:
        raise InputError(f"trace() takes a prompt, a list of prompts, token ids or a dict of inputs, not "
                         f"{type(inputs).__name__}")
    if extra:
        out.update(extra)
    check_inputs(model, out)
    if mask_made or out.get("attention_mask") is None:
        _warn_unmasked_padding(model, out.get("input_ids"))
    device = _device(model)
    for k, v in out.items():
        if isinstance(v, torch.Tensor) and v.device != device:
            out[k] = v.to(device)
    return out


class PaddingWarning(UserWarning):
    """Token ids that hold the tokenizer's pad id were given without an attention mask."""


def _warn_unmasked_padding(model: WrappedModel, ids: Any) -> None:
    """Warn (once per model) when ids given without an attention mask hold the tokenizer's pad id: every
    token is then treated as real, the pads included (``next_token_probs`` reads the last position)."""
    tok = model.tokenizer
    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    if not isinstance(pad, int) or not isinstance(ids, torch.Tensor) or model.__dict__.get("_warned_padding"):
        return
    if bool((ids == pad).any()):
        model.__dict__["_warned_padding"] = True
        warnings.warn(f"these token ids hold the pad id {pad} ({tok.pad_token!r}) but no attention mask was given: "
                      "every token counts as real, the pads included; pass attention_mask (0 on the pads), or the "
                      "prompts as text (a list is padded and masked)", PaddingWarning, stacklevel=4)


def _accepted(model: WrappedModel, made: Mapping[str, Any]) -> dict[str, Any]:
    """What a tokenizer or processor made, less the keys the model's forward does not take."""
    accepted = accepted_kwargs(model._module)
    return {k: v for k, v in made.items() if accepted is None or k in accepted}


def _tokenize(model: WrappedModel, text: str | list[str] | tuple[str, ...]) -> Mapping[str, Any]:
    tok = model.tokenizer
    if tok is None:
        raise NnatlasError("this model has no tokenizer: pass token ids, or wrap(model, tokenizer=...)")
    if isinstance(text, str):
        return tok(text, return_tensors="pt")  # type: ignore[no-any-return]
    side, pad = tok.padding_side, tok.pad_token
    try:
        tok.padding_side = "left"
        if pad is None:
            tok.pad_token = tok.eos_token
        return tok(list(text), return_tensors="pt", padding=True)  # type: ignore[no-any-return]
    finally:
        tok.padding_side = side
        if pad is None:
            tok.pad_token = pad


def _with_images(model: WrappedModel, text: Any, images: Any) -> Mapping[str, Any]:
    """The processor's inputs for a prompt and its images. A prompt without the image token gets one
    ``<vision_start><image><vision_end>`` per image in front, as a chat template would place them."""
    proc = model.processor
    if proc is None or getattr(proc, "image_processor", None) is None:
        raise NnatlasError("this load has no processor for images: load with "
                           "nnatlas.load(path, task='image-text-to-text'), or wrap(model, processor=...)")
    images = list(images) if isinstance(images, list | tuple) else [images]
    if not images:
        raise InputError("images=[] holds no image: expected one or more PIL images (or leave images out)")
    if not isinstance(text, str):
        raise NnatlasError("images=[...] goes with one prompt (a string); pass pixel_values, image_grid_thw and "
                           "mm_token_type_ids in a dict for anything else")
    text = image_prompt(proc, text, len(images))
    return proc(text=text, images=images, return_tensors="pt")  # type: ignore[no-any-return]
