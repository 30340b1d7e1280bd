"""The gradient oracle: ``.grad`` of every saved value against ``torch.autograd.grad``."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..model import AtlasModel
from ..requests import Geometry, grad_through_base
from .checks import GRAD_BLOCK_VALUES, GRADIENT_COUNTS, GRADIENT_GAPS, _fixed_inputs
from .tiny import build
from .values import each_host, standard_values


def _scalar(logits: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A scalar of the logits that every position and token reaches: a fixed random projection."""
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed), dtype=logits.dtype)
    return (logits * weights).sum()


def _grad_seen_as(base_grad: torch.Tensor, base: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The gradient of a tensor ``base`` read at the elements of ``value``, a view of its storage."""
    return grad_through_base(base_grad, Geometry(base), Geometry(value))


def _close(ours: torch.Tensor | None, theirs: torch.Tensor | None, like: torch.Tensor, what: str) -> float:
    a = torch.zeros_like(like) if ours is None else ours
    b = torch.zeros_like(like) if theirs is None else theirs
    assert a.shape == b.shape, f"{what}: gradient of shape {list(a.shape)}, expected {list(b.shape)}"
    err = float((a - b).abs().max()) if a.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    assert err <= 1e-5 * max(1.0, scale), f"{what}: gradient off by {err:.3g} (largest {scale:.3g})"
    return err


def check_gradients(family: str, variant: str | None = None) -> float:
    """The gradient oracle (``_check_gradients``); on a family of GRADIENT_GAPS, it must fail there."""
    gap = GRADIENT_GAPS.get(family)
    if gap is None:
        return _check_gradients(family, variant)
    import pytest

    with pytest.raises(AssertionError, match=re.escape(f"{family}: {gap}")):
        _check_gradients(family, variant)
    return float("nan")


def _check_gradients(family: str, variant: str | None = None) -> float:
    """The gradient oracle: after ``trace(grad=True)`` and a backward from the saved logits, the
    ``.grad`` of every saved value equals ``torch.autograd.grad`` of the same scalar with respect
    to the tensor whose storage holds it (the same graph; total derivative), and the block values
    equal the gradients of a separate plain forward read with plain torch forward hooks. Returns
    the largest error seen."""
    model = build(family, attn_implementation="eager", variant=variant, perturbed=True)
    inputs = _fixed_inputs(model)
    saved: dict[str, torch.Tensor] = {}
    copies: set[str] = set()  # served as snapshots (copy: true): no tensor of the forward's graph holds them
    with model.trace(dict(inputs), order="any", grad=True):
        for handle in standard_values(model):
            spec = handle._spec
            if spec is not None and spec.layout.dtype in ("long", "bool", "object"):
                continue
            value = handle.save()
            if isinstance(value, torch.Tensor):
                saved[handle.label] = value
                if handle._spec is not None and getattr(handle._spec, "copy", False):
                    copies.add(handle.label)
        logits = model.logits.save()
    assert logits.grad_fn is not None, f"{family}: trace(grad=True) saved logits without autograd history"
    loss = _scalar(logits)
    float_saved = {k: v for k, v in saved.items() if v.requires_grad}
    assert any(k.endswith("layer_output") for k in float_saved), f"{family}: no saved layer_output requires grad"
    bases = {k: v._base if v._base is not None else v for k, v in float_saved.items()}
    loss.backward(retain_graph=True)
    with warnings.catch_warnings():  # (.grad of a non-leaf that the backward did not reach warns)
        warnings.simplefilter("ignore")
        ours = {k: v.grad for k, v in float_saved.items()}  # (torch.autograd.grad runs the hooks too: read first)
    reached = sum(g is not None for g in ours.values())
    assert reached >= len(float_saved) // 2, f"{family}: the backward reached {reached} of {len(float_saved)} values"
    theirs = torch.autograd.grad(loss, list(bases.values()), allow_unused=True)
    worst = 0.0
    for (label, v), base, g in zip(float_saved.items(), bases.values(), theirs):
        if label in copies:  # its .grad is the native tensor's: the plain forward's hooks check it below
            continue
        expected = None if g is None else _grad_seen_as(g, base, v)
        worst = max(worst, _close(ours[label], expected, v, f"{family}: {label} (autograd in the same graph)"))
    for label, v in float_saved.items():
        v.grad = ours[label]
    worst = max(worst, _plain_block_gradients(model, inputs, saved, family))
    GRADIENT_COUNTS[family] = (len(float_saved), reached)
    return worst


def _plain_block_gradients(model: AtlasModel, inputs: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
                           family: str) -> float:
    """The block values' gradients from a plain forward of the native model with plain torch hooks."""
    natives: dict[str, torch.Tensor] = {}
    handles = []
    for label, value in saved.items():
        name = label.rsplit(".", 1)[-1]
        if name not in GRAD_BLOCK_VALUES or not value.requires_grad:
            continue
        host_label = label.rsplit(".", 1)[0]
        host = next(h for lab, h in each_host(model, _path_of(host_label)) if lab == host_label)
        target = model._target(getattr(host, name))
        if target.view or target.extra or target.site.kind not in ("pre", "post"):
            continue

        def keep(mod: Any, args: Any, kwargs: Any, out: Any = None, t: Any = target, label: str = label) -> None:
            natives[label] = t.native(out if t.side == "output" else (args, kwargs))
        if target.side == "output":
            handles.append(target.module.register_forward_hook(
                lambda m, a, k, o, keep=keep: keep(m, a, k, o), with_kwargs=True))
        else:
            handles.append(target.module.register_forward_pre_hook(
                lambda m, a, k, keep=keep: keep(m, a, k), with_kwargs=True))
    try:
        out = model.native(**inputs)
    finally:
        for h in handles:
            h.remove()
    assert natives, f"{family}: no block value read by a module hook"
    grads = torch.autograd.grad(_scalar(out.logits), list(natives.values()), allow_unused=True)
    worst = 0.0
    for (label, native), g in zip(natives.items(), grads):
        worst = max(worst, _close(saved[label].grad, g, native, f"{family}: {label} (plain forward hooks)"))
    return worst


def _path_of(label: str) -> str:
    """``layers[3].self_attn`` -> ``layers[i].self_attn``: the spec path of a host label."""
    return re.sub(r"\[\d+\]", "[i]", label)
