"""The generated family adapters, and which one a model loads as."""

from __future__ import annotations

import importlib
import sys
from functools import cache
from types import ModuleType
from typing import Any

from .errors import NnatlasError
from .spec import Family

_FIRST: list[str] = []  # families put before the generated ones in this process (put_first), newest first
_LAST: list[str] = []  # user families (a spec given at load, NNATLAS_SPECS), after the generated ones (add_user)
_ORIGIN: dict[str, str] = {}  # user family -> where it comes from, as support() says it


@cache
def all_families() -> dict[str, Family]:
    from nnatlas.families import FAMILIES

    names = [*_FIRST, *(n for n in FAMILIES if n not in _FIRST), *(n for n in _LAST if n not in _FIRST)]
    return {name: importlib.import_module(f"nnatlas.families.{name}").FAMILY for name in names}


def put_first(module: ModuleType) -> None:
    """Make ``module``, an adapter written elsewhere (the drafter's, before it is committed), the family
    ``nnatlas.families.<its FAMILY.name>`` of this process, picked before every other family: a generated
    family of the same model type does not win over it."""
    import nnatlas.families as families

    name = module.FAMILY.name
    sys.modules[f"nnatlas.families.{name}"] = module
    setattr(families, name, module)
    if name in _FIRST:
        _FIRST.remove(name)
    _FIRST.insert(0, name)
    all_families.cache_clear()


def add_user(module: ModuleType, origin: str = "") -> None:
    """Make ``module``, an adapter compiled from a user's spec (``nnatlas.loading.user_specs``), the family
    ``nnatlas.families.<its FAMILY.name>`` of this process, picked after every shipped family: a model whose type a
    shipped family lists still loads as that one. Adding a family of the same name again replaces it. ``origin``:
    where it comes from (your spec file, a draft and what verified it), as ``support()`` says it."""
    import nnatlas.families as families

    name = module.FAMILY.name
    _ORIGIN[name] = origin or f"your spec {module.FAMILY.spec_file}"
    sys.modules[f"nnatlas.families.{name}"] = module
    setattr(families, name, module)
    if name not in _LAST:
        _LAST.append(name)
    all_families.cache_clear()


def remove_user(name: str) -> None:
    """Take the user family ``name`` (:func:`add_user`) out of the lookup again."""
    import nnatlas.families as families

    _ORIGIN.pop(name, None)
    if name in _LAST:
        _LAST.remove(name)
        sys.modules.pop(f"nnatlas.families.{name}", None)
        if hasattr(families, name):
            delattr(families, name)
        all_families.cache_clear()


def origin(family: Family) -> str:
    """Where a user family comes from (``add_user``); "" for a shipped family."""
    return _ORIGIN.get(family.name, "") if family.name in _LAST else ""


def model_class(family: Family) -> type[Any] | None:
    """The generated class a model of ``family`` is wrapped as (``nnatlas.families.<name>.Model``), or
    None for a family built elsewhere (an adapter the compiler runs before writing it)."""
    try:
        module = importlib.import_module(f"nnatlas.families.{family.name}")
    except ImportError:
        return None
    cls = getattr(module, "Model", None)
    return cls if getattr(module, "FAMILY", None) is family and isinstance(cls, type) else None


def get(name: str) -> Family:
    fams = all_families()
    if name not in fams:
        raise NnatlasError(f"no family '{name}'; families: {', '.join(sorted(fams))}")
    return fams[name]


def model_types(config: Any) -> list[str]:
    """The text config's model_type first (a multimodal wrapper is picked by its text model)."""
    types = []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for cfg in (text, config):
        mt = getattr(cfg, "model_type", None)
        if mt and mt not in types:
            types.append(mt)
    return types


def find(model: Any) -> Family | None:
    """The family ``model`` loads as (by its config's model_type, then its class name), or None."""
    config = getattr(model, "config", None)
    if config is None:
        raise NnatlasError(f"{type(model).__name__} has no config; pass family= to nnatlas.wrap")
    fams = all_families()
    # a wrapper whose own model_type a family lists loads as that family (LLaVA's text model is a
    # plain llama, whose family has no vision encoder); any other by its text model first
    own = getattr(config, "model_type", None)
    listed = any(own in fam.model_types for fam in fams.values())
    for mt in ([own] if listed else []) + model_types(config):
        for fam in fams.values():
            if mt in fam.model_types:
                return fam
    cls = type(model).__name__
    for fam in fams.values():
        if cls in fam.classes:
            return fam
    return None


def no_family(model: Any) -> NnatlasError:
    """The error for a model no family (shipped or the user's) covers: the two routes to one, then what is known."""
    types = model_types(model.config)
    first = types[0] if types else "MODEL_TYPE"
    known = sorted(t for f in all_families().values() for t in f.model_types)
    return NnatlasError(
        f"no family for model_type {types} ({type(model).__name__}). Draft a spec for it and load with it: "
        f"`nnatlas.load(path, draft=True)` (or `nnatlas.wrap(model, draft=True)`: drafted in memory and verified "
        f"against transformers on a tiny twin before it serves), or `nnatlas draft {first} --out {first}.yaml`, "
        f"review it, then `nnatlas.load(path, spec='{first}.yaml')` (or `nnatlas.wrap(model, spec='{first}.yaml')`; "
        "or put the file in a folder named by NNATLAS_SPECS). "
        f"nnatlas knows {', '.join(known)}")


def pick(model: Any) -> Family:
    found = find(model)
    if found is None:
        raise no_family(model)
    return found
