"""``print(model)`` and ``model.support()``: the native tree under standard names, with values."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..parallel import tensor_parallel
from ..spec import HostSpec, ValueSpec
from ..trace import patterns
from . import tables
from .hosts import Host, resolve_native
from .targets import ModelTargets
from .values import Value


def _value_line(v: ValueSpec) -> str:
    if v.read.kind == "missing":
        return f"({v.name}) -> {v.layout.text}: ⚠︎ missing: {v.read.words}"
    if v.layout.dtype == "object" and not v.layout.dims:
        return f"({v.name}): {v.meaning}"
    return f"({v.name}) -> {v.layout.text}: {v.meaning}"


def _indent(text: str, n: int = 2) -> str:
    return text.replace("\n", "\n" + " " * n)


def _leaf(module: torch.nn.Module) -> str:
    return f"{type(module).__name__}({module.extra_repr()})"


def _reverse(model: ModelTargets, pattern: str) -> dict[str, str]:
    """native child name → standard name, for the children of a host at ``pattern``."""
    out: dict[str, str] = {}
    prefix = f"{pattern}."
    for std, natives in model._family.rename.items():
        if std.startswith(prefix) and "." not in std[len(prefix):]:
            for n in natives:
                out[n] = std[len(prefix):]
    return out


def _render(model: ModelTargets, module: torch.nn.Module, pattern: str, index: int | None,
            targets: dict[int, str] | None = None) -> str:
    """``targets``: id of a module → the standard name a root-level rename gives it, so a standard
    module inside another one (``layers`` inside ``language_model``, ``projector`` inside ``vision``)
    is shown and walked under its own name."""
    targets = targets or {}
    specs: list[HostSpec] = model._specs_for(pattern, index) if pattern else []
    if isinstance(module, torch.nn.ModuleList):
        return _render_list(model, module, pattern, targets, index)
    rev = _reverse(model, pattern) if pattern else {}
    lines = []
    for name, child in module._modules.items():
        if child is None:
            continue
        at = index  # a child of a block is on that block: its kind's specs apply (a mixture's values, not a dense MLP's)
        if id(child) in targets:
            std, sub, at = targets[id(child)], targets[id(child)], None
        else:
            std = rev.get(name, name)
            sub = f"{pattern}.{std}" if pattern else ""
        shown = std if std == name else f"{std}/{name}"
        lines.append(f"({shown}): {_render(model, child, sub, at, targets)}")
    lines += [_value_line(v) for s in specs for v in s.values]
    if not lines:
        return _leaf(module)
    body = "\n  ".join(_indent(x) for x in lines)
    extra = module.extra_repr()
    head = f"{type(module).__name__}({extra}" if extra else f"{type(module).__name__}("
    return f"{head}\n  {body}\n)"


def _render_list(model: ModelTargets, module: torch.nn.ModuleList, pattern: str,
                 targets: dict[int, str] | None = None, block: int | None = None) -> str:
    if "[i]" in pattern:  # a list inside a block: fixed items, each its own path (layers[i].self_attn[1])
        rendered = [_render(model, m, f"{pattern}[{i}]", block, targets) for i, m in enumerate(module)]
    else:
        item = f"{pattern}[i]" if pattern else ""
        rendered = [_render(model, m, item, i, targets) for i, m in enumerate(module)]
    lines = []
    start = 0
    for i in range(1, len(rendered) + 1):
        if i == len(rendered) or rendered[i] != rendered[start]:
            n = i - start
            label = f"({start})" if n == 1 else f"({start}-{i - 1}): {n} x"
            lines.append(f"{label}{':' if n == 1 else ''} {rendered[start]}")
            start = i
    if not lines:
        return "ModuleList()"
    return "ModuleList(\n  " + "\n  ".join(_indent(x) for x in lines) + "\n)"


def render(model: ModelTargets) -> str:
    """The native tree in native module order, breadth first (the root's own children, such as
    lm_head, before those of the inner model), standard names beside the native ones."""
    root = model._module
    targets: dict[int, str] = {}
    for std, natives in model._family.rename.items():
        if "." in std.split("[")[0] or "[" in std:
            continue
        for native in natives:
            found = resolve_native(root, native)
            if found is not None:
                targets.setdefault(id(found), std)
                break
    holders = {id(m) for _, m in root.named_modules() if any(id(d) in targets for d in m.modules())}
    covered: set[int] = set()
    lines = []
    queue = [("", root)]
    while queue:
        path, mod = queue.pop(0)
        for name, child in mod._modules.items():
            if child is None or id(child) in covered:
                continue
            cpath = f"{path}.{name}" if path else name
            if id(child) in targets:
                std = targets[id(child)]
                shown = std if std == name else f"{std}/{name}"
                lines.append(f"({shown}): {_render(model, child, std, None, targets)}")
                covered.add(id(child))
            elif id(child) in holders:
                queue.append((cpath, child))  # a container of standard-named modules (model.model)
            else:
                lines.append(f"({cpath}): {_render(model, child, '', None, targets)}")
                covered.add(id(child))
    lines += [_value_line(v) for s in model._specs_for("model", None) for v in s.values]
    body = "\n  ".join(_indent(x) for x in lines)
    return f"{type(root).__name__}(\n  {body}\n)"


def load_facts(model: ModelTargets) -> list[tuple[str, str]]:
    """What this load is (family, class, attention, dtype, device, blocks): the head of the model's notebook view."""
    native = model._module
    first = next(native.parameters(), None)
    facts = [("family", model.family), ("class", type(native).__name__),
             ("attention", str(getattr(model.config, "_attn_implementation", None))),
             ("dtype", str(first.dtype).removeprefix("torch.") if first is not None else "-"),
             ("device", str(first.device) if first is not None else "-"), ("blocks", str(len(model.layers)))]
    if model.kernels:
        facts.append(("kernels", model.kernels))
    if model._tp is not None:
        facts.append(("tensor parallel", f"{model._tp.size} ranks (this is rank {model._tp.rank})"))
    return facts


