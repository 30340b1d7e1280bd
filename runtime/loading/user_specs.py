"""A user's own spec at load: ``nnatlas.load(path, spec="my_family.yaml")``, ``nnatlas.wrap(model, spec=...)``, and
``NNATLAS_SPECS=dir`` (a folder of spec files consulted for a model type no shipped family covers).

The runtime's one second door to the compiler (beside ``python -m nnatlas``): the spec is compiled with ``nnatlas
generate``'s validation (``nnatlas.compiler.userspec``, imported here only when a user spec is asked for, so ``import
nnatlas`` and every shipped family's wrap and trace load no compiler), its adapter run as a module in memory and
added to the family lookup of this process after the shipped families (``registry.add_user``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import registry
from ..cache.data import CacheError
from ..cache.store import write_json
from ..errors import NnatlasError
from ..spec import Family

ENV = "NNATLAS_SPECS"

_COMPILED: dict[tuple[str, str], ModuleType] = {}  # (resolved path, sha256 of it and its folder's specs) -> adapter
_ORIGINS: dict[tuple[str, str], str] = {}  # a draft's key -> what verified it (support() says it)


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


def drafted(model: Any, budget_s: float = 120.0) -> Family:
    """``draft=True``: the drafter's spec for ``model``'s type (from its own config), compiled through the same door as
    a user's spec, then verified on a perturbed tiny twin of its config class (its oracle: the values against what
    transformers returns itself, under each attention load; and every identity of the spec) before it serves; a draft
    whose checks fail is refused, naming them. A verified adapter is kept in memory for this process and on disk
    (:func:`draft_cache`), keyed by transformers' version, the config (its class and values) and the sources of the
    drafter and compiler with the specs they read: a later load of the same config runs it without the compiler."""
    import json
    import tempfile

    import transformers

    types = registry.model_types(model.config)
    if not types:
        raise NnatlasError(f"draft=True: {type(model).__name__}'s config has no model_type to draft from")
    config_json = model.config.to_json_string()
    digest = hashlib.sha256(f"{transformers.__version__}\0{type(model.config).__name__}\0{config_json}\0"
                            f"{_compiler_sha256()}".encode()).hexdigest()
    key = ("draft", digest)
    module = _COMPILED.get(key) or _from_disk(digest, key)
    if module is None:
        from nnatlas.compiler import SpecError, UserError  # the one place the runtime reaches the compiler
        from nnatlas.compiler.userspec import DraftFailed, draft_verified

        try:
            with tempfile.TemporaryDirectory(prefix="nnatlas-draft-config-") as tmp:
                Path(tmp, "config.json").write_text(json.dumps(json.loads(config_json)))
                done = draft_verified(types[0], tmp, budget_s)
        except SpecError as e:  # (a host the drafter could not place on a block of this model: the problems say)
            file = keep_draft(types[0], getattr(e, "draft_text", ""))
            raise NnatlasError(f"draft=True: the drafted spec for {types[0]} does not fit this model; nothing is served. "
                               f"The draft is in {file}: edit what it could not place, then load with spec={file}:\n{e}"
                               ) from None
        except DraftFailed as e:
            file = keep_draft(types[0], e.text)
            raise NnatlasError(f"draft=True: {e}; nothing is served. The draft is in {file}: edit what did not hold, "
                               f"then load with spec={file}:\n  " + "\n  ".join(e.failed)) from None
        except UserError as e:
            raise NnatlasError(f"draft=True: {e}") from None
        module = done.module
        _COMPILED[key] = module
        refused = (f"; refused (served as missing, each saying why): {'; '.join(done.refused)}" if done.refused else "")
        _ORIGINS[key] = (f"drafted in memory by nnatlas draft, not reviewed; served because its oracle and identities "
                         f"held on a perturbed tiny twin: {', '.join(done.held)}{refused}")
        _to_disk(digest, module, _ORIGINS[key])
    registry.add_user(module, _ORIGINS[key])
    return module.FAMILY  # type: ignore[no-any-return]


def keep_draft(model_type: str, text: str) -> Path:
    """Where a draft that cannot serve is written for the user to edit (``<draft cache>/<type>.draft.yaml``, a spec:
    data, never run as it is); a cache that cannot be written leaves it in the system's temporary folder."""
    import tempfile

    for folder in (draft_cache(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{model_type}.draft.yaml"
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
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


def _from_disk(digest: str, key: tuple[str, str]) -> ModuleType | None:
    import json

    path = draft_cache() / f"{digest}.json"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        module = ModuleType(f"nnatlas.families.{kept['family']}")
        module.__file__ = str(path)
        exec(compile(kept["source"], str(path), "exec"), module.__dict__)  # an adapter this process's compiler wrote
    except (OSError, ValueError, KeyError, TypeError, SyntaxError):
        return None  # none kept (or not readable as one): drafted again
    _COMPILED[key] = module
    _ORIGINS[key] = str(kept.get("origin", "")) + " (kept from an earlier load)"
    return module


def _to_disk(digest: str, module: ModuleType, origin: str) -> None:
    """Keep a verified draft (written whole under a temporary name, then renamed); a cache that cannot be written is
    skipped: the draft still serves."""
    folder = draft_cache()
    kept = {"family": module.FAMILY.name, "origin": origin, "source": module.__dict__["__adapter_source__"]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / f"{digest}.json", kept)
    except (OSError, CacheError):
        return


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
