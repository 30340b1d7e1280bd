"""What ``trace`` accepts, turned into the forward's keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .errors import NnatlasError

if TYPE_CHECKING:
    from .model import AtlasModel


_CPU = torch.device("cpu")


def _device(model: AtlasModel) -> torch.device:
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


def prepare(model: AtlasModel, inputs: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """A prompt, a list of prompts (left-padded), token ids (1-D or 2-D), or a dict of inputs;
    ``images=[...]`` (PIL images) goes with a prompt through the model's processor."""
    images = None
    if extra:
        extra = dict(extra)
        images = extra.pop("images", None)
    out: dict[str, Any]
    if images is None and isinstance(inputs, dict):  # the common case first: a dict of tensors
        out = dict(inputs)
    elif images is not None:
        out = dict(_with_images(model, inputs, images))
    elif inputs is None:
        out = {}
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
    if extra:
        out.update(extra)
    if "pixel_values" in out:
        check_image_inputs(model, out)
    device = _device(model)
    for k, v in out.items():
        if isinstance(v, torch.Tensor) and v.device != device:
            out[k] = v.to(device)
    return out


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


def _with_images(model: AtlasModel, text: Any, images: Any) -> Mapping[str, Any]:
    """The processor's inputs for a prompt and its images. A prompt without the image token gets one
    ``<vision_start><image><vision_end>`` per image in front, as a chat template would place them."""
    proc = model.processor
    if proc is None or getattr(proc, "image_processor", None) is None:
        raise NnatlasError("this load has no processor for images: load with "
                           "nnatlas.load(path, task='image-text-to-text'), or wrap(model, processor=...)")
    images = list(images) if isinstance(images, list | tuple) else [images]
    if not isinstance(text, str):
        raise NnatlasError("images=[...] goes with one prompt (a string); pass pixel_values, image_grid_thw and "
                           "mm_token_type_ids in a dict for anything else")
    from .processing import image_prompt

    text = image_prompt(proc, text, len(images))
    return proc(text=text, images=images, return_tensors="pt")  # type: ignore[no-any-return]


def check_image_inputs(model: AtlasModel, inputs: Mapping[str, Any]) -> None:
    """Raw image tensors are checked before the forward: the grid, the token types, the token count."""
    pixels = inputs.get("pixel_values")
    if pixels is None:
        return
    import inspect

    params = inspect.signature(model._module.forward).parameters
    grid = inputs.get("image_grid_thw")
    if grid is None and "image_grid_thw" not in params:
        _check_fixed_size_images(model, inputs, pixels)
        return
    if grid is None:
        raise NnatlasError("pixel_values without image_grid_thw: pass the processor's image_grid_thw "
                           "([t, h, w] per image, in patches)")
    if "mm_token_type_ids" in params and inputs.get("mm_token_type_ids") is None:
        raise NnatlasError("image inputs without mm_token_type_ids: the model needs them to place the images' "
                           "rotary positions (M-RoPE); pass the processor's mm_token_type_ids (1 at image tokens, "
                           "0 elsewhere), or trace(prompt, images=[...])")
    config = model.config
    token_id = getattr(config, "image_token_id", None)
    vision = getattr(config, "vision_config", None)
    merge = getattr(vision, "spatial_merge_size", None)
    ids = inputs.get("input_ids")
    if token_id is None or merge is None or ids is None:
        return
    grid_t = torch.as_tensor(grid)
    want = int((grid_t.prod(-1) // (merge * merge)).sum())
    have = int((torch.as_tensor(ids) == token_id).sum())
    if have != want:
        raise NnatlasError(f"input_ids hold {have} image tokens (id {token_id}) but image_grid_thw "
                           f"{grid_t.tolist()} makes {want} (t * h * w / {merge * merge} per image): "
                           "the prompt needs one image token per merged patch")
    patches = int(grid_t.prod(-1).sum())
    if hasattr(pixels, "shape") and pixels.shape[0] != patches:
        raise NnatlasError(f"pixel_values has {pixels.shape[0]} patches but image_grid_thw {grid_t.tolist()} "
                           f"makes {patches}")


def _check_fixed_size_images(model: AtlasModel, inputs: Mapping[str, Any], pixels: Any) -> None:
    """A fixed-size encoder's images (``pixel_values [images, channels, height, width]``): the prompt
    holds the family's ``image_tokens_per_image`` image tokens per image."""
    per_image = model.normalized_config.get("image_tokens_per_image")
    token_id = getattr(model.config, "image_token_id", None)
    ids = inputs.get("input_ids")
    if not isinstance(per_image, int) or token_id is None or ids is None or not hasattr(pixels, "shape"):
        return
    want = int(pixels.shape[0]) * per_image
    have = int((torch.as_tensor(ids) == token_id).sum())
    if have != want:
        raise NnatlasError(f"input_ids hold {have} image tokens (id {token_id}) but pixel_values holds "
                           f"{int(pixels.shape[0])} images of {per_image} image tokens each ({want}): the prompt "
                           "needs the processor's image tokens, one run per image")