def block_runs(model: ModelTargets) -> list[tuple[str, str, str]]:
    """(blocks, class, kind) of each run of consecutive blocks of one class and kind, as ``print(model)`` folds
    them (``0-2``)."""
    kinds = model.layer_kinds
    seen = [(type(host._module).__name__, kinds[i] or "") for i, host in enumerate(model.layers)]
    runs: list[tuple[str, str, str]] = []
    start = 0
    for i in range(1, len(seen) + 1):
        if i == len(seen) or seen[i] != seen[start]:
            runs.append((str(start) if i - 1 == start else f"{start}-{i - 1}", *seen[start]))
            start = i
    return runs


@dataclass(frozen=True)
class Row:
    host: str
    cls: str
    value: str
    layout: str
    status: str  # "available" | "unavailable" | "missing"
    why: str  # the condition, when conditional
    conditional: bool
    tp: str = ""  # under tensor parallel: how the value is gathered from the ranks (tensor_parallel.how)


class Support:
    """Values by host for this load: available, or ⚠︎ with the condition that serves them."""

    def __init__(self, family: str, rows: list[Row], tp: str = ""):
        self.family = family
        self.rows = rows
        self.tp = tp  # the sharding, on a tensor-parallel model ("" otherwise)

    def sharded(self) -> list[tuple[str, str, str]]:
        """Under tensor parallel: (host, value, how it is gathered) of every value served."""
        return [(r.host, r.value, r.tp) for r in self.rows if r.tp]

    def available(self) -> list[tuple[str, str]]:
        return [(r.host, r.value) for r in self.rows if r.status == "available"]

    def unavailable(self) -> list[tuple[str, str, str]]:
        return [(r.host, r.value, r.why) for r in self.rows if r.status != "available"]

    def as_dict(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for r in self.rows:
            out.setdefault(r.host, {})[r.value] = r.status if r.status == "available" else f"⚠︎ {r.why}"
        return out

    def _title(self) -> str:
        return f"support() · family {self.family}" + (f" · {self.tp}" if self.tp else "")

    @staticmethod
    def _cells(r: Row) -> tuple[str, str, str, str]:
        """(mark, value, layout, note) of a row: what the printout and the notebook view show of it."""
        mark = "✓" if r.status == "available" else "⚠︎"
        why = r.why if r.status != "available" else (f"(conditional: {r.why})" if r.conditional else "")
        tp = f"[TP: {r.tp}]" if r.tp and r.status == "available" else ""
        return mark, r.value, r.layout, "  ".join(x for x in (why, tp) if x)

    def __repr__(self) -> str:
        lines = [self._title()]
        host = None
        for r in self.rows:
            if r.host != host:
                host = r.host
                lines.append(f"{r.host} ({r.cls})")
            mark, value, layout, note = self._cells(r)
            lines.append(f"  {mark} {value:<26} {layout}{'  ' + note if note else ''}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = [(r.host, r.cls, *self._cells(r)) for r in self.rows]
        return tables.view(self._title(), [tables.table(("host", "class", "", "value", "layout", "note"), rows)])


def _example_hosts(model: ModelTargets) -> list[tuple[str, Host, list[HostSpec]]]:
    """One live host per (path, block kind): model, layers[first of each kind], their children."""
    out: list[tuple[str, Host, list[HostSpec]]] = []
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in model.live_hosts(path):
            specs = model._specs_for("model", None) if host is model else host._specs()
            key = (path, tuple(id(s) for s in specs))
            if specs and key not in seen:
                seen.add(key)
                out.append((label, host, specs))
    return out


def support(model: ModelTargets) -> Support:
    rows = []
    for label, host, specs in _example_hosts(model):
        for spec in specs:
            for v in spec.values:
                handle = Value(host, v.name, v, v.read)
                why = model._why_unavailable(handle)
                missing = v.read.kind == "missing"
                says = v.read.words if missing else v.needs.says if v.needs else ""
                if why is None and v.needs is not None and model._why_unavailable(handle, edit=True) is not None:
                    says = f"{patterns.words(v.read)}; an edit {v.needs.says}"  # read, but not editable, under this load
                tp = ""
                if model._tp is not None and why is None and v.read.kind != "derived":
                    tp = tensor_parallel.how(model._target(handle))
                rows.append(Row(label, type(host._module).__name__, v.name, v.layout.text,
                                "available" if why is None else "missing" if missing else "unavailable",
                                says, v.needs is not None, tp))
    sharding = model._tp
    said = "" if sharding is None else (
        f"tensor parallel over {sharding.size} ranks (this is rank {sharding.rank}): every value is the full tensor on "
        "every rank, gathered from the ranks' shards; save(local=True) gives the rank's shard")
    return Support(model.family, rows, said)
