"""A wrapped model's module tree held against its family's spec: every way the two differ, as records.

The one walker of the tree check. :func:`misfits` walks the standard-name tree of a wrapped model and yields a
:class:`Misfit` for each spec item the model does not fit: a config entry its config cannot answer, a rename whose
native path is not there, a host path with no module, a host of another class than its spec names, a child module,
a climb or a method a value is read at that is not there, a layer count other than the config's. Each record says
which spec item, on which block, and what is there instead (the children a path breaks off at), and words nothing:

- ``nnatlas.wrap`` (a forced family, a user's spec, a draft) says them as lines, one per problem with the blocks it
  occurs on (:func:`nnatlas.loading.load.mismatches`);
- ``make generate``'s tree check (``nnatlas.compiler.resolve.treecheck``) runs the same walk on the tiny models and
  the recorded checkpoints built on ``meta``, and puts each at its spec line with the nearest names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import Unavailable
from ..spec import Family, HostSpec, ValueSpec, pattern_of
from . import introspect
from .hosts import Host, step

AtlasModel = Any  # a wrapped model (nnatlas.model.AtlasModel, a room above this one)


@dataclass(frozen=True)
class Gap:
    """Where a path of child modules breaks off: the module at ``at`` (its label, ``model.model`` or
    ``layers[0].mlp``, and its class) has no child ``part``; ``children`` are the names it has (a host's standard
    names, then its native children; a native module's own children for a rename's path), ``native`` the native
    module's own children alone."""

    at: str
    cls: str
    part: str
    children: tuple[str, ...]
    native: tuple[str, ...]
    index: int  # how many parts of the path were found before it broke off

    @property
    def renamed_away(self) -> bool:
        """The missing part is a standard name of the module whose rename finds nothing (said at the rename)."""
        return self.part in self.children and self.part not in self.native


@dataclass(frozen=True)
class Misfit:
    """One way the model does not fit its spec.

    ``kind``: ``config`` (``path`` a config entry the config cannot answer, ``found`` the error), ``rename`` (``path``
    the standard name, ``gap`` where its first native path breaks off; on every host at its parent), ``missing`` (a
    host path with no module at ``label``), ``class`` (``found`` the module's class, ``accepted`` the classes the spec
    names), ``read`` (the value ``value`` of ``spec``, read at ``text``, whose child path breaks off at ``gap``;
    ``sibling``: the host's parent has that child, so the read leaves its host), ``climb`` (the read climbs above the
    root), ``method`` (``gap``: the module the read reaches, ``part`` the method it lacks, ``children`` the methods it
    has) and ``layers`` (``found`` the blocks the model has, ``accepted`` the count the config says)."""

    kind: str
    path: str
    label: str
    spec: HostSpec | None = None
    value: str = ""
    text: str = ""
    gap: Gap | None = None
    found: str = ""
    accepted: tuple[str, ...] = ()
    sibling: tuple[str, ...] = ()  # the parent holding the part a read looked for
    # inside its host: its label and class (the read leaves its host)
    natives: tuple[str, ...] = ()  # a rename's native paths


def children_words(kids: tuple[str, ...] | list[str], none: str = " (it has no children)") -> str:
    """``(its children: a, b, ...)``: the first 12 names, as every tree-check message lists them."""
    return f" (its children: {', '.join(kids[:12])}{', ...' if len(kids) > 12 else ''})" if kids else none


def host_gap(start: Any, parts: tuple[str, ...]) -> Gap | None:
    """None when ``parts`` lead from the host (or host list) ``start`` to a module through standard children;
    else where they break off."""
    node = start
    for n, part in enumerate(parts):
        nxt = introspect.child(node, part)
        if nxt is None:
            module = introspect.native(node)
            return Gap(introspect.label(node) or "model", type(module).__name__, part,
                       tuple(introspect.child_names(node)), tuple(module._modules), n)
        node = nxt
    return None


def sibling(host: Host, gap: Gap) -> tuple[str, ...]:
    """(label, class) of ``host``'s parent where the first part a path looked for inside ``host`` is a child of the
    parent instead (the path leaves its host: a read outside it starts with ^.); () otherwise."""
    parent = introspect.parent(host) if gap.index == 0 else None
    if parent is None or introspect.child(parent, gap.part) is None:
        return ()
    return (introspect.label(parent) or "model", type(introspect.native(parent)).__name__)


