"""Where each value of a wrapped model is served: a value handle's :class:`~nnatlas.trace.requests.Target` (its
site, access and view) on the live model, and why this load cannot serve (or edit) it."""

from __future__ import annotations

from typing import Any, cast

import torch

from ..errors import NnatlasError, Unavailable
from ..inputs.validate import _config_dims, layout_sizes
from ..parallel import tensor_parallel
from ..spec import CALL_DIMS, Condition, Family
from ..trace import conditions, patterns, sites
from ..trace.requests import CallDim, SiteKey, Target
from ..trace.tracer import Tracer
from .hosts import Host, resolve_native
from .model_tree import ModelTree
from .values import Value


class ModelTargets(ModelTree):
    """The model's value handles resolved to their sites (cached per value, for the module it was resolved on)."""

    def __init__(self, hf_model: torch.nn.Module, family: Family, tokenizer: Any = None, processor: Any = None):
        super().__init__(hf_model, family, tokenizer, processor)
        # (read, extra, label) -> (the host's module, Target, native path): one entry per value, replaced
        # when the host's module is (so that a module swapped out is not kept alive, nor the cache grown)
        object.__setattr__(self, "_targets_cache", {})

    def _active_tracer(self, label: str) -> Tracer:
        tracer = self._tracer
        if tracer is None:
            raise NnatlasError(f"{label} is read inside `with model.trace(...)` (or model.generate(...))")
        return tracer

    def _why_unavailable(self, value: Value, edit: bool = False) -> Unavailable | None:
        """Why this load cannot serve ``value`` (or, with ``edit``, cannot edit it), or None."""
        spec = value._spec
        if spec is None or (spec.needs is None and spec.read.kind != "missing"):
            return None
        if spec.read.kind == "missing":
            return Unavailable(f"{value.label} does not exist in family {self.family}: {spec.read.words}")
        assert spec.needs is not None
        if spec.needs.never:
            return Unavailable(f"{value.label} {spec.needs.says}. Instead: {spec.needs.fix}")
        module = value._host._module
        if value._read.kind in ("call", "op", "method"):
            try:
                module = self._scope_module(cast(Host, value._host), value._read, value.label)
            except NnatlasError:
                pass
        if spec.needs.name == "eager" and recomputed(value._read, module, self.config):
            if not edit:
                return None
            impl = sites.attention_implementation(getattr(module, "config", None) or self.config)
            return Unavailable(f"{value.label} cannot be edited under this load (attn_implementation={impl!r}): it is "
                               f"{patterns.words(value._read)}, and {patterns.EDIT_WORDS}. Fix: {spec.needs.fix}")
        tracer = self._tracer
        cfg = getattr(module, "config", None) or self.config
        met: bool | None
        if tracer is None:
            met = conditions_met(spec.needs.name, self, module, spec.needs)
        else:  # a load condition holds for the whole trace body: asked once per config it reads
            key = (id(cfg), id(spec.needs))
            asked = tracer.conditions
            if asked is None:
                asked = tracer.conditions = {}
            met = asked.get(key)
            if met is None:
                met = asked[key] = conditions_met(spec.needs.name, self, module, spec.needs)
        if met:
            return None
        under = conditions.under(spec.needs, cfg, getattr(value._host._module, "config", self.config),
                                 type(self._module).__name__, self._processor)
        if spec.needs.name == "eager" and value._read.recomputable:
            return Unavailable(f"{value.label} is unavailable {under}: it needs {patterns.serving_loads(value._read)}. "
                               f"Fix: {spec.needs.fix}")
        return Unavailable(f"{value.label} is unavailable {under}: it {spec.needs.says}. Fix: {spec.needs.fix}")

    def _scope_module(self, host: Host, read: Any, label: str) -> torch.nn.Module:
        """The module whose forward (calls, ops) or methods a read point names: ``read.module``, a
        path from the host, or from the root when ``scope_root``; the host itself when empty."""
        start: Host = self if read.scope_root else host._up(read.up, label) if read.up else host
        if not read.module:
            return start._module
        return start._resolve_module(tuple(read.module), label)

    def _target(self, value: Value, edit: bool = False) -> Target:
        spec = value._spec
        if spec is not None and (spec.needs is not None or spec.read.kind == "missing"):
            why = self._why_unavailable(value, edit)
            if why is not None:
                raise why
        # resolved once per value and host module: a cached target is used while its module is still the
        # one the host's path leads to (a replaced submodule resolves afresh); a handle keeps its own
        host_module = value._host._module
        cached = value.__dict__.get("_cached_target")
        if cached is not None:
            target, path = cached
            if path is None or resolve_native(host_module, path) is target.module:
                return target  # type: ignore[no-any-return]
        key: Any = (id(value._read), value._extra, value.label)
        try:
            entry = self._targets_cache.get(key)
        except TypeError:  # an index that does not hash (a slice before Python 3.12, a tensor): not kept
            key, entry = None, None
        if entry is not None:
            held, target, path = entry
            if held is host_module and (path is None or resolve_native(host_module, path) is target.module):
                value.__dict__["_cached_target"] = (target, path)
                return target
        target = self._resolve_target(value)
        if spec is not None and spec.layout.dtype != "object":
            target.layout = spec.layout.text  # (a tensor layout: the messages of bad edits name it)
        if self._tp is not None:  # a tensor-parallel model: served as full values, gathered from the ranks
            target = self._sharded(value, target)
        path = None
        if target.module is not host_module:
            path = next((n for n, m in host_module.named_modules() if m is target.module), None)
        if key is not None and (target.module is host_module or path is not None):
            self._targets_cache[key] = (host_module, target, path)
        return target

    def _sharded(self, value: Value, target: Target) -> Target:
        """``target`` on a tensor-parallel model, with the layout's sizes its gathers are found from."""
        spec = value._spec
        sizes: tuple[int | None, ...] | None = None
        axes: tuple[str, ...] = ()
        if spec is not None and spec.layout.dtype != "object":
            axes = tuple(spec.layout.dims)
            sizes = tuple(layout_sizes(value, _config_dims(self)))
        return tensor_parallel.shard_target(target, self._tp, sizes, axes)

    def _resolve_target(self, value: Value) -> Target:
        read, host = value._read, cast(Host, value._host)  # (a handle types its host by what it uses of one)
        view = tuple((op, tuple(self._view_arg(a) for a in args)) for op, args in (
            ((v.name, v.args) for v in value._spec.view) if value._spec else ()))
        dims_module = self._module if _names_call_dims(view) else None  # the model's call gives [batch, seq]
        extra: dict[str, Any] = {"dims_module": dims_module, "copy": bool(value._spec and value._spec.copy),
                                 "reached": value._spec.reached if value._spec else None,
                                 "at": value._spec.at if value._spec else ""}
        key: SiteKey
        if read.kind == "module":
            start = host._up(read.up, value.label) if read.up else host
            module = start._resolve_module(read.module, value.label)
            side = read.side
            key = SiteKey("pre" if side in ("input", "inputs") else "post", id(module))
            return Target(value.label, key, module, side, read.param, read.access, view, value._extra, **extra)
        # an interface call, an operation or a method: in the host's own forward, or in another module's
        # (``router > op:...`` from the host, ``model.model > op:...`` from the root)
        module = self._scope_module(host, read, value.label)
        if read.kind == "call":
            key = SiteKey("call_in" if read.side == "args" else "call_out", id(module), read.call)
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra,
                          call=read.call_occurrence, **extra)
        if read.kind == "op":
            key = SiteKey("op", id(module), read.call, read.op, read.occurrence, read.side)
            side = "args" if read.side == "input" else "output"
            # an op inside an interface call fires once per call: the firing is the call's (call:NAME#K > op:...)
            return Target(value.label, key, module, side, None, read.access, view, value._extra,
                          call=read.call_occurrence, **extra)
        if read.kind == "method":
            if not callable(getattr(module, read.method or "", None)):
                raise NnatlasError(f"{value.label}: {type(module).__name__} has no method {read.method}")
            occurrence = read.occurrence
            if read.per_index:
                index = host._index
                if index is None:
                    raise NnatlasError(f"{value.label}: method:{read.method}#i needs a host with a block index")
                occurrence = index
            key = SiteKey("method_in" if read.side == "args" else "method_out", id(module), read.method)
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra, call=occurrence,
                          **extra)
        if read.kind == "fn":
            assert read.fn is not None
            key = SiteKey(read.side, id(module), read.fn)
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra, **extra)
        raise NnatlasError(f"{value.label} is derived; it has no site of its own")

    def _view_arg(self, a: Any) -> Any:
        if isinstance(a, tuple):
            return tuple(self._view_arg(x) for x in a)
        if a in CALL_DIMS:
            return CallDim(a)
        return self.config_value(a) if isinstance(a, str) else a


def _names_call_dims(view: Any) -> bool:
    if isinstance(view, CallDim):
        return True
    if isinstance(view, tuple):
        return any(_names_call_dims(x) for x in view)
    return False


def recomputed(read: Any, module: torch.nn.Module, config: Any) -> bool:
    """Whether a recomputable read is served by recomputing the pattern under this load (sdpa, flex
    attention: ``patterns``)."""
    if not read.recomputable:
        return False
    impl = sites.attention_implementation(getattr(module, "config", None) or config)
    return impl in patterns.RECOMPUTED if read.call == "attention" else impl == read.recompute


def conditions_met(name: str, model: ModelTree, module: torch.nn.Module, condition: Condition | None = None) -> bool:
    """Whether this load serves a value with load condition ``name`` read in ``module`` (decided by
    :mod:`nnatlas.trace.conditions`)."""
    cfg = getattr(module, "config", None) or model.config
    return conditions.load_met(condition or Condition(name, "", ""), cfg, model._processor, model._kernel_route())
