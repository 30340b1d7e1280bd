"""What a load serves, checked: every value's shape, ``support()`` against what a trace reads, the values marked
missing, and the native classes at each path."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

import nnatlas

from ..errors import Unavailable
from ..model import AtlasModel
from .cases import Case, _fixed_inputs
from .tiny import shared_build
from .values import dims_of, each_host, expected_shape, host_specs, resolve_term


def served_values(model: AtlasModel, names: Callable[[Any], list[str]] | None = None) -> Iterator[tuple[str, Any, Any, Any]]:
    """(label, host spec, value spec, handle) of every value this load serves, host by host in the family's order
    (``names``: only those a host's names list); iterated inside a trace, each handle can be saved."""
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in each_host(model, path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if names is not None and v.name not in names(host):
                        continue
                    handle = getattr(host, v.name)
                    if handle.unavailable() is None:
                        yield label, spec, v, handle


def _save_all(model: AtlasModel, inputs: Mapping[str, torch.Tensor], names: Callable[[Any], list[str]] | None = None
              ) -> dict[tuple[str, str], tuple[Any, Any, Any]]:
    saved: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
    with model.trace(dict(inputs), order="any"):
        for label, spec, v, handle in served_values(model, names):
            saved[(label, v.name)] = (v, handle.save(), spec)
    return saved


def _routable(model: AtlasModel) -> bool:
    return any(g.route for g in model._family.functions.values())


def check_shapes(case: Case, experts: str | None = None) -> None:
    """Every value this load serves has its layout's shape (a host's ``dims`` resize its layouts);
    families with a routable kernel are checked a second time under ``route_kernels(family, "torch")``,
    where the per-token values exist. ``experts``: the experts implementation of a mixture."""
    model = case.model("eager", experts)
    _check_shapes(model, case)
    if _routable(model):
        with nnatlas.route_kernels(model.family, "torch"):
            _check_shapes(model, case)


def _check_shapes(model: AtlasModel, case: Case) -> None:
    saved = _save_all(model, case.inputs)
    assert saved, "no value was saved"
    base = dims_of(model, case.inputs)
    for (label, name), (spec, value, host_spec) in saved.items():
        dims = {**base, **{d: base[e] for d, e in host_spec.dims}}
        if spec.layout.dtype == "object":
            continue
        if spec.layout.optional and getattr(value, "value", value) is None:
            continue
        value = getattr(value, "value", value)
        want = expected_shape(spec.layout, dims)
        at = f"{spec.at}: " if spec.at else ""
        assert tuple(value.shape) == want, f"{at}{label}.{name}: shape {tuple(value.shape)}, layout {spec.layout.text} = {want}"


def _first_host(model: AtlasModel, path: str, name: str | None = None, missing: bool | None = None
                ) -> tuple[str, Any]:
    """The first live host at ``path`` (with value ``name``; read, or marked missing, as ``missing`` asks:
    one value may be read on some block kinds of a path and missing on others)."""
    for label, host in each_host(model, path):
        values = [v for s in host_specs(model, host) if (v := s.value(name or "")) is not None]
        if name is None or any(missing is None or (v.read.kind == "missing") == missing for v in values):
            return label, host
    raise AssertionError(f"no live host at {path}" + (f" with {name}" if name else ""))


def check_native_class(family: str, path: str, variant: str | None = None) -> None:
    model = shared_build(family, variant=variant, perturbed=True)
    found = list(each_host(model, path))
    assert found, f"{path}: no native module found (check rename)"
    for label, host in found:
        kinds = host_specs(model, host)
        if not kinds:
            continue
        names = {type(host._module).__name__}
        # the class of the kinds that apply to this block (a path may hold one class per block kind)
        assert any(s.cls in names for s in kinds), f"{label}: native class {names}, spec says {[s.cls for s in kinds]}"


def check_missing(family: str, path: str, name: str) -> None:
    """A value the family marks missing: support() and a trace both say why."""
    model = shared_build(family, perturbed=True)
    label, host = _first_host(model, path, name, missing=True)
    spec = next(s.value(name) for s in host_specs(model, host) if s.value(name) is not None)
    reason = spec.read.words
    rows = [r for r in model.support().rows if r.value == name and r.host == label]
    assert rows and rows[0].status == "missing" and rows[0].why == reason, f"support() on {label}.{name}: {rows}"
    try:
        with model.trace(dict(_fixed_inputs(model))):
            getattr(host, name).save()
    except Unavailable as e:
        assert reason in str(e), str(e)
    else:
        raise AssertionError(f"{label}.{name} is marked missing, yet the trace read it")


def check_support(family: str, attn: str, experts: str | None = None, variant: str | None = None) -> None:
    """support() says available exactly for what a trace can read under this load."""
    model = shared_build(family, attn_implementation=attn, experts=experts, variant=variant, perturbed=True)
    inputs = _fixed_inputs(model)
    rows = model.support().rows
    assert rows
    hosts = {row.host: resolve_term(model, row.host) if row.host != "model" else model for row in rows}
    available = [row for row in rows if row.status == "available"]
    try:  # every value support() calls available, read by one trace (a trace per value was most of this check)
        with model.trace(dict(inputs), order="any"):
            saved = [(row, getattr(hosts[row.host], row.value).save()) for row in available]
    except Exception:  # which value: each read alone says
        for row in available:
            with model.trace(dict(inputs)):
                getattr(hosts[row.host], row.value).save()
        raise
    for row, value in saved:
        assert getattr(value, "filled", True) is not False and (not isinstance(value, torch.Tensor) or value.numel()
                                                                or value.dim() > 1 or row.layout.startswith("scalar")), \
            f"support() says {row.host}.{row.value} is available, but the trace served {value!r}"
    for row in rows:
        if row.status == "available":
            continue
        try:
            with model.trace(dict(inputs)):
                getattr(hosts[row.host], row.value).save()
        except Unavailable as e:
            assert row.why in str(e)
        else:
            raise AssertionError(f"support() says {row.host}.{row.value} is unavailable, but the trace read it")
