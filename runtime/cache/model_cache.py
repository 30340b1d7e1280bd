"""``model.cache(inputs, values=..., layers=...)``: one traced forward, its values under their standard paths.

    cache = model.cache("the eiffel tower", values=["layer_output", "self_attn.attention_output"],
                        layers=range(0, 4))
    cache["layers[3].layer_output"]        # [batch seq hidden_size], a view of what the model computed
    cache.layout("layers[3].layer_output")  # Residual [batch seq hidden_size]
    cache.stack("layer_output")             # [layers batch seq hidden_size]

A name in ``values`` is read on every block ``layers[i]`` of ``layers`` that has it (a hybrid stack's
``self_attn.*`` on its attention blocks only); a name no block has is read on the model
(``logits``); a name with an index (``layers[2].mlp.mlp_output``) is that one value. ``values=None``
reads every value this load serves. Every name is checked before the forward: an unknown name
raises UnknownName, one this load cannot serve Unavailable, saying which load serves it.
:meth:`Cache.load` reads back what ``nnatlas cache`` wrote (see ``store``, ``stored``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from ..errors import NnatlasError, UnknownName
from ..spec import Layout
from ..trace import conditions
from ..trace.requests import Box
from ..trace.tracer import Tracer
from ..tree import tables
from ..tree.hosts import Host, HostList
from ..tree.targets import ModelTargets
from ..tree.values import Value
from .stored import StoredCache

_INDEXED = re.compile(r"^(?P<head>.*?)\[(?P<i>\d+)\]$")
_LAYER = re.compile(r"^layers\[(\d+)\]\.(.+)$")


class Cache(Mapping[str, Any]):
    """Values of one forward under their standard paths (``layers[3].layer_output``).

    A value is a tensor (the model's own, no copy), or for a value whose layout is not one (a
    size, a state that may be None) the value itself. ``layout(path)`` gives its layout.

    Which tokens are real, whatever values were asked for (attributes, not entries):
    ``attention_mask`` [batch seq], the mask the forward was given (ones when the inputs had none:
    every token counted as real); ``positions`` [batch seq], each token's position in its own row's
    text (0 at the row's first real token, counted over the tokens the mask keeps), -1 on padding.
    ``positions`` is not the position ids the model used: transformers gives a forward without
    ``position_ids`` 0..seq-1 on every row, whichever side the padding is on.
    """

    def __init__(self, values: Mapping[str, Any], layouts: Mapping[str, Layout], family: str | None = None,
                 attention_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                 inputs: Mapping[str, Any] | None = None):
        self._values = dict(values)
        self._layouts = dict(layouts)
        self.family = family
        self._mask, self._positions = attention_mask, positions
        self._inputs = inputs  # (mask and positions are made from these when first asked: a cache allocates nothing)

    @property
    def attention_mask(self) -> torch.Tensor | None:
        """[batch seq]: the attention mask the forward was given (ones when it had none), 0 on padding."""
        if self._mask is None and self._inputs is not None:
            self._mask, self._positions = _real_tokens(self._inputs)
            self._inputs = None
        return self._mask

    @property
    def positions(self) -> torch.Tensor | None:
        """[batch seq]: each token's position in its own row's text (0 at its first real token), -1 on padding."""
        if self._positions is None and self.attention_mask is not None:
            real = self.attention_mask != 0
            self._positions = (real.long().cumsum(-1) - 1).masked_fill(~real, -1)
        return self._positions

    def __getitem__(self, path: str) -> Any:
        try:
            return self._values[path]
        except KeyError:
            raise KeyError(f"{path!r} is not in this cache; it holds {_summary(list(self._values))}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def layout(self, path: str) -> Layout:
        """The layout of the value at ``path`` (``.text``: ``Residual [batch seq hidden_size]``; ``.dims``)."""
        if path not in self._layouts:
            self[path]  # raises KeyError naming what the cache holds
        return self._layouts[path]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Cache:
        """A cache whose tensors are on ``device`` (floating ones cast to ``dtype`` when given)."""
        def move(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            cast = dtype if dtype is not None and x.is_floating_point() else None
            return x.to(device=device, dtype=cast)
        mask, positions = self.attention_mask, self.positions
        return Cache({k: move(v) for k, v in self._values.items()}, self._layouts, self.family,
                     None if mask is None else mask.to(device), None if positions is None else positions.to(device))

    def layers(self, name: str) -> list[int]:
        """The block indices that hold ``name`` (``layer_output`` → every cached block)."""
        found = []
        for path in self._values:
            m = _LAYER.match(path)
            if m and m.group(2) == name:
                found.append(int(m.group(1)))
        return sorted(found)

    def stack(self, name: str) -> torch.Tensor:
        """``name`` of every cached block, stacked in block order: ``[layers, *layout]``."""
        layers = self.layers(name)
        if not layers:
            names = sorted({m.group(2) for p in self._values if (m := _LAYER.match(p))})
            raise KeyError(f"no block value {name!r} in this cache; block values: {', '.join(names) or 'none'}")
        tensors = [self._values[f"layers[{i}].{name}"] for i in layers]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise NnatlasError(f"{name} is not a tensor on every block; it cannot be stacked")
        return torch.stack(tensors)

    @staticmethod
    def load(folder: str | Any, verify: str = "header") -> StoredCache:
        """What ``nnatlas cache`` wrote to ``folder``: shards memory-mapped, read in batches of rows.

        The folder is checked, never trusted: the manifest field by field, each shard's name (inside
        the folder), size and safetensors header against it (``verify="header"``, the default: a few
        KB read per shard), and with ``verify="content"`` each shard's sha256 (about 500 MB/s on one
        core: some 20 s for a 10 GB cache). Any damage raises one ``nnatlas.CacheError`` naming the
        file and what disagrees."""
        return StoredCache(folder, verify)

    def _title(self) -> str:
        return f"Cache({len(self)} values{f', family {self.family}' if self.family else ''})"

    def _entries(self) -> list[tuple[str, str, str]]:
        """(path, shape and dtype, layout) of each value: what the printout and the notebook view show."""
        return [(path, f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor)
                 else repr(v), self._layouts[path].text) for path, v in self._values.items()]

    def __repr__(self) -> str:
        return "\n".join([self._title(), *(f"  {path}: {shape}  {layout}" for path, shape, layout in self._entries())])

    def _repr_html_(self) -> str:
        return tables.view(self._title(), [tables.table(("value", "shape", "layout"), self._entries())])


def _summary(paths: list[str]) -> str:
    if not paths:
        return "nothing"
    return ", ".join(paths[:6]) + (f" … ({len(paths)} values)" if len(paths) > 6 else "")


# ---- which values: names and layers to handles ---------------------------------------------------

def _walk(host: Any, name: str) -> Value | None:
    """The handle of ``name`` (``self_attn.attention_output``) below ``host``, or None when a host on
    the way does not exist there (a hybrid block without ``self_attn``) or the value is not on it."""
    parts = name.split(".")
    node: Any = host
    for part in parts[:-1]:
        m = _INDEXED.match(part)
        child: Any = node._child(m.group("head") if m else part) if isinstance(node, Host) else None
        if isinstance(child, HostList) and m:
            child = child[int(m.group("i"))] if int(m.group("i")) < len(child) else None
        if not isinstance(child, Host):
            return None
        node = child
    try:
        handle = getattr(node, parts[-1])
    except (UnknownName, NnatlasError):
        return None
    return handle if isinstance(handle, Value) and handle._spec is not None else None


def _layer_indices(model: ModelTargets, layers: Iterable[int] | None) -> list[int]:
    n = len(model.layers)
    if layers is None:
        return list(range(n))
    out = []
    for i in layers:
        if not isinstance(i, int) or not -n <= i < n:
            raise NnatlasError(f"layers: {i!r} is not a block index; {model.family} has layers[0] to layers[{n - 1}]")
        out.append(i % n)
    return list(dict.fromkeys(out))


def select(model: ModelTargets, values: Iterable[str] | None, layers: Iterable[int] | None = None,
           inputs: Mapping[str, Any] | None = None) -> list[Value]:
    """The value handles that ``values`` × ``layers`` name, in spec order, each checked: an unknown
    name raises UnknownName, a value this load cannot serve Unavailable (nothing runs).

    ``values=None``: every value this load serves on the model and on the chosen blocks (those a
    call condition keeps from ``inputs``, such as image values on a text call, left out).
    """
    if isinstance(values, str):
        values = [values]
    blocks = _layer_indices(model, layers)
    if values is None:
        return _every_value(model, blocks, inputs)
    handles: list[Value] = []
    for name in values:
        found = _named(model, name, blocks)
        for handle in found:
            why = handle.unavailable()
            if why is not None:
                raise why
        handles += found
    return list({h.label: h for h in handles}.values())


def _named(model: ModelTargets, name: str, blocks: list[int]) -> list[Value]:
    if not isinstance(name, str) or not name:
        raise NnatlasError(f"values: {name!r} is not a value name")
    if name.startswith("model."):
        name = name[len("model."):]
    if "[" in name.split(".")[0]:  # a full path: layers[2].mlp.mlp_output
        handle = _walk(model, name)
        if handle is None:
            raise UnknownName(f"{name} is no value of {model.family} (check the index and the name against "
                              "model.support())")
        return [handle]
    found = [h for i in blocks if (h := _walk(model.layers[i], name)) is not None]
    if found:
        return found
    root = _walk(model, name)
    if root is not None:
        return [root]
    # nothing has it: let the first block's host say why (nearest names, or which blocks have it)
    where = model.layers[blocks[0]] if blocks else model
    for part in name.split("."):
        where = getattr(where, part)
    raise UnknownName(f"{name} is no value of {model.family}")


def _every_value(model: ModelTargets, blocks: list[int], inputs: Mapping[str, Any] | None) -> list[Value]:
    keep = {f"layers[{i}]" for i in blocks}
    handles = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in model.live_hosts(path):
            m = re.match(r"^layers\[\d+\]", label)
            if m and m.group(0) not in keep:
                continue
            specs = host._specs() if host is not model else model._specs_for("model", None)
            for spec in specs:
                for v in spec.values:
                    if v.reached is not None and not conditions.call_met(v.reached.name, inputs or {}):
                        continue
                    handle = getattr(host, v.name)
                    if handle.unavailable() is None:
                        handles.append(handle)
    return handles


def cache_values(model: ModelTargets, tracer: Tracer, values: Iterable[str] | None = None,
                 layers: Iterable[int] | None = None) -> Cache:
    """The forward ``tracer`` runs (``model.trace(inputs, order="any")``, not entered yet); the values
    ``values`` × ``layers`` name, by standard path."""
    handles = select(model, values, layers, tracer.inputs)
    with tracer:
        saved = [(h.label, h.save()) for h in handles]
    out = {label: (holder.value if isinstance(holder, Box) else holder) for label, holder in saved}
    layouts = {h.label: h._spec.layout for h in handles if h._spec is not None}
    inputs = tracer.inputs
    return Cache(out, layouts, model.family, inputs=inputs if isinstance(inputs, Mapping) else None)


def _real_tokens(inputs: Mapping[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the attention mask the forward got, ones when none; None: positions made from it when asked), the
    mask [batch seq]; (None, None) for inputs with neither ids nor embeddings of that shape."""
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        ids = inputs.get("inputs_embeds")
    if not isinstance(ids, torch.Tensor) or ids.dim() < 2:
        return None, None
    batch, seq = ids.shape[0], ids.shape[1]
    mask = inputs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (batch, seq):
        mask = torch.ones(batch, seq, dtype=torch.long, device=ids.device)
    return mask, None
