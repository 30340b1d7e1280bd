"""One forward of a tiny model, recorded: every module call, every call of a function of the
modeling modules (the attention function, kernels), and every torch operation, each with the
module (and function call) it ran in. Tensors are copied as they are seen, so later in-place
writes do not change the record. Everything is put back when the forward ends."""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def snap(x: Any) -> Any:
    """A copy of every tensor in ``x`` (tuples, lists, dicts and model outputs walked)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(snap(v) for v in x) if type(x) in (tuple, list) else [snap(v) for v in x]
    if isinstance(x, dict):
        return {k: snap(v) for k, v in x.items()}
    return x


@dataclass
class ModuleCall:
    path: str
    cls: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    start: int  # event counter when it began and ended
    end: int
    parent: str | None  # the module whose forward made this call


@dataclass
class FnCall:
    name: str
    module: str | None  # the innermost module running
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    start: int
    end: int
    params: tuple[str, ...] = ()  # the function's positional parameter names


@dataclass
class Op:
    name: str
    module: str | None
    fn: int | None  # index of the innermost function call running, in Recording.fns
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    at: int


@dataclass
class Recording:
    model: Any
    inputs: dict[str, torch.Tensor]
    output: Any
    calls: list[ModuleCall] = field(default_factory=list)
    fns: list[FnCall] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    def call(self, path: str) -> ModuleCall | None:
        return next((c for c in self.calls if c.path == path), None)

    def children_calls(self, path: str) -> list[ModuleCall]:
        """The calls this module's forward made directly, in order."""
        return sorted((c for c in self.calls if c.parent == path), key=lambda c: c.start)

    def fns_in(self, path: str) -> list[FnCall]:
        return [f for f in self.fns if f.module == path]

    def ops_in(self, path: str, fn: int | None = None, own: bool = True) -> list[Op]:
        """The ops of this module's forward (``own``: not those inside a child module's forward);
        with ``fn``, only those inside that function call."""
        out = []
        for o in self.ops:
            if fn is not None:
                f = self.fns[fn]
                if f.start < o.at < f.end and (o.module == path if own else True):
                    out.append(o)
            elif o.module == path:
                out.append(o)
        return out


class _Mode(TorchFunctionMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types_: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        r = self.rec
        if r.active:
            r.tick += 1
            name = getattr(func, "__name__", "") or ""
            r.recording.ops.append(Op(name, r.modules[-1] if r.modules else None, r.fn_stack[-1] if r.fn_stack else None,
                                      snap(tuple(args)), snap(kwargs), snap(out), r.tick))
        return out


class Recorder:
    def __init__(self, model: Any):
        self.model = model
        self.modules: list[str] = []
        self.fn_stack: list[int] = []
        self.tick = 0
        self.active = False
        self.recording = Recording(model, {}, None)

    def _wrap_module(self, path: str, module: torch.nn.Module) -> None:
        original = module.forward
        rec = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            rec.tick += 1
            start = rec.tick
            parent = rec.modules[-1] if rec.modules else None
            rec.active = False
            a, k = snap(args), snap(kwargs)
            rec.active = True
            rec.modules.append(path)
            try:
                out = original(*args, **kwargs)
            finally:
                rec.modules.pop()
            rec.active = False
            o = snap(out)
            rec.active = True
            rec.tick += 1
            rec.recording.calls.append(ModuleCall(path, type(module).__name__, a, k, o, start, rec.tick, parent))
            return out

        module.forward = forward  # type: ignore[method-assign]

    def _wrap_fn(self, name: str, fn: Any) -> Any:
        rec = self
        try:
            params = tuple(p.name for p in inspect.signature(fn).parameters.values()
                           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        except (TypeError, ValueError):
            params = ()

        def call(*args: Any, **kwargs: Any) -> Any:
            if not rec.active:
                return fn(*args, **kwargs)
            rec.tick += 1
            idx = len(rec.recording.fns)
            entry = FnCall(name, rec.modules[-1] if rec.modules else None, (), {}, None, rec.tick, 0, params)
            rec.recording.fns.append(entry)
            rec.active = False
            entry.args, entry.kwargs = snap(args), snap(kwargs)
            rec.active = True
            rec.fn_stack.append(idx)
            try:
                out = fn(*args, **kwargs)
            finally:
                rec.fn_stack.pop()
            rec.active = False
            entry.output = snap(out)
            rec.active = True
            rec.tick += 1
            entry.end = rec.tick
            return out

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        return call

    def run(self, inputs: dict[str, torch.Tensor]) -> Recording:
        model = self.model
        namespaces = {}
        for _, m in model.named_modules():
            mod = sys.modules.get(type(m).__module__)
            if mod is not None and mod.__name__.startswith("transformers.models."):
                namespaces[mod.__name__] = mod.__dict__
        swapped: list[tuple[dict[str, Any], str, Any]] = []
        wrapped: list[torch.nn.Module] = []
        try:
            for ns in namespaces.values():
                for name, value in list(ns.items()):
                    if isinstance(value, types.FunctionType) or (
                            callable(value) and not isinstance(value, type) and hasattr(value, "__wrapped__")
                            and not isinstance(value, types.ModuleType)):
                        if name.startswith("__"):
                            continue
                        swapped.append((ns, name, value))
                        ns[name] = self._wrap_fn(name, value)
            for path, m in model.named_modules():
                self._wrap_module(path or "", m)
                wrapped.append(m)
            self.recording.inputs = dict(inputs)
            with torch.no_grad(), _Mode(self):
                self.active = True
                try:
                    out = model(**inputs)
                finally:
                    self.active = False
            self.recording.output = snap(dict(out))
        finally:
            for m in wrapped:
                m.__dict__.pop("forward", None)
            for ns, name, value in reversed(swapped):
                ns[name] = value
        self.recording.calls.sort(key=lambda c: c.start)
        return self.recording


def record(model: Any, inputs: dict[str, torch.Tensor]) -> Recording:
    return Recorder(model).run(inputs)
