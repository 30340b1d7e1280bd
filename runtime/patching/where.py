"""What a sweep or an attribution patches: the value's handle at each block, its position axis, the two
prompts as one-row inputs of the same length, the blocks and positions asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..cache.model_cache import _walk
from ..errors import InputError, UnknownName
from ..inputs.prepare import prepare
from ..inputs.validate import accepted_kwargs
from ..model import AtlasModel
from ..tree.values import Value


def block_value(model: AtlasModel, i: int, name: str) -> Value | None:
    """The handle of ``name`` at block ``i``: on the block itself (``layer_output``), at a path below it
    (``self_attn.attention_output``), or on whichever host below the block serves it (``attention_output``
    is ``self_attn``'s on an attention block, ``linear_attn``'s on a DeltaNet block); None when none does."""
    block = model.layers[i]
    found = _walk(block, name)
    if found is not None or "." in name:
        return found
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        if path.startswith("layers[i]."):
            found = _walk(block, f"{path[len('layers[i].'):]}.{name}")
            if found is not None:
                return found
    return None


def handles(model: AtlasModel, name: str, layers: Iterable[int] | None) -> tuple[list[int], list[Value]]:
    """The blocks (each once, in the order asked) and the value's handle at each, checked: a name no block
    serves raises UnknownName, a block without it or a load that cannot serve it says so."""
    if not isinstance(name, str) or not name:
        raise InputError(f"value: expected a value name such as 'layer_output', got {name!r}")
    n = len(model.layers)
    if layers is None:
        found = [(i, h) for i in range(n) if (h := block_value(model, i, name)) is not None]
        if not found:
            raise UnknownName(f"{name} is no block value of {model.family} (model.support() lists them)")
    else:
        layers = _ints(layers, "layers", "block indices")
        if not layers:
            raise InputError("layers: an empty list; give at least one block (None: every block)")
        found = []
        for i in dict.fromkeys(i % n if -n <= i < n else i for i in layers):
            if not 0 <= i < n:
                raise InputError(f"layers: {i} is not a block index; {model.family} has layers[0] to layers[{n - 1}]")
            h = block_value(model, i, name)
            if h is None:
                raise UnknownName(f"layers[{i}] has no {name} ({model.family}: model.support() lists each block's values)")
            found.append((i, h))
    for _, h in found:
        why = h.unavailable()
        if why is not None:
            raise why
        seq_axis(h)
    return [i for i, _ in found], [h for _, h in found]


def seq_axis(handle: Value) -> int:
    """The position axis of the value's layout (its first axis must be the batch)."""
    dims = handle._spec.layout.dims if handle._spec is not None else ()
    if not dims or dims[0] != "batch" or "seq" not in dims:
        raise InputError(f"{handle.label} has layout [{' '.join(dims)}]: a sweep patches one position of one row, "
                         "so it needs a value laid out [batch seq ...]")
    return dims.index("seq")


def one_row(model: AtlasModel, prompt: Any, what: str) -> dict[str, Any]:
    """The forward's inputs for one prompt (a string, token ids, or a dict of one row), checked."""
    if isinstance(prompt, list | tuple) and len(prompt) != 1 and all(isinstance(p, str) for p in prompt):
        raise InputError(f"{what}: expected one prompt, got {len(prompt)}; a sweep compares two single prompts")
    inputs = prepare(model, prompt, {})
    ids = inputs.get("input_ids", inputs.get("inputs_embeds"))
    if not isinstance(ids, torch.Tensor) or ids.dim() < 2 or ids.shape[0] != 1:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else None
        raise InputError(f"{what}: expected one row of tokens, got input of shape {shape}")
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        raise InputError(f"{what}: the attention mask hides some tokens; a sweep takes one unpadded prompt")
    accepted = accepted_kwargs(model._module)
    if accepted is None or "use_cache" in accepted:
        inputs["use_cache"] = False  # no cache passed from block to block: the blocks read only the stream
    return inputs


