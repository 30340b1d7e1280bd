"""The standard-name tree a researcher navigates: hosts and host lists.

``model.layers[3].self_attn`` is a :class:`Host` (a native module under its standard name), ``model.layers`` a
:class:`HostList`; ``model.layers[3].self_attn.attention_queries`` is a value handle
(:class:`nnatlas.tree.values.Value`), made by its host on first lookup.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar

import torch

from ..errors import NnatlasError, UnknownName
from ..spec import HostSpec, ReadPoint, ValueSpec
from . import foreign_names
from .values import Value, ValueRoot


class ModelRoot(ValueRoot, Protocol):
    """What a host uses of the model at the root of its tree (:class:`nnatlas.AtlasModel`, a layer above), beside
    what its value handles use: the specs that apply at a path, a value's spec there, child hosts, and why a name
    is missing."""

    def _specs_for(self, pattern: str, index: int | None) -> list[HostSpec]: ...

    def _value_spec(self, pattern: str, index: int | None, name: str) -> ValueSpec | None: ...

    def _host(self, module: torch.nn.Module, label: str, pattern: str) -> Host | HostList: ...

    def _explain_missing(self, host: Host, name: str) -> None: ...


BOUNDARIES = {
    "input": ReadPoint("module", "input", "the module's own input", side="input"),
    "inputs": ReadPoint("module", "inputs", "the module's own inputs (args, kwargs)", side="inputs"),
    "output": ReadPoint("module", "output", "the module's own output", side="output"),
}


def step(node: Host | HostList | None, part: str) -> Host | HostList | None:
    """The child a part of a spec path names: ``mlp``, or ``self_attn[1]``, the item of a list child; None
    where there is none (no such child, or an index past the list's end)."""
    if node is None:
        return None
    name, bracket, index = part.partition("[")
    found = node._child(name)
    if not bracket:
        return found
    index = index.rstrip("]")
    if not isinstance(found, HostList) or not index.isdigit() or int(index) >= len(found):
        return None
    return found[int(index)]


def resolve_native(root: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    node: Any = root
    for part in dotted.split("."):
        node = node._modules.get(part) if isinstance(node, torch.nn.Module) else None
        if node is None:
            return None
    return node  # type: ignore[no-any-return]


class Host:
    """A native module under its standard name, with the values its family serves there."""

    _model: ModelRoot
    _module: torch.nn.Module
    _label: str
    _pattern: str
    _index: int | None

    def __init__(self, model: ModelRoot | None, module: torch.nn.Module, label: str, pattern: str,
                 index: int | None = None):
        d = self.__dict__  # (__setattr__ is for assigning values)
        d["_model"] = model if model is not None else self
        d["_module"], d["_label"], d["_pattern"], d["_index"] = module, label, pattern, index
        d["_parent"] = None  # the host this one was reached from (``^.`` reads climb to it)
        d["_kids"] = {}  # name -> (native path, child host): children found once, checked on each use

    # -- what applies here --
    def _block_index(self) -> int | None:
        """The block this host is in: its own index, else its parent's (``layers[3].mlp`` is in
        block 3, so a nested host's ``when`` is decided per block)."""
        if self._index is not None:
            return self._index
        parent = self.__dict__.get("_parent")
        return parent._block_index() if parent is not None else None

    def _specs(self) -> list[HostSpec]:
        return self._model._specs_for(self._pattern, self._block_index())

    def _value_names(self) -> list[str]:
        return [v.name for s in self._specs() for v in s.values]

    def _child(self, name: str) -> Host | HostList | None:
        """The child host ``name`` (a standard name the family renames, or a native child), made
        once and reused while the native path still leads to the same module (a replaced native
        submodule gets a new host)."""
        hit = self._kids.get(name)
        if hit is not None:
            parts, child = hit
            node: Any = self._module
            for part in parts:
                node = node._modules.get(part)
                if node is None:
                    break
            if node is child._module:
                return child  # type: ignore[no-any-return]
        model = self._model
        key = name if self._pattern == "model" else f"{self._pattern}.{name}"
        natives = model._family.rename.get(key)
        for native in natives or (name,):
            found = resolve_native(self._module, native)
            if found is not None:
                made = model._host(found, self._join(name), key)
                made._parent = self
                self._kids[name] = (tuple(native.split(".")), made)
                return made
        return None

    def _join(self, name: str) -> str:
        return name if self._pattern == "model" else f"{self._label}.{name}"

    def _up(self, levels: int, what: str) -> Host:
        """The host ``levels`` above this one (``^.`` in a read point: 1 is the parent)."""
        node: Host = self
        for _ in range(levels):
            parent = node.__dict__["_parent"]
            if parent is None:
                raise NnatlasError(f"{what}: {node._label or 'model'} has no parent host to read '^.' from")
            node = parent
        return node

    def _resolve_module(self, path: tuple[str, ...], what: str) -> torch.nn.Module:
        node: Host | HostList = self
        for part in path:
            if isinstance(node, HostList):  # a list child indexed in the read (input_layernorm.0.output)
                if not part.isdigit() or int(part) >= len(node):
                    raise UnknownName(f"{what}: {node._label} is a list of {len(node)} modules: index it with a "
                                      f"number from 0 to {len(node) - 1} ({'.'.join(path)})")
                node = node[int(part)]
                continue
            nxt = node._child(part)
            if nxt is None:
                parent = self.__dict__["_parent"] if node is self else None
                if parent is not None and parent._child(part) is not None:
                    raise UnknownName(f"{what}: '{part}' is not inside {self._label} ({type(self._module).__name__}): "
                                      f"the read leaves its host; '{part}' is a sibling (a child of "
                                      f"{parent._label or 'model'}): read it as ^.{'.'.join(path)}...")
                raise UnknownName(f"{what}: {self._label or 'model'} has no child module '{part}'")
            node = nxt
        if not isinstance(node, Host):
            raise NnatlasError(f"{what}: {'.'.join(path)} is a list of modules; index it")
        return node._module

    def _standard_names(self) -> list[str]:
        prefix = "" if self._pattern == "model" else f"{self._pattern}."
        kids = [k[len(prefix):] for k in self._model._family.rename if k.startswith(prefix) and "." not in k[len(prefix):]]
        return [*self._value_names(), *kids, *self._module._modules, "input", "inputs", "output"]

    # -- attribute protocol --
    def _config_name(self, name: str) -> str | None:
        """``model.vision.num_heads`` is the family's config entry ``vision_num_heads`` (and
        ``model.vision.vision_hidden_size`` is ``vision_hidden_size``): entries named after a host."""
        if self._index is not None or self._pattern == "model" or "[" in self._pattern:
            return None
        prefix = self._pattern.replace(".", "_") + "_"
        config = self._model._family.config
        for key in (prefix + name, name if name.startswith(prefix) else None):
            if key is not None and key in config:
                return key
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._kids:  # a child found before (names are static: nothing else can claim it since)
            child = self._child(name)
            if child is not None:
                return child
        key = self._config_name(name)
        if key is not None:
            return self._model._config_value(key)
        v = self._model._value_spec(self._pattern, self._block_index(), name)
        if v is not None or name in BOUNDARIES:
            # a handle is made once per host and kept in its __dict__: the next lookup is Python's own
            handle = Value(self, name, v, v.read) if v is not None else Value(self, name, None, BOUNDARIES[name])
            self.__dict__[name] = handle
            return handle
        child = self._child(name)
        if child is not None:
            return child
        if self._model is not self and name in self._model._family.config:
            return self._model._config_value(name)  # every host shows the normalized config: moe.top_k
        self._model._explain_missing(self, name)
        foreign = foreign_names.hint(self, name)  # a TransformerLens or SAE name: say what it stands for
        close = difflib.get_close_matches(name, self._standard_names(), n=4, cutoff=0.5)
        hint = f"; {foreign}" if foreign else f"; nearest: {', '.join(close)}" if close else ""
        raise UnknownName(f"{self._label or 'model'} ({type(self._module).__name__}) has no value or module '{name}'{hint}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        handle = getattr(self, name)
        if not isinstance(handle, Value):
            raise AttributeError(f"{name} is a module, not a value; assign to one of its values")
        handle._assign(value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._standard_names()))

    def __repr__(self) -> str:
        return f"<{self._label or 'model'}: {type(self._module).__name__}>"


H = TypeVar("H", bound=Host)


class HostList(Generic[H]):
    """A ModuleList under its standard name: ``model.layers[i]``."""

    def __init__(self, model: ModelRoot, module: torch.nn.ModuleList, label: str, pattern: str):
        self._model, self._module, self._label, self._pattern = model, module, label, pattern
        self._parent: Host | None = None  # the host holding the list: each block's parent
        self._hosts: dict[int, H] = {}  # index -> host, reused while the list holds the same module

    def __len__(self) -> int:
        return len(self._module)

    def __getitem__(self, i: int) -> H:
        host = self._hosts.get(i) if type(i) is int else None
        if host is not None and self._module._modules.get(str(i)) is host._module:  # (found before: the same block)
            return host
        if not isinstance(i, int):
            raise TypeError(f"{self._label}[...] takes one integer index")
        n = len(self._module)
        if not -n <= i < n:
            raise IndexError(f"{self._label}[{i}]: there are {n} ({self._label}[0] to {self._label}[{n - 1}])")
        i %= n
        # a ModuleList keys its modules "0", "1", ... (ModuleList.__getitem__ without its index arithmetic)
        module = self._module._modules[str(i)]
        host = self._hosts.get(i)
        if host is None or host._module is not module:
            # a list inside a block (LongCat-Flash's self_attn: layers[3].self_attn[1]) holds fixed items, each its
            # own spec path (layers[i].self_attn[1]) in the block of its parent; a stack's items are its blocks
            inside = self._parent is not None and self._parent._block_index() is not None
            pattern, index = (f"{self._pattern}[{i}]", None) if inside else (f"{self._pattern}[i]", i)
            host = self._hosts[i] = Host(self._model, module, f"{self._label}[{i}]",  # type: ignore[assignment]
                                         pattern, index)
            host.__dict__["_parent"] = self._parent
        return host  # type: ignore[return-value]

    def __iter__(self) -> Iterator[H]:
        hosts = self._hosts
        for i, module in enumerate(self._module._modules.values()):  # (the order of ModuleList's keys "0", "1", ...)
            host = hosts.get(i)
            yield host if host is not None and host._module is module else self[i]

    def _child(self, name: str) -> None:
        return None

    def __repr__(self) -> str:
        return f"<{self._label}: {len(self)} x {type(self._module[0]).__name__ if len(self) else 'empty'}>"
