"""A user's own spec at load: ``nnatlas.load(path, spec="my_family.yaml")``, ``nnatlas.wrap(model, spec=...)``, and
``NNATLAS_SPECS=dir`` (a folder of spec files consulted for a model type no shipped family covers).

The runtime's one second door to the compiler (beside ``python -m nnatlas``): the spec is compiled with ``nnatlas
generate``'s validation (``nnatlas.compiler.userspec``, imported here only when a user spec is asked for, so ``import
nnatlas`` and every shipped family's wrap and trace load no compiler), its adapter run as a module in memory and
added to the family lookup of this process after the shipped families (``registry.add_user``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import registry, safe_files
from ..errors import NnatlasError
from ..spec import Family
from . import draft_cache as draft_cache_data

ENV = "NNATLAS_SPECS"

_COMPILED: dict[tuple[str, str], ModuleType] = {}  # (resolved path, sha256 of it and its folder's specs) -> adapter
_ORIGINS: dict[tuple[str, str], str] = {}  # a draft's key -> what verified it (support() says it)
_TEXTS: dict[str, str] = {}  # a drafted family's name -> its spec text (written to a file when it cannot serve)


def _key(path: Path, siblings: list[Path]) -> tuple[str, str]:
    h = hashlib.sha256()
    for p in [path, *sorted(siblings)]:
        h.update(str(p).encode() + b"\0" + p.read_bytes() + b"\0")
    return str(path), h.hexdigest()


def compile_file(path: str | os.PathLike[str], siblings: list[Path] | None = None) -> ModuleType:
    """The adapter of the spec file ``path``, compiled once per content in this process and added to the family
    lookup. Every problem of the spec is one NnatlasError, each ``file:line:col: message``."""
    file = Path(os.fspath(path)).expanduser()
    if not file.is_file():
        what = "does not exist" if not file.exists() else "is not a file"
        raise NnatlasError(f"spec={os.fspath(path)!s}: the spec file {what} (give a family spec YAML, such as the one "
                           "`nnatlas draft TYPE --out FILE` writes)")
    safe_files.warn_if_others_write(file, "a spec others can change can serve wrong values")
    key = _key(file.resolve(), siblings or [])
    module = _COMPILED.get(key)
    if module is None:
        from nnatlas.compiler import SpecError, UserError  # the one place the runtime reaches the compiler
        from nnatlas.compiler.userspec import compile_spec

        try:
            module = compile_spec(file, siblings)
        except SpecError as e:
            n = len(e.problems)
            raise NnatlasError(f"the spec {file} does not compile ({n} problem{'s' if n != 1 else ''}):\n{e}") from None
        except UserError as e:  # rendered Python that does not parse
            raise NnatlasError(f"the spec {file} does not compile: {e}") from None
        _COMPILED[key] = module
    registry.add_user(module)
    return module


def drafted(model: Any, budget_s: float = 120.0, fits: Callable[[Family], list[str]] | None = None) -> Family:
    """``draft=True``: the drafter's spec for ``model``'s type (from its own config), compiled through the same door as
    a user's spec, then verified on a perturbed tiny twin of its config class (its oracle: the values against what
    transformers returns itself, under each attention load; and every identity of the spec) before it serves; a draft
    whose checks fail is refused, naming them. A verified draft is kept in memory for this process and on disk as data
    (:mod:`nnatlas.loading.draft_cache`: the spec and its verification record, in :func:`draft_cache`), keyed by transformers'
    version, the config (its class and values) and the sources of the drafter and compiler with the specs they read.
    A later load compiles the kept spec as a user's spec is compiled, checks its record against the model, its tree
    against the model (``fits``: the mismatches of a family on this model) and runs its checks again (within
    ``budget_s``); a kept draft that fails any of these is said in one line and drafted again."""
    import transformers

    types = registry.model_types(model.config)
    if not types:
        raise NnatlasError(f"draft=True: {type(model).__name__}'s config has no model_type to draft from")
    config_json = model.config.to_json_string()
    want = draft_cache_data.Record(transformers.__version__, type(model.config).__name__,
                                   hashlib.sha256(config_json.encode()).hexdigest(), _compiler_sha256())
    digest = hashlib.sha256(f"{want.transformers}\0{want.config_class}\0{config_json}\0"
                            f"{want.compiler_sha256}".encode()).hexdigest()
    key = ("draft", digest)
    module = _COMPILED.get(key)
    if module is None:
        with draft_cache_data.turn(draft_cache(), digest, types[0]) as turn:
            module = _kept(turn, key, want, types[0], budget_s, fits)
            if module is None:
                module = _draft_now(types[0], config_json, key, want, budget_s, turn)
    registry.add_user(module, _ORIGINS[key])
    return module.FAMILY  # type: ignore[no-any-return]


def _origin(held: Sequence[str], refused: Sequence[str]) -> str:
    said = f"; refused (served as missing, each saying why): {'; '.join(refused)}" if refused else ""
    return (f"drafted in memory by nnatlas draft, not reviewed; served because its oracle and identities held on a "
            f"perturbed tiny twin: {', '.join(held)}{said}")


def _draft_now(model_type: str, config_json: str, key: tuple[str, str], want: draft_cache_data.Record,
               budget_s: float, turn: draft_cache_data.Turn) -> ModuleType:
    """Draft ``model_type`` from the config, verify it, keep it in memory and (as data) in ``turn``'s folder."""
    import json
    import tempfile

    from nnatlas.compiler import SpecError, UserError  # the one place the runtime reaches the compiler
    from nnatlas.compiler.userspec import DraftFailed, draft_verified

    try:
        with tempfile.TemporaryDirectory(prefix="nnatlas-draft-config-") as tmp:
            Path(tmp, "config.json").write_text(json.dumps(json.loads(config_json)))
            done = draft_verified(model_type, tmp, budget_s)
    except SpecError as e:  # (a host the drafter could not place on a block of this model: the problems say)
        file = keep_draft(model_type, getattr(e, "draft_text", ""))
        raise NnatlasError(f"draft=True: the drafted spec for {model_type} does not fit this model; nothing is served. "
                           f"The draft is in {file}: edit what it could not place, then load with spec={file}:\n{e}"
                           ) from None
    except DraftFailed as e:
        file = keep_draft(model_type, e.text)
        raise NnatlasError(f"draft=True: {e}; nothing is served. The draft is in {file}: edit what did not hold, "
                           f"then load with spec={file}:\n  " + "\n  ".join(e.failed)) from None
    except UserError as e:
        raise NnatlasError(f"draft=True: {e}") from None
    module = done.module
    _COMPILED[key] = module
    _ORIGINS[key] = _origin(done.held, done.refused)
    _TEXTS[module.FAMILY.name] = done.text
    record = dataclasses.replace(want, held=tuple(done.held), refused=tuple(done.refused), verify_s=round(done.verify_s, 3))
    turn.write(draft_cache_data.Kept(module.FAMILY.name, done.text, record))
    return module


