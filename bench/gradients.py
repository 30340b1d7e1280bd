"""Gradients: what ``trace(grad=True)`` costs beside a plain forward and backward.

Memory: the bytes a traced forward allocates with grad and without (``Allocations``), beside the
plain forward's; and the bytes autograd keeps for the backward (the distinct storages of the
tensors saved for backward, counted with ``saved_tensors_hooks``), traced vs plain: the saves add
no copy, so both differences are 0. Time: a traced forward that saves every block's layer_output
plus a backward from the logits, vs a plain forward and backward of the same scalar. Leaks
(``leak_row``): what 1,000 grad traces leave alive once their saves are dropped, in bytes of the
storages they allocated (``nnatlas.testing.Held``), autograd nodes and live tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nnatlas.model import AtlasModel
from nnatlas.testing.suite import LIGHT_KINDS, grad_soak

from . import memory
from .timing import measure
from .workloads import layer_values


def kept_for_backward(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(bytes of the distinct storages autograd saves for the backward while ``fn`` runs, its result)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t.detach()  # (the same storage; ``t`` itself, an op's saved output, would hold its own node: a cycle)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return sum(storages.values()), result


def _traced(model: AtlasModel, inputs: dict[str, torch.Tensor], grad: bool) -> Callable[[], Any]:
    values = layer_values(model)

    def run() -> Any:
        with model.trace(inputs, order="any", grad=grad):
            saved = [v.save() for v in values]
            logits = model.logits.save()
        return saved, logits
    return run


def memory_row(name: str, model: AtlasModel, inputs: dict[str, torch.Tensor]) -> str:
    plain_fwd = lambda: model.native(**inputs).logits  # noqa: E731
    plain_kept, _ = kept_for_backward(plain_fwd)
    ours_kept, _ = kept_for_backward(_traced(model, inputs, True))
    plain_grad, _ = memory.allocated(plain_fwd)
    ours_grad, _ = memory.allocated(_traced(model, inputs, True))
    ours_nograd, _ = memory.allocated(_traced(model, inputs, False))
    with torch.no_grad():
        plain_nograd, _ = memory.allocated(plain_fwd)
    return (f"{name}: traced forward (every layer_output and the logits saved) allocates {ours_grad} bytes with "
            f"grad ({ours_grad - plain_grad:+d} vs a plain forward with grad), {ours_nograd} without "
            f"({ours_nograd - plain_nograd:+d} vs plain without); autograd keeps {ours_kept} bytes for the backward "
            f"({ours_kept - plain_kept:+d} vs plain)")


def timing_row(name: str, model: AtlasModel, inputs: dict[str, torch.Tensor], runs: int) -> str:
    weights = None

    def scalar(logits: torch.Tensor) -> torch.Tensor:
        nonlocal weights
        if weights is None:
            weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))
        return (logits * weights).sum()

    params = [p for p in model.native.parameters() if p.requires_grad]

    def plain() -> None:
        scalar(model.native(**inputs).logits).backward()
        for p in params:
            p.grad = None

    traced = _traced(model, inputs, True)

    def ours() -> None:
        saved, logits = traced()
        scalar(logits).backward()
        assert saved[-1].grad is not None
        for p in params:
            p.grad = None

    t = measure({"plain": plain, "ours": ours}, runs)
    return (f"{name}: plain forward+backward {t.median['plain'] * 1e3:.2f} ms, traced (grad=True, every "
            f"layer_output's .grad) {t.median['ours'] * 1e3:.2f} ms, ours/plain {t.ratio['ours']:.3f}")


def leak_row(name: str, model: AtlasModel, traces: int, seq: int) -> str:
    """What ``traces`` grad traces leave alive once their saves are dropped (``grad_soak``, the kinds
    that do not save every value, in turn): bytes of the storages they allocated, autograd nodes
    of their graphs, live tensors."""
    soak = grad_soak(model, traces, kinds=LIGHT_KINDS, held=True, seq=seq)
    assert soak.held is not None
    held, storages = soak.held
    return (f"{name}: {traces:,} grad traces, saves dropped: {held:,} bytes held after ({storages} storages), "
            f"{sum(soak.nodes.values())} autograd nodes of their graphs alive, {soak.tensors:+d} live tensors")
