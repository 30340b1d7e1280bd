"""The gradient oracle: ``.grad`` of every saved value against ``torch.autograd.grad``."""

from __future__ import annotations

import contextlib
import gc
import re
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import InputError
from ..loading.load import route_kernels
from ..model import AtlasModel
from ..spec import pattern_of
from ..trace.requests import Geometry, grad_through_base
from .cases import _fixed_inputs
from .tiny import build, draw_inputs
from .values import each_host, standard_values

GRADIENT_COUNTS: dict[str, tuple[int, int]] = {}  # family -> (values compared, values the backward reached)


GRAD_BLOCK_VALUES = ("layer_input", "layer_output", "attention_output", "mlp_output")


# Known gaps of the gradient oracle, pinned (a fix makes the test fail: then remove the entry).
GRADIENT_GAPS: dict[str, str] = {}


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
        host = next(h for lab, h in each_host(model, pattern_of(host_label)) if lab == host_label)
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


class Held(TorchDispatchMode):
    """The new storages aten ops produce while active (an output sharing an input's storage, a view,
    ``detach`` or an in-place op, makes none), each held by a weak reference only: ``held()`` is
    what of them is still alive, in bytes, whoever keeps it (a Python tensor or only autograd's
    C++ graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs: set[int] | None = None
        for t in (out,) if type(out) is torch.Tensor else tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key in self.storages:
                    continue
                if inputs is None:
                    inputs = {a.untyped_storage()._cdata for a in tree_flatten((args, kwargs or {}))[0]
                              if isinstance(a, torch.Tensor)}
                if key not in inputs:
                    self.storages[key] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def held(self) -> tuple[int, int]:
        """(bytes, storages) of those still alive."""
        gc.collect()
        alive = [n for ref, n in self.storages.values() if not ref.expired()]
        return sum(alive), len(alive)


# the kinds of trace a soak runs in turn: what is saved, and what is done with it
SOAK_KINDS = {
    "every": "every value saved (views, copies, derived values), no backward",
    "every+backward": "every value saved, a backward",
    "blocks": "every layer_output and the logits saved, no backward",
    "blocks+backward": "every layer_output and the logits saved, two backwards (retain_graph), a number kept",
    "steer": "the manual's steering loop (docs/concepts.md): an edit by a vector that requires grad and one by item, a backward, "
             "an optimizer step",
    "edit": "an edit, nothing saved",
    "raises": "every layer_output saved, then an edit that does not fit raises in the forward",
}
LIGHT_KINDS = ("blocks", "blocks+backward", "steer", "edit", "raises")  # (the bench's: no kind saving every value)


@dataclass
class Soak:
    """What a run of ``trace(grad=True)`` calls left alive once every save was dropped."""

    traces: int
    nodes: dict[str, int]  # per kind of trace: autograd nodes of its graph still alive (tagged: _tag_graph)
    saves: dict[str, int]  # per kind of trace: saved tensors (and the model's output logits) still alive
    tensors: int  # live tensors (gc) after, minus before
    held: tuple[int, int] | None = None  # (bytes, storages) allocated during the run still alive (Held)

    def leaks(self) -> list[str]:
        """What stays alive, in words (nothing: an empty list)."""
        out = [f"{n} autograd nodes of '{kind}' traces" for kind, n in self.nodes.items() if n]
        out += [f"{n} saved tensors of '{kind}' traces" for kind, n in self.saves.items() if n]
        return out


class _Tag:
    """Put in an autograd node's ``metadata`` (freed with the node): a weak reference to it says
    whether the node is alive (a node itself takes no weak reference)."""

    __slots__ = ("__weakref__",)


def _tag_graph(roots: list[Any]) -> list[weakref.ref[_Tag]]:
    """Tag every autograd node reachable from ``roots`` not tagged yet; weak references to the tags."""
    out = []
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node is None or "nnatlas_soak" in node.metadata:
            continue
        tag = node.metadata["nnatlas_soak"] = _Tag()
        out.append(weakref.ref(tag))
        todo += [n for n, _ in node.next_functions]
    return out


def live_tensors() -> int:
    """Tensors alive in Python after a full collection (``type`` rather than ``isinstance``: a module
    object that warns on attribute access is no tensor)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def grad_soak(model: AtlasModel, traces: int, *, kinds: tuple[str, ...] = tuple(SOAK_KINDS), kernels: bool = False,
              held: bool = False, seq: int = 6) -> Soak:
    """``traces`` calls of ``trace(grad=True)`` on ``model``, one of ``kinds`` (``SOAK_KINDS``) after
    the other, each trace's saves dropped after it: the autograd nodes of each trace's graph and
    its saved tensors still alive after (weak references), and the growth of live tensors; with
    ``held``, the bytes of what the run allocated that are still alive (``Held``: slower).
    ``kernels``: inside ``route_kernels`` (a recurrent kernel's per-token step, saved at every
    token, fills the same save again). A first call of each kind runs before (an optimizer's state)."""
    inputs = draw_inputs(model.vocab_size, 1, seq, [0], seed=3)
    routed = lambda: route_kernels(model.family) if kernels else contextlib.nullcontext()  # noqa: E731
    with routed():
        values = [v for v in standard_values(model)
                  if v._spec is None or v._spec.layout.dtype not in ("long", "bool", "object")]
    layers = model.layers
    steer = torch.zeros(model.hidden_size, requires_grad=True)
    optimizer = torch.optim.Adam([steer], lr=0.01)
    params = [p for p in model.native.parameters() if p.requires_grad]
    kept: list[float] = []
    saves: dict[str, list[weakref.ref[Any]]] = {k: [] for k in kinds}
    nodes: dict[str, list[weakref.ref[Any]]] = {k: [] for k in kinds}

    def one(kind: str, watch: bool) -> None:
        saved: list[Any] = []
        logits = output = None
        try:
            with model.trace(dict(inputs), order="any", grad=True) as tracer:
                if kind.startswith("every"):
                    saved = [v.save() for v in values]
                elif kind.startswith("blocks") or kind == "raises":
                    saved = [layer.layer_output.save() for layer in layers]
                    if kind == "raises":
                        layers[-1].mlp.mlp_output[:, 0] = torch.zeros(5)  # (found not to fit in the forward)
                    else:
                        saved.append(model.next_token_probs.save())
                elif kind == "steer":
                    layers[0].layer_output = layers[0].layer_output + steer
                    layers[-1].mlp.mlp_output[:, 0] = 0.0
                else:
                    layers[-1].mlp.mlp_output[:, -1] = 0.0
                if kind != "edit":
                    logits = model.logits.save()
            output = tracer.output.logits
            assert kind != "raises", "an edit that does not fit did not raise"
        except InputError:
            assert kind == "raises", f"{kind}: the trace raised"
        if logits is not None and kind != "raises":
            saved.append(logits)
        if watch:  # (the model's own output too: all an edit without saves leaves)
            tensors = [t for t in [*saved, output] if isinstance(t, torch.Tensor)]
            saves[kind] += [weakref.ref(t) for t in tensors]
            nodes[kind] += _tag_graph([t.grad_fn for t in tensors if t.grad_fn is not None])
        if logits is not None and kind in ("every+backward", "blocks+backward", "steer"):
            loss = -logits[0, -1].log_softmax(-1)[1]
            if kind == "steer":
                optimizer.zero_grad()
            loss.backward(retain_graph=kind == "blocks+backward")
            if kind == "blocks+backward":
                loss.backward()
                kept.append(float(saved[0].grad.sum()))
            if kind == "steer":
                optimizer.step()
        for p in params:
            p.grad = None

    with routed():
        for kind in kinds:
            one(kind, False)
        optimizer.zero_grad()  # (the steering vector's .grad: the user's, not the traces')
        before = live_tensors()
        with Held() if held else contextlib.nullcontext() as mode:
            for i in range(traces):
                one(kinds[i % len(kinds)], True)
            optimizer.zero_grad()
        after = live_tensors()
    alive = lambda refs: sum(r() is not None for r in refs)  # noqa: E731
    return Soak(traces, {k: alive(v) for k, v in nodes.items()}, {k: alive(v) for k, v in saves.items()},
                after - before, mode.held() if mode is not None else None)