def _kept(turn: draft_cache_data.Turn, key: tuple[str, str], want: draft_cache_data.Record, model_type: str,
          budget_s: float, fits: Callable[[Family], list[str]] | None) -> ModuleType | None:
    """The draft ``turn``'s folder keeps for this model, compiled from its spec (data) by this process's compiler and
    checked (its record, its fit, its checks); None, said in one line, when it is not used."""
    from nnatlas.compiler import SpecError, UserError
    from nnatlas.compiler.userspec import checks, compile_text

    path = turn.path
    try:
        raw = turn.read()
    except safe_files.Unsafe as e:
        draft_cache_data.refused(path, str(e), model_type)
        return None
    if raw is None:
        return None
    try:
        kept = draft_cache_data.parse(raw)
    except ValueError as e:
        draft_cache_data.refused(path, str(e), model_type)
        return None
    why = draft_cache_data.mismatch(kept.record, want)
    if why is not None:
        draft_cache_data.refused(path, why, model_type)
        return None
    spec = kept.spec.encode("utf-8", "surrogatepass")
    ckey = ("kept spec", hashlib.sha256(spec).hexdigest())  # compiled once per spec text in this process
    module = _COMPILED.get(ckey)
    if module is None:
        try:
            module = compile_text(spec, f"<the spec kept in {path}>")
        except (SpecError, UserError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            n = len(getattr(e, "problems", [])) or 1
            draft_cache_data.refused(path, f"its spec does not compile ({first}{f'; {n - 1} more' if n > 1 else ''})",
                                     model_type)
            return None
        _COMPILED[ckey] = module
    name = module.FAMILY.name
    if name != kept.family:
        draft_cache_data.refused(path, f"its spec declares family {name!r}, its record {kept.family[:60]!r}", model_type)
        return None
    registry.add_user(module)  # (in the lookup while it is checked, as a draft is)
    try:
        found = fits(module.FAMILY) if fits is not None else []
        held, failed = checks(name, budget_s) if not found else ([], [])
    finally:
        registry.remove_user(name)
    if found:
        draft_cache_data.refused(path, f"its spec does not fit this model ({found[0]}"
                                       f"{f'; {len(found) - 1} more' if len(found) > 1 else ''})", model_type)
        return None
    wrong = [f for f in failed if f[0][1] != "budget"]
    if wrong or not held:
        (what, *_), why = wrong[0] if wrong else (("no check", ""), "none ran")
        why = why.rstrip(":")
        more = f"; {len(wrong) - 1} more" if len(wrong) > 1 else ""
        draft_cache_data.refused(path, f"its checks did not hold again ({what}: {why}{more})", model_type)
        return None
    late = f", {len(failed)} not run within the {budget_s:.0f} s budget" if failed else ""
    origin = _origin(kept.record.held, kept.record.refused) + \
        f" (kept from an earlier load; its {len(held)} checks held again{late})"
    _COMPILED[key] = module
    _ORIGINS[key] = origin
    _TEXTS[name] = kept.spec
    return module


def unfit_draft(model: Any, family: Family, found: Sequence[str]) -> NnatlasError:
    """The error of a draft (drafted on ``model``'s own config, verified) whose spec still does not fit ``model``'s
    module tree (``found``: the mismatches, each naming the host or value and the blocks it is on): the draft written
    to a file to edit, and the one next step, ``spec=FILE``."""
    types = registry.model_types(model.config)
    model_type = types[0] if types else family.name
    file = keep_draft(model_type, _TEXTS.get(family.name, ""))
    n = len(found)
    return NnatlasError(f"draft=True: the drafted spec for {model_type} does not fit {type(model).__name__}; nothing "
                        f"is served. The drafter could not place {n} host{'s' if n != 1 else ''} or "
                        f"value{'s' if n != 1 else ''} on this model's blocks:\n  " + "\n  ".join(found) +
                        f"\nThe draft is in {file}: edit what it could not place, then load with spec={file}")


def keep_draft(model_type: str, text: str) -> Path:
    """Where a draft that cannot serve is written for the user to edit (``<draft cache>/<type>.draft.yaml``, a spec:
    data, never run as it is; written private, 0600 in a 0700 folder); a cache that cannot be written leaves it in
    the system's temporary folder."""
    import tempfile

    for folder in (draft_cache(), Path(tempfile.gettempdir())):
        try:
            safe_files.make_private_dir(folder)
            path = folder / f"{model_type}.draft.yaml"
            safe_files.write_private(path, text.encode("utf-8"))
            return path
        except (OSError, safe_files.Unsafe):
            continue
    return Path(f"{model_type}.draft.yaml")


def draft_cache() -> Path:
    """Where verified drafts are kept: ``$NNATLAS_CACHE/drafts``, else ``$XDG_CACHE_HOME/nnatlas/drafts``, else
    ``~/.cache/nnatlas/drafts``."""
    if os.environ.get("NNATLAS_CACHE"):
        return Path(os.environ["NNATLAS_CACHE"]).expanduser() / "drafts"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "nnatlas" / "drafts"


def _compiler_sha256() -> str:
    """sha256 over the compiler's sources and templates (the drafter's among them) and the specs this nnatlas carries:
    a draft cached by another drafter or compiler is not reused. Located without importing the compiler."""
    import importlib.util

    h = hashlib.sha256()
    found = importlib.util.find_spec("nnatlas.compiler")  # (imports only the parent, nnatlas, already imported)
    compiler = Path((found.submodule_search_locations or [""])[0]) if found is not None else None
    if compiler is None or not compiler.is_dir():
        return ""
    # the specs sit beside the compiler, in a checkout (specs/) as in the wheel (nnatlas/specs)
    for folder in (compiler, compiler.parent / "specs"):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def family_for(spec: str | os.PathLike[str]) -> Family:
    """The family a spec file declares (compiled once per content, and added to the lookup)."""
    return compile_file(spec).FAMILY  # type: ignore[no-any-return]


def from_env(model: Any) -> Family | None:
    """The family of ``model`` from the folder NNATLAS_SPECS names (its ``*.yaml`` files whose ``loads.model_types``
    list the model's type), compiled and added to the lookup; None when the variable is unset or no file lists it."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    where = Path(folder).expanduser()
    if not where.is_dir():
        raise NnatlasError(f"{ENV}={folder}: not a folder (it names a folder of family spec YAML files)")
    files = sorted(p for p in where.glob("*.yaml") if p.is_file())
    if not files:
        return None
    from nnatlas.compiler.userspec import model_types_of  # (only with NNATLAS_SPECS set)

    wanted = registry.model_types(model.config)
    for mt in wanted:
        for f in files:
            if mt in model_types_of(f):
                return compile_file(f, files).FAMILY  # type: ignore[no-any-return]
    return None
