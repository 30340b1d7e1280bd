"""The wrapped model as the root of the standard-name tree: its config entries (normalized over the text
and root configs), the host specs that apply at each path and block, its live hosts, the block kinds of a
hybrid stack, and which recurrent kernels a trace routes. :class:`nnatlas.AtlasModel` builds on it."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import NnatlasError, Unavailable
from ..inputs.processing import PromptProcessor
from ..parallel import tensor_parallel
from ..spec import Family, HostSpec, ValueSpec
from ..trace.sites import kernel_route
from ..trace.tracer import Tracer
from .hosts import Host, HostList, step

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


class ModelTree(Host):
    """A transformers model at the root of its family's standard-name tree (see the module's docstring)."""

    _family: Family
    _tokenizer: Any
    _processor: Any
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
        object.__setattr__(self, "_value_specs", {})
        # transformers' tensor parallel (tp_plan=): None on a model that is not sharded (one attribute read)
        object.__setattr__(self, "_tp", tensor_parallel.sharding_of(hf_model))
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
        if name in self._kids:  # a child found before (``model.layers``): no config entry has its name
            child = self._child(name)
            if child is not None:
                return child
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
                host = step(host, part)  # a child, or an item of a list child (self_attn[1])
                if host is None:
                    break
            if isinstance(host, Host):
                out.append((path.replace("[i]", f"[{i}]", 1), host))
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
                host = step(host, part)  # a child, or an item of a list child (self_attn[1])
                if host is None:
                    break
            if isinstance(host, Host):
                yield path.replace("[i]", f"[{i}]", 1), host

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
