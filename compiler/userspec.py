"""A user's own spec, compiled at load: ``nnatlas.load(path, spec="my_family.yaml")``, ``wrap(model, spec=...)`` and
``NNATLAS_SPECS=dir`` (the runtime's one door here is ``nnatlas.user_specs``, which imports this module lazily).

The spec file is compiled beside the shared vocabulary, notes and parts this nnatlas carries (``specs/`` of a checkout,
the package data ``nnatlas.specs`` of a wheel) and the shipped specs it extends, with ``generate``'s validation: the
spec language, the resolver, the rendered adapter's shape (``pycheck``) and its module tree on the meta device
(``treecheck``), every problem at once as ``file:line:col``. The adapter ``generate`` would write to
``generated/families/`` is rendered and run as a module in memory: nothing is written anywhere.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from . import default_root, emit, pycheck, treecheck
from .errors import Problem, SpecError
from .resolve import PARTS, parse_sources
from .resolve import _resolve as resolve_sources

__all__ = ["compile_spec", "model_types_of", "shipped_specs"]


def shipped_specs() -> Path:
    """The specs this nnatlas carries: a checkout's specs/, or the wheel's package data ``nnatlas/specs``."""
    return default_root() / "specs"


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}  # the compiler says what is wrong with it, at its line
    return data if isinstance(data, dict) else {}


def model_types_of(path: Path) -> list[str]:
    """The model types a spec file says it loads (``loads.model_types``), read without compiling it."""
    loads = _read_yaml(path).get("loads")
    found = loads.get("model_types") if isinstance(loads, dict) else None
    return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []


def _bases(data: dict[str, Any]) -> list[str]:
    ext = data.get("extends") or []
    return [ext] if isinstance(ext, str) else [e for e in ext if isinstance(e, str)] if isinstance(ext, list) else []


def compile_spec(path: Path, siblings: list[Path] | None = None) -> types.ModuleType:
    """The adapter module of the family that the spec file ``path`` declares, compiled in memory (its name is
    ``nnatlas.families.<family>``; not registered anywhere: the caller does that). ``siblings``: other user spec
    files the spec may extend (the rest of an NNATLAS_SPECS folder). Raises SpecError with every problem."""
    path = Path(path)
    rel = str(path)
    if not path.is_file():
        raise SpecError([Problem(rel, 1, 1, "no such spec file" if not path.exists() else "not a file")])
    specs = shipped_specs()
    shipped = {p.stem: p for p in specs.glob("*.yaml") if not p.name.startswith("_")}
    users = {p.stem: p for p in (siblings or []) if p.resolve() != path.resolve()}
    data = _read_yaml(path)
    name = data.get("family") if isinstance(data.get("family"), str) else path.stem
    if name in shipped:
        raise SpecError([Problem(rel, 1, 1, f"family '{name}' is a family nnatlas ships (specs/{name}.yaml): give "
                                            "your spec a name of its own (family: my_" + name + ")")])
    files: list[tuple[str, str, bytes]] = [(p.name, f"{specs.name}/{p.name}", p.read_bytes())
                                           for p in sorted(specs.glob("_*.yaml"))]
    files.append((f"{name}.yaml", rel, path.read_bytes()))
    todo, seen = _bases(data), {name}
    while todo:  # the specs it extends, directly or not: the user's own siblings first, then the shipped ones
        base = todo.pop()
        src = users.get(base) or shipped.get(base)
        if base in seen or src is None:
            continue  # (an unknown base is the resolver's problem, at the spec's line)
        seen.add(base)
        files.append((f"{base}.yaml", str(src) if base in users else f"{specs.name}/{src.name}", src.read_bytes()))
        todo += _bases(_read_yaml(src))
    parts = [(p.name, f"{specs.name}/{PARTS}/{p.name}", p.read_bytes()) for p in sorted((specs / PARTS).glob("*.yaml"))]
    atlas = resolve_sources(*parse_sources(files), specs.name, parse_sources(parts))
    family = next(f for f in atlas.families if f.name == name)
    source = emit.render_family(family)
    pycheck.check_adapter(f"<adapter of {rel}>", source)
    problems = treecheck.check(family, source)
    if problems:
        raise SpecError(problems)
    module = types.ModuleType(f"nnatlas.families.{name}")
    module.__file__ = rel
    exec(compile(source, f"<adapter of {rel}>", "exec"), module.__dict__)  # our own output, checked above
    return module
