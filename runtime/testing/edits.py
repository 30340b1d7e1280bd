"""The edit checks: a value written back unchanged leaves the logits bit-identical, zeroed it changes them, and
never the model's own tensors; a read-only value refuses assignment."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Mapping
from typing import Any

import torch

import nnatlas

from ..errors import NnatlasError, Unavailable
from ..model import AtlasModel
from .cases import _fixed_inputs
from .served import _first_host
from .tiny import shared_build


def check_edit(family: str, path: str, name: str, experts: str | None = None, variant: str | None = None) -> None:
    """Writing a value back unchanged leaves logits bit-identical; zeroing it changes them (under
    ``route_kernels`` for a value that needs it; under ``experts``, the experts implementation)."""

    model = shared_build(family, attn_implementation="eager", experts=experts, variant=variant, perturbed=True)
    spec = next(v for h in model._family.hosts if h.path == path for v in h.values if v.name == name)
    routed = spec.needs is not None and spec.needs.name == "torch_kernels"
    weights = {k: v.clone() for k, v in model.native.state_dict().items()}
    with nnatlas.route_kernels(family, "torch") if routed else contextlib.nullcontext():
        _check_edit(model, path, name, routed)
    # an edit changes its forward, never the model (a value that is a weight, an op's operand, included)
    changed = [k for k, v in model.native.state_dict().items() if not torch.equal(v, weights[k])]
    assert not changed, f"editing {path}.{name} changed the model's own tensors: {', '.join(changed)}"


def _check_edit(model: AtlasModel, path: str, name: str, routed: bool = False) -> None:
    inputs = _fixed_inputs(model)
    label, host = _first_host(model, path, name, missing=False)
    why = getattr(host, name).unavailable()
    if why is not None:
        # the value names the load it needs; under this one, reading or editing it says so
        for body in (lambda: getattr(host, name).save(), lambda: setattr(host, name, 0)):
            try:
                with model.trace(dict(inputs)):
                    body()
            except Unavailable as e:
                assert str(e) == str(why)
            else:
                raise AssertionError(f"{label}.{name}: unavailable() says {why}, yet the trace served it")
        return
    base = _plain_logits(model, inputs, routed)
    with model.trace(dict(inputs)):
        setattr(host, name, getattr(host, name))
        same = model.logits.save()
    assert torch.equal(base, same), f"{label}.{name}: writing the value back changed the logits"
    with model.trace(dict(inputs)):
        getattr(host, name)[:] = 0
        zeroed = model.logits.save()
    assert not torch.equal(base, zeroed), f"{label}.{name}: zeroing the value did not change the logits"
    with model.trace(dict(inputs)):
        setattr(host, name, lambda x: x * 0)
        fn_zeroed = model.logits.save()
    torch.testing.assert_close(fn_zeroed, zeroed, atol=0, rtol=0)


_PLAIN: weakref.WeakKeyDictionary[AtlasModel, dict[tuple[Any, ...], torch.Tensor]] = weakref.WeakKeyDictionary()


def _plain_logits(model: AtlasModel, inputs: Mapping[str, torch.Tensor], routed: bool) -> torch.Tensor:
    """The logits of a trace with no edit, once per model, inputs and kernel routing (``routed``: inside
    route_kernels): every edit check of a family compares with them on its shared model, which no edit
    changes (check_edit asserts it)."""
    key = (routed, *((k, tuple(v.shape), v.numpy().tobytes()) for k, v in sorted(inputs.items())))
    memo = _PLAIN.setdefault(model, {})
    if key not in memo:
        with model.trace(dict(inputs)):
            memo[key] = model.logits.save()
    return memo[key]


def check_readonly(family: str, path: str, name: str, variant: str | None = None) -> None:
    model = shared_build(family, variant=variant, perturbed=True)
    _, host = _first_host(model, path, name, missing=False)
    try:
        with model.trace(dict(_fixed_inputs(model))):
            setattr(host, name, 0)
    except NnatlasError as e:
        assert "read-only" in str(e)
    else:
        raise AssertionError(f"{path}.{name} is derived, yet assigning it raised nothing")
