"""What ``trace`` accepts, turned into the forward's keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .errors import NnatlasError

if TYPE_CHECKING:
    from .model import AtlasModel


def _device(model: AtlasModel) -> torch.device:
    try:
        return next(model._module.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def prepare(model: AtlasModel, inputs: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """A prompt, a list of prompts (left-padded), token ids (1-D or 2-D), or a dict of inputs."""
    if inputs is None:
        out: dict[str, Any] = {}
    elif isinstance(inputs, str) or (isinstance(inputs, list | tuple) and inputs and all(isinstance(x, str) for x in inputs)):
        out = dict(_tokenize(model, inputs))
    elif isinstance(inputs, torch.Tensor):
        ids = inputs if inputs.dim() == 2 else inputs.unsqueeze(0)
        if ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise NnatlasError("token ids must be an integer tensor")
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    elif isinstance(inputs, list | tuple) and inputs and all(isinstance(x, int) for x in inputs):
        ids = torch.tensor([list(inputs)])
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    elif isinstance(inputs, Mapping):
        out = dict(inputs)
    else:
        raise NnatlasError(f"trace() takes a prompt, a list of prompts, token ids or a dict of inputs, not {type(inputs).__name__}")
    out.update(extra)
    device = _device(model)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v) for k, v in out.items()}


def _tokenize(model: AtlasModel, text: str | list[str] | tuple[str, ...]) -> Mapping[str, Any]:
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
