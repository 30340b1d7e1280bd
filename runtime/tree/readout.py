"""``model.unembed(x)`` and ``model.logit_lens(values)``: a residual stream read out as the model reads out its
last one, for every family under one call.

The readout is what the spec already declares, and its generated tests check, on the model host:

- the final norm: the module ``final_norm_output`` is read at (``norm.output``; RMSNorm, LayerNorm, a
  ``1 + weight`` gain ... the module applies its own);
- the head: the module ``lm_head_output`` is read at (``lm_head.output``);
- what the model does past the head: the identity ``logits == EXPR`` whose right side names only
  ``lm_head_output`` and config entries (``logit_softcap * tanh(lm_head_output / logit_softcap)`` on
  Gemma 2, ``lm_head_output * logit_scale`` on Cohere, ``lm_head_output / logits_scaling`` on Granite,
  ``lm_head_output`` on Llama).

So ``unembed(layers[-1].layer_output) == logits`` on every family (tests/test_readout.py), and the same
expression is tested as an identity by the family's generated tests. Both run outside a trace on saved
tensors, under grad when the tensors carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import NnatlasError, Unavailable
from ..spec import Identity


@dataclass(frozen=True)
class Readout:
    norm: torch.nn.Module | None  # None for a family with no final norm
    head: torch.nn.Module
    logits: Identity  # logits == f(lm_head_output, config)


class _Values(dict):  # type: ignore[type-arg]
    """An identity's values: ``lm_head_output`` given, config entries looked up when named."""

    def __init__(self, model: Any, head_output: torch.Tensor):
        super().__init__(lm_head_output=head_output, logits=head_output)
        self.model = model

    def __missing__(self, name: str) -> Any:
        return self.model.config_value(name)


def _module_at(model: Any, path: tuple[str, ...]) -> torch.nn.Module | None:
    """The module at a read point's path of standard (or native) child names from the root."""
    node: Any = model
    for part in path:
        node = node._child(part) if node is not None and hasattr(node, "_child") else None
    return getattr(node, "_module", None)


def readout(model: Any) -> Readout:
    """The family's readout on this model: final norm, head, and the logits identity (see the module)."""
    specs = [s for s in model._family.hosts if s.path == "model"]
    values = {v.name: v for s in specs for v in s.values}
    config = set(model._family.config)

    def module_of(name: str) -> torch.nn.Module | None:
        v = values.get(name)
        if v is None or v.read.kind != "module" or v.read.side != "output" or v.read.up:
            return None
        return _module_at(model, v.read.module)

    head = module_of("lm_head_output")
    if head is None:
        raise Unavailable(f"{model.family} declares no lm_head_output read at a module's output: no readout")
    norm = module_of("final_norm_output")
    if norm is None and "final_norm_output" in values:
        raise Unavailable(f"{model.family}'s final_norm_output is not a module's output: no readout")
    found = [i for s in specs for i in s.identities
             if i.op == "==" and i.text.split("==", 1)[0].strip() == "logits"
             and set(i.terms) - {"logits"} <= config | {"lm_head_output"} and "lm_head_output" in i.terms]
    if len(found) != 1:
        raise NnatlasError(f"{model.family}: expected one identity 'logits == f(lm_head_output)' on the model host "
                           f"(the readout), found {len(found)}")
    return Readout(norm, head, found[0])


def unembed(model: Any, x: torch.Tensor, r: Readout | None = None) -> torch.Tensor:
    """``x`` (``[..., hidden_size]``, a residual stream) read out as the logits: final norm, head, then what the
    model does past the head (softcaps, scales, multipliers), as the spec declares them (``r``: the model's
    readout, when the caller has it)."""
    if not isinstance(x, torch.Tensor):
        raise NnatlasError(f"unembed: expected a tensor [..., hidden_size], got {type(x).__name__}")
    if model._tracer is not None:
        raise NnatlasError("unembed: call it after the trace block, on saved values (inside the block a saved "
                           "value is a placeholder until the forward runs)")
    r = r or readout(model)
    hidden = model.config_value("hidden_size")
    if x.shape[-1:] != (hidden,):
        raise NnatlasError(f"unembed: expected [..., {hidden}] (hidden_size), got {list(x.shape)}")
    weight = next(r.head.parameters(), None)
    if weight is not None:
        x = x.to(device=weight.device, dtype=weight.dtype)
    y = r.head(r.norm(x) if r.norm is not None else x)
    return r.logits.check(_Values(model, y))[1]  # type: ignore[no-any-return]


def logit_lens(model: Any, values: Any) -> Any:
    """``unembed`` of each residual value: a tensor, or a list / tuple / dict of them (the same shape back)."""
    r = readout(model)  # found once for every value
    if isinstance(values, Mapping):
        return {k: unembed(model, v, r) for k, v in values.items()}
    if isinstance(values, list | tuple):
        return type(values)(unembed(model, v, r) for v in values)
    return unembed(model, values, r)
