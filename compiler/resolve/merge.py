"""Merging a family's spec files: its ``extends:`` bases linearized, its included parts (their classes mapped),
each file laid over the ones before it (``merge``), every path remembering the file and position that set it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import Problems, suggest
from ..language.models import PartRaw
from ..language.yamlpos import Located
from ..language.yamlpos import Path as DataPath
from .sources import PARTS, Source


@dataclass
class Merged:
    """A family's data after ``extends:``, each path remembering the file that set it."""

    data: dict[str, Any]
    where: dict[DataPath, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    keys: dict[DataPath, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    parts: list[Source] = field(default_factory=list)  # the parts the family includes

    def pos(self, path: DataPath, key: bool = False) -> tuple[str, tuple[int, int]]:
        p = tuple(path)
        while True:
            if key and p in self.keys:
                return self.keys[p]
            if not key and p in self.where:
                return self.where[p]
            if p in self.keys:
                return self.keys[p]
            if not p:
                return next(iter(self.where.values()))
            p = p[:-1]


def _droppable(path: DataPath, key: str = "") -> bool:
    if key == "kinds" and len(path) == 2 and path[0] == "hosts":
        return True  # a host's inherited kinds, all of them
    return bool(path) and (path[-1] in ("values", "kinds")
                           or path in (("hosts",), ("rename",), ("config",), ("tiny",), ("tiny", "draw")))


def _layer(loc: Located) -> Merged:
    """One file's data as a merge layer: every path positioned in that file."""
    return Merged(_deepcopy(loc.data), {p: (loc.file, v) for p, v in loc.values.items()},
                  {p: (loc.file, v) for p, v in loc.keys.items()})


OWN_ONLY = ("notes", "checkpoints")  # never inherited: a family's own, or the base's and its own with `notes+:`
EXPLICIT = ("identities",)  # over inherited ones, say how: `identities+:` appends, `identities=:` replaces


def merge(base: Merged, top: Merged, found: Problems | None = None, inheriting: bool = True) -> Merged:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) is replaced;
    ``name: null`` drops an inherited entry of ``values``, a host's ``kinds`` (or ``kinds: null`` all of them), ``hosts``, ``rename``, ``config``,
    ``tiny`` or ``tiny.draw`` (elsewhere null is a value: ``tiny.config`` passes it to the config class).
    ``name+: [...]`` appends to an inherited list, ``name=: [...]`` replaces it; over inherited
    identities one of the two is required (a plain ``identities:`` there is an error).
    Positions follow what was set."""
    return _Merge(base, top, found, inheriting).out


class _Merge:
    """One ``merge`` (methods, not nested functions: a recursive closure is a reference cycle, which
    would keep every merge's position tables alive until the cycle collector runs)."""

    def __init__(self, base: Merged, top: Merged, found: Problems | None, inheriting: bool):
        self.base, self.top, self.found, self.inheriting = base, top, found, inheriting
        self.out = Merged(_deepcopy(base.data), dict(base.where), dict(base.keys))
        self.walk(self.out.data, top.data, ())
        if () in top.where:
            self.out.where.setdefault((), top.where[()])

    def err(self, path: DataPath, message: str) -> None:
        if self.found is not None:
            file, pos = self.top.pos(path, key=True)
            self.found.add(file, pos, message)

    def moved(self, tp: DataPath, p: DataPath, value: Any, offset: int) -> None:
        """``value``, top's at ``tp``, now sits at ``p``, a list's items ``offset`` further on: its positions go
        with it, looked up path by path over its own entries (a table of top's paths by prefix cost each merge
        top's size times its depth, squared: a third of the compile)."""
        where, keys = self.top.where, self.top.keys
        stack: list[tuple[DataPath, Any]] = [((), value)]
        while stack:
            rest, v = stack.pop()
            q, moved = (*tp, *rest), rest
            if rest and isinstance(rest[0], int):
                moved = (rest[0] + offset, *rest[1:])
            if q in where:
                self.out.where[(*p, *moved)] = where[q]
            if q in keys:
                self.out.keys[(*p, *moved)] = keys[q]
            if isinstance(v, dict):
                stack.extend(((*rest, k), x) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend(((*rest, i), x) for i, x in enumerate(v))

    def walk(self, dst: dict[str, Any], src: dict[str, Any], path: DataPath) -> None:
        for key, value in src.items():
            name, how = (key[:-1], key[-1]) if len(key) > 1 and key[-1] in "+=" else (key, None)
            p, tp = (*path, name), (*path, key)
            self.out.keys[p] = self.top.pos(tp, key=True)
            if how is not None:
                if name in src:
                    self.err(tp, f"'{key}' and '{name}' in one mapping: give one")
                    continue
                if not isinstance(value, list):
                    self.err(tp, f"'{key}' takes a list ({name}{how} {'appends to' if how == '+' else 'replaces'} "
                                 f"the inherited {name})")
                    continue
                if how == "+" and isinstance(dst.get(name), list):
                    offset = len(dst[name])
                    dst[name] = dst[name] + _deepcopy(value)
                else:
                    offset = 0
                    dst[name] = _deepcopy(value)
                self.moved(tp, p, value, offset)
                self.out.where[p] = self.top.where.get(tp, self.top.pos(tp))
                continue
            if value is None and key in dst and _droppable(path, key):
                del dst[key]  # `name: null` drops an inherited entry
                continue
            if (key in EXPLICIT and self.inheriting and isinstance(dst.get(key), list) and dst[key]
                    and isinstance(value, list)):
                file = self.base.where.get(p, ("a base", (0, 0)))[0]
                where = ".".join(str(x) for x in path[1:]) or "the family"
                n = len(dst[key])
                self.err(tp, f"{where}: {n} {key if n > 1 else key.removesuffix('ies') + 'y'} {'are' if n > 1 else 'is'} inherited here (from {file}); write '{key}+:' to add "
                             f"to them or '{key}=:' to replace them")
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                self.walk(dst[key], value, p)
            else:
                dst[key] = _deepcopy(value)
                self.moved(tp, p, value, 0)
            self.out.where[p] = self.top.where.get(p, self.top.pos(p))


def _deepcopy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deepcopy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_deepcopy(x) for x in v]
    return v


def _part_layer(fam: Source, k: int, inc: Any, parts: dict[str, tuple[Source, PartRaw]], seen: set[str],
                found: Problems) -> Merged | None:
    """The layer of ``include[k]`` of family ``fam``: the part's data with its classes mapped."""
    loc = fam.located
    at: DataPath = ("include", k)
    if not isinstance(inc, dict) or not isinstance(inc.get("part"), str):
        return None  # pydantic reports the shape
    name = inc["part"]
    if name in seen:
        found.add(fam.rel, loc.pos((*at, "part")), f"include names part '{name}' twice")
        return None
    seen.add(name)
    if name not in parts:
        found.add(fam.rel, loc.pos((*at, "part")), f"unknown part '{name}' (specs/{PARTS}/{name}.yaml)"
                  + suggest(name, parts))
        return None
    src, raw = parts[name]
    got = inc.get("classes")
    mapping: dict[str, Any] = got if isinstance(got, dict) else {}
    layer = _layer(src.located)
    for key in ("part", "about", "classes"):
        layer.data.pop(key, None)
    for placeholder in mapping:
        if placeholder not in raw.classes:
            found.add(fam.rel, loc.pos((*at, "classes", placeholder), key=True), f"include {name}: the part has no "
                      f"class '{placeholder}' to map (its classes: {', '.join(raw.classes)})" + suggest(placeholder, raw.classes))
    unmapped = [c for c in raw.classes if c not in mapping]
    if unmapped:
        found.add(fam.rel, loc.pos(at), f"include {name}: map every class of the part to this family's: "
                  f"{', '.join(unmapped)} not mapped (classes: {{{unmapped[0]}: ...}})")
    for path, host in layer.data.get("hosts", {}).items():
        cls = host.get("class") if isinstance(host, dict) else None
        if isinstance(cls, str) and cls in mapping:
            host["class"] = mapping[cls]
            layer.where[("hosts", path, "class")] = (fam.rel, loc.pos((*at, "classes", cls)))
    return layer


def _bases(src: Source) -> tuple[list[str], list[DataPath]]:
    """A family's ``extends:``: one name or a list of names, each with its path in the file."""
    ext = src.located.data.get("extends")
    if ext is None:
        return [], []
    if isinstance(ext, list):
        return [x if isinstance(x, str) else repr(x) for x in ext], [("extends", k) for k in range(len(ext))]
    return [ext if isinstance(ext, str) else repr(ext)], [("extends",)]


def extends_chain(name: str, by_name: dict[str, Source], found: Problems,
                   orders: dict[str, list[str] | None], parts: dict[str, tuple[Source, PartRaw]] | None = None
                   ) -> Merged | None:
    """A family's data merged over its bases.

    ``extends: base`` or ``extends: [a, b, ...]``: the spec files are merged one over the other in
    the order of a left-to-right, depth-first walk of the bases, each file once, every base before
    the specs that extend it and the family's own file last; so a later base overrides an earlier
    one, and a ``name: null`` drop in any file stays dropped. Notes and checkpoints are each
    file's own: a file that names neither ``notes`` nor ``notes+`` drops the bases' (the same for
    checkpoints), so no page shows another family's printout or runs its examples by accident.
    A base named twice, an unknown base and a cycle are errors at the ``extends`` entry that names them.

    ``include: [{part: NAME, classes: {...}}]``: the family's parts (``specs/parts/``) are merged
    just before its own file, in the order listed (so the file overrides them); a base's parts
    are not inherited: a family is made of the parts it includes.
    """
    order = _linearize(name, by_name, found, orders, ())
    if order is None:
        return None
    merged: Merged | None = None
    used: list[Source] = []
    before: dict[str, list[str]] = {}
    for fam in order:
        own = _layer(by_name[fam].located)
        layers = [own]
        includes = own.data.get("include") if fam == name else None  # parts are not inherited
        if includes:
            before = {sec: list((merged.data if merged else {}).get(sec) or {}) for sec in _ORDERED}
            seen: set[str] = set()
            got = [(inc, x) for k, inc in enumerate(includes if isinstance(includes, list) else [])
                   if (x := _part_layer(by_name[name], k, inc, parts or {}, seen, found)) is not None]
            layers = [x for _, x in got] + [own]
            used = [(parts or {})[inc["part"]][0] for inc, _ in got]
        for layer in layers:
            if merged is None:
                merged = merge(Merged({}, {(): layer.where.get((), layer.pos(()))}), layer, found, inheriting=False)
                continue
            if layer is own:
                for key in OWN_ONLY:  # a base's notes and checkpoints are not this file's, unless it says `key+:`
                    if not any(k in own.data for k in (key, f"{key}+", f"{key}=")):
                        merged.data.pop(key, None)
            merged = merge(merged, layer, found)
    assert merged is not None
    if used:  # keys in the order of the bases and the file; what only the parts bring after them
        own_data = by_name[name].located.data
        for sec in _ORDERED:
            table = merged.data.get(sec)
            if isinstance(table, dict):
                mine = [k for k in (own_data.get(sec) or {}) if k in table]
                first = [k for k in before.get(sec, []) if k in table] + [k for k in mine if k not in before.get(sec, [])]
                merged.data[sec] = {k: table[k] for k in [*first, *(k for k in table if k not in first)]}
    merged.parts = used
    merged.data["family"] = name
    merged.data["extends"] = by_name[name].located.data.get("extends")
    merged.data["include"] = by_name[name].located.data.get("include") or []
    return merged


_ORDERED = ("rename", "config", "functions", "hosts")


def _linearize(name: str, by_name: dict[str, Source], found: Problems, done: dict[str, list[str] | None],
               stack: tuple[str, ...]) -> list[str] | None:
    """The spec files a family is merged from, in merge order (see ``extends_chain``)."""
    if name in done:
        return done[name]
    src = by_name[name]
    bases, paths = _bases(src)
    ok = True
    if not bases and "extends" in src.located.data:
        found.add(src.rel, src.located.pos(("extends",)), "extends names no family: give a name or a list of names")
        ok = False
    seen: set[str] = set()
    order: list[str] = []
    for base, at in zip(bases, paths):
        pos = src.located.pos(at)
        if base in seen:
            found.add(src.rel, pos, f"extends names '{base}' twice")
            ok = False
            continue
        seen.add(base)
        if base not in by_name:
            if not any(p.file.endswith(f"/{base}.yaml") for p in found.items):  # not one whose errors are listed
                found.add(src.rel, pos, f"extends unknown family '{base}'" + suggest(base, by_name))
            ok = False
            continue
        if base == name or base in stack:
            chain = [*stack[stack.index(base):], name, base] if base in stack else [name, base]
            found.add(src.rel, pos, f"extends cycle: {' -> '.join(chain)}")
            ok = False
            continue
        got = _linearize(base, by_name, found, done, (*stack, name))
        if got is None:
            ok = False
            continue
        order += [f for f in got if f not in order]
    done[name] = [*order, name] if ok else None
    return done[name]
