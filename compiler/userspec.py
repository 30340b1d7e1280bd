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
from .errors import Problem, SpecError, UserError
from .resolve import PARTS, parse_sources
from .resolve import _resolve as resolve_sources

__all__ = ["compile_spec", "compile_text", "draft_text", "model_types_of", "shipped_specs", "verify"]


def shipped_specs() -> Path:
    """The specs this nnatlas carries: a checkout's specs/, or the wheel's package data ``nnatlas/specs``."""
    return default_root() / "specs"


def _read_yaml(path: Path) -> dict[str, Any]:
    return _parse(path.read_bytes())


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
    return compile_text(path.read_bytes(), rel, siblings, path)


def compile_text(raw: bytes, rel: str, siblings: list[Path] | None = None, path: Path | None = None) -> types.ModuleType:
    """:func:`compile_spec` of a spec's bytes, shown in messages as ``rel``."""
    specs = shipped_specs()
    shipped = {p.stem: p for p in specs.glob("*.yaml") if not p.name.startswith("_")}
    users = {p.stem: p for p in (siblings or []) if path is None or p.resolve() != path.resolve()}
    data = _parse(raw)
    name = data.get("family") if isinstance(data.get("family"), str) else Path(rel).stem
    if name in shipped:
        raise SpecError([Problem(rel, 1, 1, f"family '{name}' is a family nnatlas ships (specs/{name}.yaml): give "
                                            "your spec a name of its own (family: my_" + name + ")")])
    files: list[tuple[str, str, bytes]] = [(p.name, f"{specs.name}/{p.name}", p.read_bytes())
                                           for p in sorted(specs.glob("_*.yaml"))]
    files.append((f"{name}.yaml", rel, raw))
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
    module.__dict__["__adapter_source__"] = source  # (what a verified draft's cache keeps)
    return module


def _parse(raw: bytes) -> dict[str, Any]:
    """A spec's mapping, or {} for one that does not read as YAML (the compiler says what is wrong, at its line)."""
    import yaml

    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def draft_text(model_type: str, model_path: str | None = None) -> str:
    """The drafter's spec for ``model_type`` (from the checkpoint folder's config when given), in memory. Raises
    UserError when the type cannot be drafted."""
    from .draft import DraftError, draft

    try:
        return draft(model_type, model_path=model_path).text
    except DraftError as e:
        raise UserError(f"nnatlas cannot draft a spec for {model_type}: {e}") from None


def verify(family: str, budget_s: float = 60.0) -> tuple[list[str], list[str]]:
    """(the checks that held, the ones that failed or did not run, each with why): the family's oracle (its values
    against what transformers returns itself, exactly, on a perturbed tiny twin of its config class, under each
    attention load) and every identity of its spec on that twin (three sequences, padded left and right), within
    ``budget_s`` seconds. The family must be in the lookup."""
    import time

    from nnatlas import testing

    start = time.perf_counter()
    held: list[str] = []
    failed: list[str] = []
    checks: list[tuple[str, Any]] = [(f"oracle {check} [{attn}]", lambda c=check, a=attn: testing.check_oracle(family, c, a))
                                     for check, attn in testing.oracle_checks(family)]
    fam = testing.adapter_module(family).FAMILY
    try:  # (the identities' case draws the same twin: built once)
        params = testing.first_params(family)
        twin = testing.shared_build(family, params, perturbed=True)
        case = testing.Case(family, params, testing._fixed_inputs(twin, text_only=True), seed=0, perturbed=True)
    except Exception as e:  # noqa: BLE001 - said as the draft's finding
        return [], [f"the perturbed tiny twin does not build: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    texts: dict[str, list[str]] = {}  # each host path's identities, in the spec's order (check_identity's index)
    for h in fam.hosts:
        if not h.path.startswith("vision"):
            texts.setdefault(h.path, []).extend(i.text for i in h.identities)
    checks += [(f"identity {path}: {text}", lambda p=path, k=k: testing.check_identity(case, p, k))
               for path, ts in texts.items() for k, text in enumerate(ts)]
    for what, run in checks:
        if time.perf_counter() - start > budget_s:
            failed.append(f"{what}: not run (the {budget_s:.0f} s verification budget ran out)")
            continue
        try:
            run()
        except Exception as e:  # noqa: BLE001 - a failing check is the draft's finding, said as such
            failed.append(f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        else:
            held.append(what)
    return held, failed