def native_gap(host: Host, dotted: str) -> Gap | None:
    """None when the native path ``dotted`` (``model.norm``) is under ``host``'s module; else where it breaks off."""
    module: Any = introspect.native(host)
    at = introspect.label(host) or "model"
    for n, part in enumerate(dotted.split(".")):
        nxt = module._modules.get(part)
        if nxt is None:
            kids = tuple(module._modules)
            return Gap(at, type(module).__name__, part, kids, kids, n)
        module, at = nxt, f"{at}.{part}"
    return None


def resolved(start: Any, parts: tuple[str, ...]) -> Any:
    """The native module ``parts`` lead to from ``start`` through standard children, or None."""
    node = start
    for part in parts:
        node = introspect.child(node, part)
        if node is None:
            return None
    return introspect.native(node)


def hosts_at(model: AtlasModel, path: str) -> list[tuple[str, Host | None]]:
    """Each place the spec path ``path`` names on this model: (its label, its host or None where the module is
    missing). Nothing under a missing parent (that parent's own problem is said once)."""
    if path == "model":
        return [("model", model)]
    head, bracket, rest = path.partition("[i]")
    node: Any = model
    for part in head.split("."):
        nxt = introspect.child(node, part) if isinstance(node, Host) else None
        if nxt is None:
            return [] if node is not model or bracket else [(path, None)]
        node = nxt
    if not bracket:
        return [(path, node)] if isinstance(node, Host) else []
    out: list[tuple[str, Host | None]] = []
    for i in range(len(node)):
        host: Any = node[i]
        label = f"{head}[{i}]"
        for part in [p for p in rest.split(".") if p]:
            nxt = step(host, part)  # a child, or an item of a list child (self_attn[1])
            label += f".{part}"
            if not isinstance(nxt, Host):
                host = None
                break
            host = nxt
        if host is None and label != path.replace("[i]", f"[{i}]", 1):
            continue  # a parent missing on this block: said at its own path
        out.append((label, host))
    return out


def optional(fam: Family, path: str) -> bool:
    """Whether every value at ``path`` and under it needs the image-text load (a vision encoder, which a text-only
    load does not build)."""
    values = [v for h in fam.hosts if h.path == path or h.path.startswith((f"{path}.", f"{path}["))
              for v in h.values]
    return any(v.needs is not None and v.needs.name == "processor" for v in values) and \
        all(v.needs is not None and (v.needs.name == "processor" or v.needs.never) for v in values)


def index_of(label: str) -> int | None:
    """The block index in a label (``layers[3].mlp`` -> 3), None outside a stack."""
    head = label.partition("[")[2].partition("]")[0]
    return int(head) if head.isdigit() else None


def misfits(model: AtlasModel, classes: tuple[str, ...] = ()) -> Iterator[Misfit]:
    """Every way ``model``'s module tree differs from its family's spec, one record per spec item and place (see
    :class:`Misfit`). ``classes``: model classes accepted at the root besides the family's own (the compiler's tiny
    model classes)."""
    fam: Family = model._family
    yield from _config(model, fam)
    yield from _renames(model, fam)
    paths = list(dict.fromkeys(h.path for h in fam.hosts))
    for path in paths:
        places = hosts_at(model, path)
        anywhere = any(host is not None for _, host in places)
        for label, host in places:
            applies = model.specs_at(path, index_of(label))
            if not applies:
                continue
            if host is None:
                # a host of a kind (its ``when`` holds here) must be here; a child without one that no block has
                # (a hybrid's self_attn is on some blocks) is missing only when no block has it
                if any(s.when is not None for s in applies) or not (anywhere or optional(fam, path)):
                    yield Misfit("missing", path, label)
                continue
            for spec in applies:
                yield from host_misfits(model, host, label, spec, classes)
    if "num_layers" in fam.config and "layers" in {p.partition("[i]")[0] for p in paths}:
        try:
            want = model.config_value("num_layers")
            have = sum(1 for _ in hosts_at(model, "layers[i]"))
        except Exception:  # noqa: BLE001 - said as its config entry's problem
            want = have = None
        if isinstance(want, int) and want != have:
            yield Misfit("layers", "layers", "model", found=str(have), accepted=(str(want),))


