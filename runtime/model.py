"""``nnatlas.wrap`` / ``nnatlas.load``: a transformers model under its family's standard names."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

from . import conditions, patterns, sites
from . import registry as _families
from .cache import cache as cache_values
from .describe import render, support
from .errors import InputError, NnatlasError, Unavailable
from .hosts import Host, HostList, Value, resolve_native
from .inputs import prepare
from .processing import PromptProcessor, load_processor
from .requests import CallDim, SiteKey, Target
from .sites import _KERNEL_ROUTES, kernel_route
from .spec import CALL_DIMS, Condition, Family, HostSpec, ValueSpec
from .trace import Tracer

_LOCKS: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


class ConfigView:
    """The text config first, then the root config: where a family's config entries are looked up."""

    def __init__(self, config: Any):
        self._root = config
        get_text = getattr(config, "get_text_config", None)
        self._text = get_text() if get_text else config

    def __getattr__(self, name: str) -> Any:
        for cfg in (self._text, self._root):
            if hasattr(cfg, name):
                return getattr(cfg, name)
        return None


class AtlasModel(Host):
    """A transformers model wrapped with its family adapter.

    ``model.layers[i].mlp.mlp_output`` and every other standard name resolve to the native
    modules; ``model.trace(...)`` reads and edits them; ``model.support()`` says what this
    load serves; ``print(model)`` shows the native tree with standard names and values.
    """

    _family: Family
    _tokenizer: Any
    _tracer: Tracer | None
    _lock: threading.RLock

    def __init__(self, hf_model: torch.nn.Module, family: Family, tokenizer: Any = None, processor: Any = None):
        super().__init__(None, hf_model, "", "model")
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_tokenizer", tokenizer)
        object.__setattr__(self, "_processor", processor)
        object.__setattr__(self, "_tracer", None)
        object.__setattr__(self, "_config_view", ConfigView(getattr(hf_model, "config", None)))
        object.__setattr__(self, "_hosts_cache", {})
        object.__setattr__(self, "_targets_cache", {})
        object.__setattr__(self, "_value_specs", {})
        with _LOCKS_GUARD:
            lock = _LOCKS.setdefault(hf_model, threading.RLock())
        object.__setattr__(self, "_lock", lock)

    # ---- identity and config ----
    @property
    def family(self) -> str:
        return self._family.name

    @property
    def config(self) -> Any:
        return self._module.config

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def processor(self) -> Any:
        """The processor (images and text), or None on a text-only load. Called with images and a
        prompt without image tokens, it puts one placeholder per image in front, as trace does."""
        if self._processor is None:
            return None
        return PromptProcessor(self._processor)

    @property
    def native(self) -> torch.nn.Module:
        """The wrapped transformers model."""
        return self._module

    @property
    def normalized_config(self) -> dict[str, Any]:
        """Every config entry this load answers (an entry that raises Unavailable is left out)."""
        out = {}
        for name in self._family.config:
            try:
                out[name] = self.config_value(name)
            except Unavailable:
                continue
        return out

    def config_value(self, name: str) -> Any:
        """The normalized config entry ``name`` (``num_layers``, ``head_dim`` …) for this load; raises
        Unavailable when this load has no such size (a state-space model's head_dim) and KeyError when
        the family names no such entry."""
        fn = self._family.config.get(name)
        if fn is None:
            raise KeyError(f"{self.family} has no config entry '{name}'")
        return fn(self._config_view)

    _config_value = config_value

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in self._family.config:
            return self.config_value(name)
        if not name.startswith("_") and name.endswith("_layers"):
            found = self._kind_layers(name.removesuffix("_layers"))
            if found is not None:
                return found
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    # ---- kernels ----
    @property
    def kernels(self) -> str | None:
        """``"torch"`` routes this model's recurrent kernels token by token in every trace (see
        :func:`route_kernels`); None (the default) runs whatever transformers picked."""
        return self.__dict__.get("_kernels")

    @kernels.setter
    def kernels(self, value: str | None) -> None:
        if value not in (None, "torch"):
            raise NnatlasError("model.kernels is 'torch' (route recurrent kernels token by token) or None")
        if value == "torch" and not any(g.route for g in self._family.functions.values()):
            raise NnatlasError(f"{self.family} has no kernel to route")
        self.__dict__["_kernels"] = value

    def _kernel_route(self) -> str | None:
        return kernel_route(self._family.name) or self.__dict__.get("_kernels")

    def _routed_modules(self) -> list[tuple[torch.nn.Module, str]]:
        """Every live module whose host reads a routable function group, with that group."""
        out: list[tuple[torch.nn.Module, str]] = []
        groups = {n for n, g in self._family.functions.items() if g.route}
        for path in dict.fromkeys(h.path for h in self._family.hosts):
            for _, host in self._live_hosts(path):
                used = {v.read.fn for s in host._specs() for v in s.values if v.read.kind == "fn" and v.read.fn in groups}
                out += [(host._module, g) for g in sorted(g for g in used if g is not None)]
        return out

    def _live_hosts(self, path: str) -> list[tuple[str, Host]]:
        """Every live host at a spec path (``layers[i].linear_attn`` → one per block that has it)."""
        if path == "model":
            return [("model", self)]
        head, _, rest = path.partition("[i]")
        node: Any = self
        for part in head.split("."):
            node = node._child(part) if isinstance(node, Host) else None
            if node is None:
                return []
        if "[i]" not in path:
            return [(path, node)] if isinstance(node, Host) else []
        out = []
        for i in range(len(node)):
            host: Any = node[i]
            for part in [p for p in rest.split(".") if p]:
                host = host._child(part)
                if host is None:
                    break
            if host is not None:
                out.append((path.replace("[i]", f"[{i}]"), host))
        return out

    def _kind_layers(self, kind: str) -> list[int] | None:
        """The blocks of a hybrid stack's kind, from the ``when`` of the spec's host kinds."""
        specs = [h for h in self._family.hosts if h.kind == kind and h.when is not None]
        if not specs:
            return None
        path = specs[0].path
        head = path.partition("[i]")[0]
        node: Any = self
        for part in head.split("."):
            node = getattr(node, part)
        return [i for i in range(len(node)) if any(h.when is not None and h.when(self._config_view, i) for h in specs)]

    @property
    def layer_kinds(self) -> list[str | None]:
        """The block kind of every block (the spec's kinds; None for a family without kinds)."""
        kinds: list[str | None] = [None] * len(self.layers)
        for h in self._family.hosts:
            if h.path == "layers[i]" and h.kind and h.when is not None:
                for i in range(len(kinds)):
                    if h.when(self._config_view, i):
                        kinds[i] = h.kind
        return kinds

    # ---- hosts ----
    def specs_at(self, pattern: str, index: int | None) -> list[HostSpec]:
        """The host specs that apply at a spec path (``layers[i].self_attn``) on block ``index`` (None
        for a path without a block index): on a hybrid stack, the specs whose ``when`` holds there."""
        key = (pattern, index)
        cache = self._hosts_cache
        if key not in cache:
            specs = [h for h in self._family.hosts if h.path == pattern]
            cache[key] = [h for h in specs if h.when is None or (index is not None and h.when(self._config_view, index))]
        return cache[key]  # type: ignore[no-any-return]

    _specs_for = specs_at

    def live_hosts(self, path: str) -> Iterator[tuple[str, Host]]:
        """Every live host at a spec path (``layers[i].self_attn`` → one per block that has it),
        with its label (``layers[3].self_attn``); nothing for a host this load does not build."""
        if path == "model":
            yield "model", self
            return
        head, _, rest = path.partition("[i]")
        node: Any = self
        try:
            for part in head.split("."):
                node = getattr(node, part)
        except AttributeError:  # not built by this load (the vision encoder of a text-only load)
            return
        if "[i]" not in path:
            yield path, node
            return
        for i in range(len(node)):
            host = node[i]
            for part in [p for p in rest.split(".") if p]:
                host = host._child(part)
                if host is None:
                    break
            if host is not None:
                yield path.replace("[i]", f"[{i}]"), host

    def _value_spec(self, pattern: str, index: int | None, name: str) -> ValueSpec | None:
        """The spec of value ``name`` on the host at ``pattern`` (block ``index``): the first that has it."""
        key = (pattern, index)
        names = self._value_specs.get(key)
        if names is None:
            names = {}
            for spec in self.specs_at(pattern, index):
                for v in spec.values:
                    names.setdefault(v.name, v)
            self._value_specs[key] = names
        return names.get(name)  # type: ignore[no-any-return]

    def _host(self, module: torch.nn.Module, label: str, pattern: str) -> Host | HostList:
        if isinstance(module, torch.nn.ModuleList):
            return HostList(self, module, label, pattern)
        return Host(self, module, label, pattern)

    def _explain_missing(self, host: Host, name: str) -> None:
        """Raise Unavailable when ``name`` exists on other blocks of this path (a hybrid stack)."""
        kinds = [h for h in self._family.hosts if h.path == host._pattern and h not in host._specs()]
        owners = [h for h in kinds if h.value(name) is not None]
        child_key = f"{host._pattern}.{name}"
        has_child = any(h.path == child_key or h.path.startswith(child_key + ".") for h in self._family.hosts)
        if not owners and not has_child:
            return
        idx: list[str] = []
        if has_child:
            idx = [label.rsplit(".", 1)[0] for label, _ in self._live_hosts(child_key)]
        else:
            head = host._pattern.partition("[i]")[0]
            idx = [f"{head}[{i}]" for i in range(len(getattr(self, head)))
                   if any(h.when is not None and h.when(self._config_view, i) for h in owners)]
        mine = next((h for h in host._specs() if h.when_text), None)
        kind = f": {host._label} is a {mine.kind or 'different'} block ({mine.when_text})" if mine else ""
        where = f"; {name} exists on {', '.join(idx)}" if idx else ""
        raise Unavailable(f"{host._label} has no {name}{kind}{where}")

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
                module = self._scope_module(value._host, value._read, value.label)
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
            met = tracer.conditions.get(key)
            if met is None:
                met = tracer.conditions[key] = conditions_met(spec.needs.name, self, module, spec.needs)
        if met:
            return None
        under = conditions.under(spec.needs, cfg, getattr(value._host._module, "config", self.config),
                                 type(self._module).__name__, self._processor)
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
        # resolved once per (module, value): a cached target is used while its module is still the
        # one the host's path leads to (a replaced submodule resolves afresh); a handle keeps its own
        cached = value.__dict__.get("_cached_target")
        if cached is not None:
            target, path = cached
            if path is None or resolve_native(value._host._module, path) is target.module:
                return target  # type: ignore[no-any-return]
        key = (id(value._host._module), id(value._read), value._extra, value.label)
        cached = self._targets_cache.get(key)
        if cached is not None:
            target, path = cached
            if path is None or resolve_native(value._host._module, path) is target.module:
                value.__dict__["_cached_target"] = cached
                return target
        target = self._resolve_target(value)
        if spec is not None and spec.layout.dtype != "object":
            target.layout = spec.layout.text  # (a tensor layout: the messages of bad edits name it)
        path = None
        if target.module is not value._host._module:
            path = next((n for n, m in value._host._module.named_modules() if m is target.module), None)
        if target.module is value._host._module or path is not None:
            self._targets_cache[key] = (target, path)
        return target

    def _resolve_target(self, value: Value) -> Target:
        read, host = value._read, value._host
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
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra, **extra)
        if read.kind == "op":
            key = SiteKey("op", id(module), read.call, read.op, read.occurrence, read.side)
            side = "args" if read.side == "input" else "output"
            return Target(value.label, key, module, side, None, read.access, view, value._extra, **extra)
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

    # ---- tracing ----
    def trace(self, inputs: Any = None, *, order: str = "strict", grad: bool = False, **kwargs: Any) -> Tracer:
        """Record reads and edits in the ``with`` body; the forward runs when the block ends.

        ``inputs``: a prompt, a list of prompts (left-padded), token ids, or a dict of model
        inputs; extra keyword arguments go to the forward. ``order="any"`` serves requests in
        whatever order the forward reaches them. ``grad=True`` keeps autograd through the
        forward (unless grad mode is off around the trace): every saved tensor is then an autograd
        view of the forward's tensor, a backward from any of them (or from anything computed from
        them) reaches the model, and fills ``.grad`` of every saved value it reaches, the gradient
        with respect to the value where the forward computed it. Edits stay differentiable.
        """
        if not isinstance(grad, bool):
            raise InputError(f"trace(grad=...): expected True or False, got {grad!r}")
        model_inputs = prepare(self, inputs, kwargs)
        module = self._module
        ids = model_inputs.get("input_ids", model_inputs.get("inputs_embeds"))
        calls = int(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.dim() >= 2 else None
        return Tracer(self, lambda: module(**model_inputs), order=order, grad=grad, calls=calls, inputs=model_inputs)

    def generate(self, inputs: Any = None, *, max_new_tokens: int = 8, order: str = "strict", **kwargs: Any) -> Tracer:
        """Like ``trace`` over ``generate``: the body reads step 0 unless inside ``tracer.iter[...]``."""
        model_inputs = prepare(self, inputs, {})
        gen = getattr(self._module, "generate", None)
        if gen is None:
            raise NnatlasError(f"{type(self._module).__name__} cannot generate")
        settings = {"max_new_tokens": max_new_tokens, "do_sample": False, "min_new_tokens": max_new_tokens, **kwargs}
        pad = getattr(self._tokenizer, "pad_token_id", None) if self._tokenizer is not None else None
        if pad is not None:
            settings.setdefault("pad_token_id", pad)
        return Tracer(self, lambda: gen(**model_inputs, **settings), order=order, steps=max_new_tokens,
                      inputs=model_inputs)

    def cache(self, inputs: Any = None, values: Any = None, layers: Any = None, **kwargs: Any) -> Any:
        """One traced forward; the values ``values`` x ``layers`` name, as an :class:`nnatlas.Cache`
        keyed by standard path (``layers[3].layer_output``). See :mod:`nnatlas.cache`."""
        return cache_values(self, inputs, values, layers, **kwargs)

    # ---- introspection ----
    def support(self) -> Any:
        return support(self)

    def __repr__(self) -> str:
        return render(self)

    def __str__(self) -> str:
        return self.__repr__()


def _names_call_dims(view: Any) -> bool:
    if isinstance(view, CallDim):
        return True
    if isinstance(view, tuple):
        return any(_names_call_dims(x) for x in view)
    return False


def recomputed(read: Any, module: torch.nn.Module, config: Any) -> bool:
    """Whether a read inside eager attention (``call:attention > op:...``), or at eager's softmax in the
    forward with ``recompute: sdpa``, is served by recomputing the pattern under this load (sdpa, flex
    attention: ``patterns``)."""
    if read.kind != "op" or (read.call != "attention" and read.recompute is None):
        return False
    impl = sites.attention_implementation(getattr(module, "config", None) or config)
    return impl in patterns.RECOMPUTED if read.call == "attention" else impl == read.recompute


def conditions_met(name: str, model: AtlasModel, module: torch.nn.Module, condition: Condition | None = None) -> bool:
    """Whether this load serves a value with load condition ``name`` read in ``module`` (decided by
    :mod:`nnatlas.conditions`)."""
    cfg = getattr(module, "config", None) or model.config
    return conditions.load_met(condition or Condition(name, "", ""), cfg, model._processor, model._kernel_route())



@contextlib.contextmanager
def route_kernels(family: str | AtlasModel, kernels: str = "torch") -> Iterator[None]:
    """Route a family's recurrent kernels (Qwen3.5's gated delta rule …) through their pure-torch
    step, one token at a time, in every trace opened inside the block (this thread or task only).

        with nnatlas.route_kernels(model.family, "torch"):
            with model.trace(prompt):
                states = model.layers[0].linear_attn.states.save()

    Nothing global is touched: the routing lives in a ContextVar reset when the block ends.
    """
    name = family.family if isinstance(family, AtlasModel) else family
    if kernels != "torch":
        raise NnatlasError(f"route_kernels routes to 'torch' only, not {kernels!r}")
    fam = _families.get(name)
    if not any(g.route for g in fam.functions.values()):
        raise NnatlasError(f"{name} has no kernel to route: route_kernels is for families with a recurrent kernel")
    current = dict(_KERNEL_ROUTES.get() or {})
    current[name] = kernels
    token = _KERNEL_ROUTES.set(current)
    try:
        yield
    finally:
        _KERNEL_ROUTES.reset(token)


def wrap(model: torch.nn.Module, tokenizer: Any = None, processor: Any = None,
         family: str | Family | None = None) -> AtlasModel:
    """Wrap an already-built transformers model with its family's adapter: an instance of the family's
    generated class (``nnatlas.families.<family>.Model``; ``<family>.wrap`` says so to a type checker)."""
    if isinstance(model, AtlasModel):
        return model
    fam = family if isinstance(family, Family) else _families.get(family) if family else _families.pick(model)
    return _new(_families.model_class(fam) or AtlasModel, fam, model, tokenizer, processor)


M = TypeVar("M", bound=AtlasModel)


def _new(cls: type[M], family: Family, model: torch.nn.Module, tokenizer: Any, processor: Any) -> M:
    if tokenizer is None and processor is not None:
        tokenizer = getattr(processor, "tokenizer", None)
    return cls(model, family, tokenizer=tokenizer, processor=processor)


class Wrapper(Generic[M]):
    """``nnatlas.families.<family>.wrap``: :func:`wrap` as that family, typed with its generated class."""

    def __init__(self, cls: type[M], family: Family):
        self.cls, self.family = cls, family

    def __call__(self, model: torch.nn.Module, tokenizer: Any = None, processor: Any = None) -> M:
        if isinstance(model, self.cls):
            return model
        if isinstance(model, AtlasModel):
            raise NnatlasError(f"this model is already wrapped as {model.family}; wrap its .native as "
                               f"{self.family.name}")
        return _new(self.cls, self.family, model, tokenizer, processor)


class Loader(Generic[M]):
    """``nnatlas.families.<family>.load``: :func:`load` as that family, typed with its generated class."""

    def __init__(self, cls: type[M], family: Family):
        self.cls, self.family = cls, family

    def __call__(self, name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True,
                 **kwargs: Any) -> M:
        hf, tok, processor = _from_pretrained(name_or_path, task, tokenizer, kwargs)
        return _new(self.cls, self.family, hf, tok, processor)


def _check_path(name: Any) -> None:
    """A name that can only be a local path (absolute, ./ ../ ~, a trailing slash, or more than one
    slash: a hub id is ``name`` or ``namespace/name``) must exist, else say so (transformers would
    say the repo id is malformed, or try the hub)."""
    import os

    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"nnatlas.load: expected a local directory or a hub id ('namespace/name'), got {name!r}")
    path_like = (os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\")) or name.endswith(("/", os.sep))
                 or name.count("/") > 1 or name in (".", ".."))
    if path_like and not os.path.exists(os.path.expanduser(name)):
        raise InputError(f"nnatlas.load: the path {name} does not exist (expected a local model directory, or a "
                         "hub id such as 'namespace/name')")


