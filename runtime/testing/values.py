"""Every standard value of a wrapped model, its expected shape, and how an identity's terms resolve."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..errors import NnatlasError
from ..model import AtlasModel


def each_host(model: AtlasModel, path: str) -> Iterator[tuple[str, Any]]:
    """Every live host at a spec path (``layers[i].self_attn`` → one per block that has it)."""
    return model.live_hosts(path)


def standard_values(model: AtlasModel, derived: bool = True, needs_images: bool = True) -> list[Any]:
    """Every value handle of every live host that this load serves, in spec order; without the
    derived ones (``derived=False``) or those computed only on a call with images."""
    handles = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for _label, host in model.live_hosts(path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if (not derived and v.read.kind == "derived") or (not needs_images and v.reached is not None):
                        continue
                    handle = getattr(host, v.name)
                    if handle.unavailable() is None:
                        handles.append(handle)
    return handles


def resolve_term(host: Any, term: str, model: Any = None, index: int | None = None) -> Any:
    """``self_attn.attention_output`` / ``layers[0].layer_input`` / ``o_proj.input`` from a host;
    ``model.layers[i+1].layer_input`` from the root, ``i`` being the host's block index."""
    import re

    node = host
    if term.startswith("model.") and model is not None:
        node, term = model, term[len("model."):]
    if index is not None:
        term = re.sub(r"\[i([+-]\d+)?\]", lambda m: f"[{index + int(m.group(1) or 0)}]", term)
    for part in term.split("."):
        name, _, idx = part.partition("[")
        node = getattr(node, name)
        if idx:
            node = node[int(idx.rstrip("]"))]
    return node


def tensor_term(host: Any, term: str, model: Any = None, index: int | None = None) -> torch.Tensor | None:
    """The parameter or buffer an identity term names, relative to the host's module
    (``gate.e_score_correction_bias``: a buffer of the host's child ``gate``), or None when the term
    names a value, a boundary or a config entry. A copy, read outside the trace: the forward does not
    change it. A term that names neither raises ``AssertionError`` saying what the module holds."""
    *prefix, last = term.split(".")
    if last in ("input", "output") or term.startswith("model."):
        return None
    node = host
    if prefix:
        try:
            node = resolve_term(host, ".".join(prefix), model, index)
        except (NnatlasError, AttributeError):
            return None  # reported by the trace that reads the term
    if not hasattr(node, "_specs") or node._model._value_spec(node._pattern, node._block_index(), last) is not None:
        return None
    module = node._module
    tensors = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}
    if last in tensors:
        return tensors[last].detach().clone()
    try:
        getattr(node, last)
    except (NnatlasError, AttributeError):
        held = ", ".join(sorted(tensors)) or "none"
        raise AssertionError(f"identity term '{term}': {type(module).__name__} has no value, parameter or buffer "
                             f"'{last}' (its parameters and buffers: {held})") from None
    return None


def host_specs(model: AtlasModel, host: Any) -> list[Any]:
    return host._specs() if host is not model else model._specs_for("model", None)


def dims_of(model: AtlasModel, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
    batch, seq = inputs["input_ids"].shape
    dims = {k: v for k, v in model.normalized_config.items() if isinstance(v, int)}
    dims.update(batch=int(batch), seq=int(seq), query=int(seq), key=int(seq), one=1)
    grid = inputs.get("image_grid_thw")
    if grid is not None:
        patches = int(grid.prod(-1).sum())
        merge = int(dims.get("vision_spatial_merge_size", 1))
        dims.update(images=1, patches=patches, image_tokens=patches // (merge * merge))
    elif inputs.get("pixel_values") is not None:  # a fixed-size encoder: one row per image
        token_id = int(getattr(model.config, "image_token_id", -1))
        image = torch.eq(torch.as_tensor(inputs["input_ids"]), token_id)
        dims.update(tiles=int(inputs["pixel_values"].shape[0]), image_tokens=int(image.sum()))
    return dims


def expected_shape(layout: Any, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(dims[d] for d in layout.dims)


COMPARE: dict[str, Callable[[Any, Any], Any]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt,
                                                 ">=": operator.ge, "!=": operator.ne}


def assert_identity(identity: Any, lhs: Any, rhs: Any, where: str | Callable[[], str]) -> None:
    """``where`` names the check in the failure message (a function: made only on failure)."""
    def at() -> str:
        return where() if callable(where) else where

    if identity.op == "==":
        if not isinstance(lhs, torch.Tensor) and not isinstance(rhs, torch.Tensor):
            assert lhs == rhs, f"{at()}: {identity.text}: {lhs!r} != {rhs!r}"
            return
        lhs_t = lhs if isinstance(lhs, torch.Tensor) else torch.as_tensor(lhs)
        rhs_t = rhs if isinstance(rhs, torch.Tensor) else torch.as_tensor(rhs)
        lhs_t, rhs_t = torch.broadcast_tensors(lhs_t.to(torch.float64), rhs_t.to(torch.float64))
        torch.testing.assert_close(lhs_t, rhs_t, atol=identity.atol, rtol=identity.rtol,
                                   msg=lambda m: f"{at()}: {identity.text}\n{m}")
    else:
        ok = COMPARE[identity.op](lhs, rhs)
        assert bool(torch.as_tensor(ok).all()), f"{at()}: {identity.text} does not hold"


def _block_index(label: str) -> int:
    found = re.match(r"layers\[(\d+)\]", label)
    assert found, label
    return int(found.group(1))


def _blocks_with(model: AtlasModel, name: str) -> list[tuple[int, Any]]:
    """(block index, host) of every live host under layers[i] that serves ``name`` on this load, in block order,
    and within a block in the order the spec lists the hosts, the order they run (JetMoE's attention router, then
    its MLP's: ``output_router_logits`` returns them so)."""
    found: dict[tuple[int, int, str], Any] = {}
    for rank, path in enumerate(dict.fromkeys(h.path for h in model._family.hosts)):
        if not path.startswith("layers[i]"):
            continue
        for label, host in each_host(model, path):
            if any(s.value(name) for s in host_specs(model, host)) and getattr(host, name).unavailable() is None:
                found[(_block_index(label), rank, label)] = host
    return [(k[0], host) for k, host in sorted(found.items())]