def host_misfits(model: AtlasModel, host: Host, label: str, spec: HostSpec,
                 classes: tuple[str, ...] = ()) -> Iterator[Misfit]:
    """What of ``spec`` the live ``host`` (at ``label``) does not fit: its class, then each value's read."""
    fam: Family = model._family
    module = introspect.native(host)
    names = {c.__name__ for c in type(module).__mro__}
    accepted = {spec.cls} | (set(fam.classes) | set(classes) if spec.path == "model" else set())
    if not names & accepted:
        yield Misfit("class", spec.path, label, spec, found=type(module).__name__, accepted=tuple(sorted(accepted)))
    for v in spec.values:
        found = read_misfit(model, host, label, spec, v)
        if found is not None:
            yield found


def read_misfit(model: AtlasModel, host: Host, label: str, spec: HostSpec, v: ValueSpec) -> Misfit | None:
    """Whether the child modules, the climb (``^.``) and the method ``v``'s read names are there from ``host``."""
    read = v.read
    if read.kind not in ("module", "call", "op", "method") or not (read.module or read.up or read.method):
        return None
    start: Any = model if read.scope_root else host
    for _ in range(read.up):
        start = introspect.parent(start) if start is not None else None
    if start is None:
        return Misfit("climb", spec.path, label, spec, v.name, read.text)
    gap = host_gap(start, read.module)
    if gap is not None:
        std = gap.part if gap.at == "model" else f"{pattern_of(gap.at)}.{gap.part}"
        if gap.renamed_away or std in model._family.rename:
            return None  # a standard name whose rename finds nothing: said at the rename
        beside = sibling(host, gap) if not read.up and not read.scope_root else ()
        return Misfit("read", spec.path, label, spec, v.name, read.text, gap, sibling=beside)
    if read.kind == "method":
        mod = resolved(start, read.module)
        if mod is not None and not callable(getattr(mod, read.method or "", None)):
            methods = tuple(m for m in dir(type(mod)) if not m.startswith("__") and callable(getattr(type(mod), m)))
            at = ".".join([introspect.label(start) or "model", *read.module])
            return Misfit("method", spec.path, label, spec, v.name, read.text,
                          Gap(at, type(mod).__name__, read.method or "", methods, methods, len(read.module)))
    return None


def _config(model: AtlasModel, fam: Family) -> Iterator[Misfit]:
    for name in fam.config:
        try:
            model.config_value(name)
        except Unavailable:
            continue
        except Exception as e:  # noqa: BLE001 - the config of another family's model: said as its problem
            yield Misfit("config", name, "model", found=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def rename_places(model: AtlasModel, std: str, natives: tuple[str, ...]) -> list[tuple[str, Host, Gap | None]]:
    """Each live host at the parent of the standard name ``std``: (its label, the host, None where one of the
    native paths is under it, else where the first breaks off)."""
    parent = std.rsplit(".", 1)[0] if "." in std else "model"
    out = []
    for label, host in hosts_at(model, parent):
        if host is None:
            continue
        found = any(introspect.resolve_native(introspect.native(host), n) is not None for n in natives)
        out.append((label, host, None if found else native_gap(host, natives[0])))
    return out


def _needed(model: AtlasModel, fam: Family, std: str) -> bool:
    """Whether a block of ``model`` has a host spec that reads through the renamed child ``std`` (the parent's
    values that read at it, or a host at it or under it): False only where every such spec is a kind's and no
    block is of that kind."""
    parent, _, child = std.rpartition(".")
    users = [h for h in fam.hosts if h.path == std or h.path.startswith(std + ".")]
    users += [h for h in fam.hosts if h.path == parent and any(tuple(v.read.module[:1]) == (child,) for v in h.values)]
    if not users or any(h.when is None for h in users) or "[i]" not in std:
        return True
    blocks = len(hosts_at(model, std.partition("[i]")[0] + "[i]"))
    return any(h.when is not None and h.when(model._config_view, i) for h in users for i in range(blocks))


def _renames(model: AtlasModel, fam: Family) -> Iterator[Misfit]:
    # the renames into a vision encoder a text-only load does not build (qwen3_5_text's projector inside its vision)
    unbuilt = [n for std, natives in fam.rename.items() if optional(fam, std) for n in natives]
    for std, natives in fam.rename.items():
        if optional(fam, std) or any(n.startswith(f"{u}.") for n in natives for u in unbuilt):
            continue
        places = rename_places(model, std, tuple(natives))
        # a child some blocks have (a router on the mixture blocks only) is missing only when no block has it, and
        # only where some block needs it (Nemotron-H's dense 9B has no mixture block, so no block reads a router)
        if places and all(gap is not None for _, _, gap in places) and _needed(model, fam, std):
            for label, _, gap in places:
                yield Misfit("rename", std, label, gap=gap, natives=tuple(natives))