def load(name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True, **kwargs: Any) -> AtlasModel:
    """``from_pretrained`` with the family picked from the config, then :func:`wrap`.

    ``task="text-generation"`` loads the causal-LM class (``AutoModelForCausalLM``); a multimodal
    checkpoint that transformers has no causal-LM class for (Qwen3-VL) loads its wrapper
    (``...ForConditionalGeneration``) without a processor, so its vision values are Unavailable.
    ``task="image-text-to-text"`` loads the wrapper (``AutoModelForImageTextToText``) with its
    processor (built without torchvision when torchvision is missing: images only, no videos).
    Keyword arguments (``dtype``, ``attn_implementation``, ``device_map`` …) go to ``from_pretrained``.
    ``nnatlas.families.<family>.load`` does the same as one family, typed with its generated class.
    """
    hf, tok, processor = _from_pretrained(name_or_path, task, tokenizer, kwargs)
    return wrap(hf, tokenizer=tok, processor=processor)


def _from_pretrained(name_or_path: str, task: str, tokenizer: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(the transformers model, its tokenizer, its processor) as :func:`load` builds them."""
    import transformers

    if task not in ("text-generation", "image-text-to-text"):
        raise NnatlasError(f"task {task!r} is not supported; use 'text-generation' or 'image-text-to-text'")
    _check_path(name_or_path)
    if task == "image-text-to-text":
        hf = transformers.AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
        hf.eval()
        processor = load_processor(name_or_path)
        return hf, getattr(processor, "tokenizer", None), processor
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except ValueError as e:  # no causal-LM class for this config: a multimodal wrapper, text only
        config = transformers.AutoConfig.from_pretrained(name_or_path)
        if getattr(config, "vision_config", None) is None:
            raise
        try:
            hf = transformers.AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
        except ValueError:
            raise e from None
    hf.eval()
    tok = None
    if tokenizer is True:
        try:
            tok = transformers.AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError, TypeError):
            tok = None
    elif tokenizer not in (None, False):
        tok = tokenizer
    return hf, tok, None
