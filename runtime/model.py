"""``nnatlas.wrap`` / ``nnatlas.load``: a transformers model under its family's standard names."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from . import registry as _families
from .adapter import Family, HostSpec
from .envoy import Host, HostList, Value
from .errors import NnatlasError, Unavailable
from .inputs import prepare
from .trace import Target, Tracer

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
        return self._processor

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
                out[name] = self._config_value(name)
            except Unavailable:
                continue
        return out

    def _config_value(self, name: str) -> Any:
        fn = self._family.config.get(name)
        if fn is None:
            raise KeyError(f"{self.family} has no config entry '{name}'")
        return fn(self._config_view)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in self._family.config:
            return self._config_value(name)
        return super().__getattr__(name)

    # ---- hosts ----
    def _specs_for(self, pattern: str, index: int | None) -> list[HostSpec]:
        key = (pattern, index)
        cache = self._hosts_cache
        if key not in cache:
            specs = [h for h in self._family.hosts if h.path == pattern]
            cache[key] = [h for h in specs if h.when is None or (index is not None and h.when(self._config_view, index))]
        return cache[key]  # type: ignore[no-any-return]

    def _host(self, module: torch.nn.Module, label: str, pattern: str) -> Host | HostList:
        if isinstance(module, torch.nn.ModuleList):
            return HostList(self, module, label, pattern)
        return Host(self, module, label, pattern)

    def _explain_missing(self, host: Host, name: str) -> None:
        """Raise Unavailable when ``name`` exists on other blocks of this path (a hybrid stack)."""
        kinds = [h for h in self._family.hosts if h.path == host._pattern and h not in host._specs()]
        owners = [h for h in kinds if h.value(name) is not None]
        child_key = f"{host._pattern}.{name}"
        child_owners = [h for h in self._family.hosts if h.path == child_key]
        if owners or child_owners:
            lst = self.layers if host._pattern.startswith("layers") and host._index is not None else None
            where = ""
            if lst is not None:
                idx = [i for i in range(len(lst)) if any(
                    (h.when is None or h.when(self._config_view, i)) for h in (owners or child_owners))]
                where = f" (it exists on blocks {idx})" if idx else ""
            kind = next((h.when_text for h in host._specs() if h.when_text), None)
            raise Unavailable(f"{host._label} has no {name}{where}" + (f": this block is the kind where {kind}" if kind else ""))

    def _active_tracer(self, label: str) -> Tracer:
        tracer = self._tracer
        if tracer is None:
            raise NnatlasError(f"{label} is read inside `with model.trace(...)` (or model.generate(...))")
        return tracer

    def _why_unavailable(self, value: Value) -> Unavailable | None:
        spec = value._spec
        if spec is None or spec.needs is None:
            return None
        if not spec.needs.never and conditions_met(spec.needs.name, self, value._host._module):
            return None
        if spec.needs.never:
            return Unavailable(f"{value.label} {spec.needs.says}. Instead: {spec.needs.fix}")
        if spec.needs.name == "eager":
            impl = getattr(getattr(value._host._module, "config", self.config), "_attn_implementation", None)
            load = f"attn_implementation={impl!r}"
        else:
            load = f"{type(self._module).__name__}, processor={type(self._processor).__name__ if self._processor is not None else None}"
        return Unavailable(f"{value.label} is unavailable under this load ({load}): it "
                           f"{spec.needs.says}. Fix: {spec.needs.fix}")

    def _scope_module(self, host: Host, read: Any, label: str) -> torch.nn.Module:
        """The module whose forward (ops) or methods a scoped read point names."""
        if not read.scope:
            return self._module if read.scope_root else host._module
        start: Host = self if read.scope_root else host
        return start._resolve_module(tuple(read.scope), label)

    def _target(self, value: Value) -> Target:
        why = self._why_unavailable(value)
        if why is not None:
            raise why
        read, host = value._read, value._host
        view = tuple((op, tuple(self._view_arg(a) for a in args)) for op, args in (
            ((v.name, v.args) for v in value._spec.view) if value._spec else ()))
        key: tuple[Any, ...]
        reached = value._spec.reached if value._spec else None
        if read.kind == "module":
            module = host._resolve_module(read.module, value.label)
            side = read.side
            key = ("pre" if side in ("input", "inputs") else "post", id(module))
            return Target(value.label, key, module, side, read.param, read.access, view, value._extra, reached)
        module = host._module
        if read.kind == "call":
            key = ("call_in" if read.side == "args" else "call_out", id(module))
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra, reached)
        if read.kind == "op":
            if read.scope or read.scope_root:
                module = self._scope_module(host, read, value.label)
            key = ("op", id(module), "call" if read.call else None, read.op, read.occurrence, read.side)
            side = "args" if read.side == "input" else "output"
            return Target(value.label, key, module, side, None, read.access, view, value._extra, reached)
        if read.kind == "method":
            module = self._scope_module(host, read, value.label)
            if not callable(getattr(module, read.method, None)):
                raise NnatlasError(f"{value.label}: {type(module).__name__} has no method {read.method}")
            occurrence = read.occurrence
            if read.per_index:
                index = host._index
                if index is None:
                    raise NnatlasError(f"{value.label}: method:{read.method}#i needs a host with a block index")
                occurrence = index
            key = ("method_in" if read.side == "args" else "method_out", id(module), read.method)
            return Target(value.label, key, module, read.side, None, read.access, view, value._extra, reached,
                          call=occurrence)
        raise NnatlasError(f"{value.label} is derived; it has no site of its own")

    def _view_arg(self, a: Any) -> Any:
        if isinstance(a, tuple):
            return tuple(self._view_arg(x) for x in a)
        return self._config_value(a) if isinstance(a, str) else a

    # ---- tracing ----
    def trace(self, inputs: Any = None, *, order: str = "strict", grad: bool = False, **kwargs: Any) -> Tracer:
        """Record reads and edits in the ``with`` body; the forward runs when the block ends.

        ``inputs``: a prompt, a list of prompts (left-padded), token ids, or a dict of model
        inputs; extra keyword arguments go to the forward. ``order="any"`` serves requests in
        whatever order the forward reaches them; ``grad=True`` keeps autograd on.
        """
        model_inputs = prepare(self, inputs, kwargs)
        module = self._module
        return Tracer(self, lambda: module(**model_inputs), order=order, grad=grad, inputs=model_inputs)

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

    # ---- introspection ----
    def support(self) -> Any:
        from .printout import support

        return support(self)

    def __repr__(self) -> str:
        from .printout import render

        return render(self)

    def __str__(self) -> str:
        return self.__repr__()


def conditions_met(name: str, model: AtlasModel, module: torch.nn.Module) -> bool:
    """Load conditions (the vocabulary's ``conditions`` of kind load), decided by how the model was loaded."""
    if name == "eager":
        cfg = getattr(module, "config", None) or model.config
        return getattr(cfg, "_attn_implementation", None) == "eager"
    if name == "processor":
        return model._processor is not None and getattr(model._processor, "image_processor", None) is not None
    raise NnatlasError(f"unknown load condition '{name}'")


def call_condition_met(name: str, inputs: Mapping[str, Any]) -> bool:
    """Call conditions (kind call), decided by the inputs of one call before its forward runs."""
    if name == "images":
        return inputs.get("pixel_values") is not None
    raise NnatlasError(f"unknown call condition '{name}'")


def wrap(model: torch.nn.Module, tokenizer: Any = None, processor: Any = None, family: str | None = None) -> AtlasModel:
    """Wrap an already-built transformers model with its family's adapter."""
    if isinstance(model, AtlasModel):
        return model
    fam = _families.get(family) if family else _families.pick(model)
    if tokenizer is None and processor is not None:
        tokenizer = getattr(processor, "tokenizer", None)
    return AtlasModel(model, fam, tokenizer=tokenizer, processor=processor)


def load(name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True, **kwargs: Any) -> AtlasModel:
    """``from_pretrained`` with the family picked from the config, then :func:`wrap`.

    ``task="text-generation"`` loads the causal-LM class (``AutoModelForCausalLM``); a multimodal
    checkpoint that transformers has no causal-LM class for (Qwen3-VL) loads its wrapper
    (``...ForConditionalGeneration``) without a processor, so its vision values are Unavailable.
    ``task="image-text-to-text"`` loads the wrapper (``AutoModelForImageTextToText``) with its
    processor (built without torchvision when torchvision is missing: images only, no videos).
    Keyword arguments (``dtype``, ``attn_implementation``, ``device_map`` …) go to ``from_pretrained``.
    """
    import transformers

    if task not in ("text-generation", "image-text-to-text"):
        raise NnatlasError(f"task {task!r} is not supported; use 'text-generation' or 'image-text-to-text'")
    if task == "image-text-to-text":
        hf = transformers.AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
        hf.eval()
        from .processing import load_processor

        return wrap(hf, processor=load_processor(name_or_path))
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
    return wrap(hf, tokenizer=tok)
