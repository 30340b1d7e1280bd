"""nnatlas: read and edit what happens inside transformers models, under one set of names.

    import nnatlas
    model = nnatlas.wrap(hf_model, tokenizer=tok)      # or nnatlas.load("path/or/name")
    with model.trace("The Eiffel Tower is in the city of"):
        out = model.layers[1].layer_output.save()
        model.layers[0].mlp.mlp_output[:] = 0

The names that need torch are imported on first use, so ``nnatlas.compiler`` (and
``nnatlas generate --check``) starts without importing torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import InputError, NnatlasError, NotReached, OutOfOrderError, Unavailable, UnknownName

if TYPE_CHECKING:
    from .cache.data import CacheError
    from .cache.model_cache import Cache
    from .loading.load import load, route_kernels, wrap
    from .model import AtlasModel
    from .registry import all_families
    from .trace.requests import Box

_LAZY = {"AtlasModel": "model", "load": "loading.load", "wrap": "loading.load", "route_kernels": "loading.load",
         "all_families": "registry", "Box": "trace.requests", "Cache": "cache.model_cache",
         "CacheError": "cache.data"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nnatlas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["AtlasModel", "Box", "Cache", "CacheError", "InputError", "NnatlasError", "NotReached", "OutOfOrderError", "Unavailable",
           "UnknownName", "all_families", "load", "route_kernels", "wrap"]