def pair(model: AtlasModel, clean: Any, corrupt: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(clean inputs, corrupt inputs, their length): both one row, of the same number of tokens."""
    a, b = one_row(model, clean, "clean"), one_row(model, corrupt, "corrupt")
    la, lb = length(a), length(b)
    if la != lb:
        raise InputError(f"clean has {la} tokens and corrupt {lb}: patching needs prompts of the same length")
    return a, b, la


def length(inputs: dict[str, Any]) -> int:
    ids = inputs.get("input_ids", inputs.get("inputs_embeds"))
    assert isinstance(ids, torch.Tensor)  # (one_row checked it)
    return int(ids.shape[1])


def _ints(given: Iterable[int], what: str, kind: str) -> list[int]:
    listed = list(given) if isinstance(given, Iterable) and not isinstance(given, str | bytes) else None
    if listed is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
        raise InputError(f"{what}: expected a list of {kind}, got {given!r}")
    return listed


def positions_of(positions: Iterable[int] | None, seq: int) -> list[int]:
    if positions is None:
        return list(range(seq))
    positions = _ints(positions, "positions", "token positions")
    out = []
    for p in positions:
        if not -seq <= p < seq:
            raise InputError(f"positions: {p} is outside the prompt's {seq} tokens")
        out.append(p % seq)
    if not out:
        raise InputError("positions: an empty list; give at least one position (None: every position)")
    return list(dict.fromkeys(out))


def key(handle: Value, rows: torch.Tensor, at: torch.Tensor) -> tuple[Any, ...]:
    """The index of row ``rows[k]`` at position ``at[k]`` (for every k) in the value's layout."""
    axis = seq_axis(handle)
    return (rows, *([slice(None)] * (axis - 1)), at)


def repeat_rows(inputs: dict[str, Any], rows: int) -> dict[str, Any]:
    """One-row inputs for ``rows`` rows (every tensor with a batch of 1 repeated)."""
    return {k: (v.repeat(rows, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == 1 else v)
            for k, v in inputs.items()}


def metric_values(metric: Any, logits: torch.Tensor, rows: int) -> torch.Tensor:
    """``metric(logits)`` checked: one number per row."""
    out = metric(logits)
    if not isinstance(out, torch.Tensor) or out.dim() != 1 or out.shape[0] != rows:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InputError(f"metric: expected a tensor of one number per row [{rows}] from logits "
                         f"{tuple(logits.shape)}, got {shape}")
    return out


def checked(what: str, model: Any, metric: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The metric, once the model is a wrapped one and the metric a function (else one line saying what was
    expected)."""
    if not isinstance(model, AtlasModel):
        raise InputError(f"{what}: expected a model from nnatlas.wrap or nnatlas.load, got {type(model).__name__}")
    if not callable(metric):
        raise InputError("metric: expected a function of the logits [batch seq vocab] giving [batch], e.g. "
                         "lambda logits: logits[:, -1].log_softmax(-1)[:, answer]")
    return metric  # type: ignore[no-any-return]


def setup(model: AtlasModel, clean: Any, corrupt: Any, value: str, layers: Iterable[int] | None,
          positions: Iterable[int] | None) -> tuple[dict[str, Any], dict[str, Any], list[int], list[Value], list[int]]:
    """(clean inputs, corrupt inputs, the blocks, the value's handle at each, the positions), all checked."""
    clean_in, corrupt_in, seq = pair(model, clean, corrupt)
    blocks, found = handles(model, value, layers)
    return clean_in, corrupt_in, blocks, found, positions_of(positions, seq)


def clean_values(model: AtlasModel, clean_in: dict[str, Any], found: list[Value]) -> list[Any]:
    """The value at each block in the clean run (no gradient)."""
    with torch.no_grad(), model.trace(clean_in, order="any"):
        saved = [h.save() for h in found]
    return saved
