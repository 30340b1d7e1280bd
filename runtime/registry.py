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


@cache
def all_families() -> dict[str, Family]:
    from nnatlas.families import FAMILIES

    names = [*_FIRST, *(n for n in FAMILIES if n not in _FIRST)]
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


def pick(model: Any) -> Family:
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
    known = sorted(t for f in fams.values() for t in f.model_types)
    raise NnatlasError(f"no family for model_type {model_types(config)} ({cls}); nnatlas knows {', '.join(known)}")
