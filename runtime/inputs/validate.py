"""What the user passes, checked before the forward runs: inputs, and edits where they are recorded.

Every refusal is an :class:`~nnatlas.errors.InputError` (a ``ValueError``) that names the input
or value and says what was expected, instead of an error deep inside transformers (or, worse,
a silently different forward).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import InputError
from ..trace.protocols import EditedValue, TraceState, WrappedModel

# keyword arguments a transformers forward takes through ``**kwargs`` (``TransformersKwargs``, and
# the names its decorators read or rename), beyond the parameters its signature names
_FORWARD_EXTRAS = {"return_dict", "past_key_values", "cache_params", "cache_position", "use_cache",
                   "output_attentions", "output_hidden_states", "output_router_logits", "debug_io", "debug_io_dir",
                   "prune_layers"}
_ACCEPTED: dict[type, frozenset[str] | None] = {}


def accepted_kwargs(module: torch.nn.Module) -> frozenset[str] | None:
    """The keyword arguments the model's forward accepts (None: any, it takes ``**kwargs`` of no known kind)."""
    cls = type(module)
    if cls not in _ACCEPTED:
        params = inspect.signature(cls.forward).parameters
        names = {n for n, p in list(params.items())[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        var = next((p for p in params.values() if p.kind == p.VAR_KEYWORD), None)
        if var is not None:
            try:
                from transformers.utils.generic import TransformersKwargs

                names |= set(TransformersKwargs.__annotations__) | _FORWARD_EXTRAS
            except ImportError:  # pragma: no cover (another transformers): accept anything
                _ACCEPTED[cls] = None
                return None
        _ACCEPTED[cls] = frozenset(names)
    return _ACCEPTED[cls]


def _unknown_message(module: torch.nn.Module, unknown: list[str], accepted: frozenset[str]) -> str:
    import difflib

    own = [n for n in list(inspect.signature(type(module).forward).parameters)[1:] if n in accepted]
    near = [m for k in unknown for m in difflib.get_close_matches(k, sorted(accepted), n=1, cutoff=0.7)]
    hint = f" (nearest: {', '.join(near)})" if near else ""
    extras = sorted(accepted - set(own))
    return (f"{type(module).__name__}.forward takes no argument {', '.join(repr(k) for k in unknown)}{hint}: expected "
            f"its parameters ({', '.join(own)}) or the transformers keywords it reads ({', '.join(extras)})")


def _vocab(model: WrappedModel) -> int | None:
    emb = getattr(model._module, "get_input_embeddings", None)
    layer = emb() if callable(emb) else None
    n = getattr(layer, "num_embeddings", None)
    if isinstance(n, int):
        return n
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    size = getattr(text, "vocab_size", None)
    return size if isinstance(size, int) else None


_INTEGER = frozenset({torch.long, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32,
                      torch.uint64})


def check_ids(ids: Any, what: str = "token ids") -> None:
    """An integer tensor of rank 1 or 2 with at least one token (the vocabulary is checked later)."""
    if not isinstance(ids, torch.Tensor):
        raise InputError(f"{what}: expected a tensor of integer token ids [batch, seq], got a {type(ids).__name__}")
    if ids.dtype not in _INTEGER:
        raise InputError(f"{what}: expected integer token ids (torch.long), got dtype {ids.dtype}")
    if ids.dim() not in (1, 2):
        raise InputError(f"{what}: expected token ids of rank 1 [seq] or 2 [batch, seq], got rank {ids.dim()} "
                         f"(shape {list(ids.shape)})")
    if ids.numel() == 0:
        raise InputError(f"{what}: expected at least one token, got shape {list(ids.shape)} (an empty prompt?)")


def check_inputs(model: WrappedModel, inputs: Mapping[str, Any]) -> None:
    """The forward's keyword arguments, before it runs: known names, the ids against the vocabulary,
    a mask of the ids' shape, and (with pixel_values) every image input."""
    accepted = accepted_kwargs(model._module)
    if accepted is not None and not accepted.issuperset(inputs):
        raise InputError(_unknown_message(model._module, [k for k in inputs if k not in accepted], accepted))
    ids = inputs.get("input_ids")
    if ids is None:
        if inputs.get("inputs_embeds") is None:
            raise InputError("expected input_ids (or inputs_embeds) among the inputs, got "
                             f"{', '.join(inputs) or 'nothing'}")
    else:
        seen = model.__dict__.get("_checked_ids")
        if seen is None or seen[0] is not ids or seen[1] != ids._version:  # (checked once per tensor and version)
            check_ids(ids, "input_ids")
            if ids.dim() != 2:
                raise InputError(f"input_ids: expected [batch, seq] (rank 2) in a dict of inputs, got shape "
                                 f"{list(ids.shape)}")
            _check_range(model, ids)
            model.__dict__["_checked_ids"] = (ids, ids._version)
        mask = inputs.get("attention_mask")
        if mask is not None and (type(mask) is not torch.Tensor or mask.shape != ids.shape):
            got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise InputError(f"attention_mask: expected the shape of input_ids {list(ids.shape)}, got {got}")
    if "pixel_values" in inputs or "image_grid_thw" in inputs:
        if inputs.get("pixel_values") is not None or inputs.get("image_grid_thw") is not None:
            check_image_inputs(model, inputs)


def _check_range(model: WrappedModel, ids: torch.Tensor) -> None:
    """Every id in [0, vocab_size)."""
    vocab = _vocab(model)
    if vocab is None:
        return
    if ids.device.type == "cpu" and type(ids) is torch.Tensor:
        flat = ids.numpy()  # (shares the memory: the check makes no tensor)
        low, high = int(flat.min()), int(flat.max())
    else:
        lo, hi = torch.aminmax(ids)
        low, high = int(lo), int(hi)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise InputError(f"input_ids: expected ids in [0, {vocab}) (the vocabulary), got {bad}")


def check_image_inputs(model: WrappedModel, inputs: Mapping[str, Any]) -> None:
    """Raw image tensors: pixel_values [patches, channels * temporal * patch * patch] (float),
    image_grid_thw [images, 3] (integer), mm_token_type_ids like input_ids, the image-token count."""
    pixels = inputs.get("pixel_values")
    grid = inputs.get("image_grid_thw")
    if pixels is None:
        raise InputError("image_grid_thw without pixel_values: pass the processor's pixel_values too")
    if grid is None and "image_grid_thw" not in inspect.signature(model._module.forward).parameters:
        _check_fixed_size_images(model, inputs, pixels)
        return
    if grid is None:
        raise InputError("pixel_values without image_grid_thw: pass the processor's image_grid_thw "
                         "([t, h, w] per image, in patches)")
    if not isinstance(grid, torch.Tensor) or grid.dim() != 2 or grid.shape[-1] != 3 or grid.dtype.is_floating_point:
        got = (f"dtype {grid.dtype}, shape {list(grid.shape)}" if isinstance(grid, torch.Tensor)
               else type(grid).__name__)
        raise InputError(f"image_grid_thw: expected an integer tensor [images, 3] ([t, h, w] per image, in "
                         f"patches), got {got}")
    vision = getattr(model.config, "vision_config", None)
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 2:
        got = f"shape {list(pixels.shape)}" if isinstance(pixels, torch.Tensor) else type(pixels).__name__
        raise InputError(f"pixel_values: expected [patches, channels * temporal * patch * patch], got {got}")
    if vision is not None:
        parts = [getattr(vision, n, None) for n in ("in_channels", "temporal_patch_size", "patch_size")]
        if all(isinstance(p, int) for p in parts):
            c, t, p = parts
            width = c * t * p * p  # type: ignore[operator]
            if pixels.shape[1] != width:
                raise InputError(f"pixel_values: expected rows of {width} values (channels {c} * temporal {t} * "
                                 f"patch {p} * {p}), got {pixels.shape[1]}")
    params = inspect.signature(model._module.forward).parameters
    types = inputs.get("mm_token_type_ids")
    if "mm_token_type_ids" in params and types is None:
        raise InputError("image inputs without mm_token_type_ids: the model needs them to place the images' "
                         "rotary positions (M-RoPE); pass the processor's mm_token_type_ids (1 at image tokens, "
                         "0 elsewhere), or trace(prompt, images=[...])")
    ids = inputs.get("input_ids")
    if types is not None and isinstance(ids, torch.Tensor) and \
            (not isinstance(types, torch.Tensor) or types.shape != ids.shape):
        found = str(list(types.shape)) if isinstance(types, torch.Tensor) else type(types).__name__
        raise InputError(f"mm_token_type_ids: expected the shape of input_ids {list(ids.shape)} (1 at image "
                         f"tokens, 0 elsewhere), got {found}")
    token_id = getattr(model.config, "image_token_id", None)
    merge = getattr(vision, "spatial_merge_size", None)
    if token_id is None or merge is None or ids is None:
        return
    want = int((grid.prod(-1) // (merge * merge)).sum())
    have = int((torch.as_tensor(ids) == token_id).sum())
    if have != want:
        raise InputError(f"input_ids hold {have} image tokens (id {token_id}) but image_grid_thw "
                         f"{grid.tolist()} makes {want} (t * h * w / {merge * merge} per image): "
                         "the prompt needs one image token per merged patch")
    patches = int(grid.prod(-1).sum())
    if pixels.shape[0] != patches:
        raise InputError(f"pixel_values has {pixels.shape[0]} patches but image_grid_thw {grid.tolist()} "
                         f"makes {patches}")


def _check_fixed_size_images(model: WrappedModel, inputs: Mapping[str, Any], pixels: Any) -> None:
    """A fixed-size encoder's images (LLaVA's CLIP, Gemma 3's SigLIP): pixel_values [images, channels,
    height, width], and the family's ``image_tokens_per_image`` image tokens per image in input_ids."""
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or not pixels.dtype.is_floating_point:
        got = f"dtype {pixels.dtype}, shape {list(pixels.shape)}" if isinstance(pixels, torch.Tensor) \
            else type(pixels).__name__
        raise InputError(f"pixel_values: expected a float tensor [images, channels, height, width], got {got}")
    per_image = model.normalized_config.get("image_tokens_per_image")
    token_id = getattr(model.config, "image_token_id", None)
    ids = inputs.get("input_ids")
    if not isinstance(per_image, int) or token_id is None or ids is None:
        return
    want = int(pixels.shape[0]) * per_image
    have = int((torch.as_tensor(ids) == token_id).sum())
    if have != want:
        raise InputError(f"input_ids hold {have} image tokens (id {token_id}) but pixel_values holds "
                         f"{int(pixels.shape[0])} images of {per_image} image tokens each ({want}): the prompt "
                         "needs the processor's image tokens, one run per image")


# ---- edits ---------------------------------------------------------------------------------

def _layout_dims(value: EditedValue, tracer: TraceState) -> list[int | None]:
    """The value's declared layout as sizes, None where this trace's inputs do not say (a generation
    step's seq, a cache's key positions)."""
    spec = value._spec
    assert spec is not None
    dims = tracer.__dict__.get("_dims")
    if dims is None:
        dims = tracer.__dict__["_dims"] = _trace_dims(value._host._model, tracer)
    return layout_sizes(value, dims)


def layout_sizes(value: Any, dims: Mapping[str, int | None]) -> list[int | None]:
    """The sizes of ``value``'s layout from ``dims`` (a host's ``dims:`` resize it), None where they do not say."""
    for host_spec in value._host._specs():
        if host_spec.dims:
            dims = {**dims, **{d: dims.get(e) for d, e in host_spec.dims}}
    return [dims.get(d) for d in value._spec.layout.dims]


def _config_dims(model: WrappedModel) -> dict[str, int]:
    """The config's sizes, found once per config object (a built model's sizes do not change)."""
    cached = model.__dict__.get("_config_dims")
    config = model.config
    if cached is None or cached[0] is not config:
        dims = {name: v for name, v in model.normalized_config.items() if isinstance(v, int) and not isinstance(v, bool)}
        dims["one"] = dims["images"] = 1
        cached = model.__dict__["_config_dims"] = (config, dims)
    return cached[1]


def _trace_dims(model: WrappedModel, tracer: TraceState) -> dict[str, int]:
    dims = dict(_config_dims(model))
    inputs = tracer.inputs
    ids = inputs.get("input_ids", inputs.get("inputs_embeds"))
    if tracer.steps is None and isinstance(ids, torch.Tensor) and ids.dim() >= 2:
        dims["batch"], dims["seq"] = int(ids.shape[0]), int(ids.shape[1])
        dims["query"] = dims["seq"]
        if inputs.get("past_key_values") is None and inputs.get("cache") is None:
            dims["key"] = dims["seq"]
    grid = inputs.get("image_grid_thw")
    pixels = inputs.get("pixel_values")
    if isinstance(grid, torch.Tensor):
        dims["patches"] = int(grid.prod(-1).sum())
        merge = dims.get("vision_spatial_merge_size", 1)
        dims["image_tokens"] = dims["patches"] // (merge * merge)
    elif isinstance(pixels, torch.Tensor) and pixels.dim() == 4:  # a fixed-size encoder: one row per image
        dims["tiles"] = int(pixels.shape[0])
    return dims


_DTYPE_OF = {"long": torch.long, "bool": torch.bool, "float": torch.float32}


def check_edit(value: EditedValue, tracer: TraceState, new: Any, key: Any = None, setitem: bool = False) -> Any:
    """An edit of ``value`` as recorded (``host.value = new`` or ``value[key] = new``): the new value
    as the forward will use it (a numpy array becomes a tensor), or an InputError naming the value
    and its layout. Values without a tensor layout (a size, a state that may be None) are not checked."""
    spec = value._spec
    if spec is None or spec.layout.dtype == "object":
        return new
    if setitem and (type(key) is str or (type(key) is tuple and any(isinstance(k, str) for k in key))):
        raise InputError(f"{value.label}[{key!r}]: a tensor is indexed by integers, slices, tensors or ..., not a "
                         f"string ({value.label} is {spec.layout.text})")
    kind = type(new)
    if kind is int or kind is float or kind is bool:  # the common edit: a number
        return new
    if kind.__module__ == "numpy" and hasattr(new, "__array__"):
        new = torch.as_tensor(new)  # converted (a copy when the array's dtype or memory asks for one)
    elif new is None or isinstance(new, str | bytes | list | tuple | dict | set):
        got = "None" if new is None else f"a {kind.__name__}"
        hint = " (make it a tensor: torch.tensor(...))" if isinstance(new, list | tuple) else ""
        raise InputError(f"{_what(value, key, setitem)} = {got}: expected a tensor, a number, a function of the value "
                         f"or an expression of values of this trace{hint}; {value.label} is {spec.layout.text}")
    if isinstance(new, torch.Tensor):
        layout = spec.layout
        want = _DTYPE_OF.get(layout.dtype)
        if want is not None and not torch.can_cast(new.dtype, want):
            raise InputError(f"{_what(value, key, setitem)}: a tensor of dtype {new.dtype} cannot become "
                             f"{layout.dtype} values without losing what it holds; {value.label} is {layout.text}")
        if not setitem and value._extra == ():
            sizes = _layout_dims(value, tracer)
            if not _broadcasts(tuple(new.shape), sizes):
                shown = "[" + ", ".join("?" if s is None else str(s) for s in sizes) + "]"
                raise InputError(f"{value.label}: a tensor of shape {list(new.shape)} does not broadcast to the "
                                 f"value's layout {layout.text} = {shown} in this trace")
    return new


def _what(value: EditedValue, key: Any, setitem: bool) -> str:
    return f"{value.label}[{key!r}]" if setitem else value.label


def _broadcasts(shape: tuple[int, ...], sizes: list[int | None]) -> bool:
    """Whether ``shape`` broadcasts to ``sizes`` (None: any size)."""
    if len(shape) > len(sizes):
        return False
    return all(n == 1 or s is None or n == s for n, s in zip(reversed(shape), reversed(sizes), strict=False))
