"""nnatlas: read and edit what happens inside transformers models, under one set of names.

    import nnatlas
    model = nnatlas.wrap(hf_model, tokenizer=tok)      # or nnatlas.load("path/or/name")
    with model.trace("The Eiffel Tower is in the city of"):
        out = model.layers[1].layer_output.save()
        model.layers[0].mlp.mlp_output[:] = 0

The names that need torch are imported on first use, so ``nnatlas.compiler`` (and
``nnatlas generate --check``) starts without importing torch or transformers; so are the submodules
``nnatlas.plot`` and ``nnatlas.show`` (pictures and notebook views) and ``nnatlas.testing``. ``dir(nnatlas)``
lists this API and nothing else.
"""

import importlib as _importlib
import typing as _typing

from .errors import InputError, NnatlasError, NotReached, OutOfOrderError, Unavailable, UnknownName

if _typing.TYPE_CHECKING:
    from .cache import Cache
    from .cache_data import CacheError
    from .loading import load, route_kernels, wrap
    from .model import AtlasModel
    from .registry import all_families
    from .requests import Box
    from .saving import save

_LAZY = {"AtlasModel": "model", "load": "loading", "wrap": "loading", "route_kernels": "loading",
         "all_families": "registry", "Box": "requests", "Cache": "cache",
         "CacheError": "cache_data", "save": "saving"}
_SUBMODULES = ("plot", "show", "testing")  # imported when first named


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return _importlib.import_module(f".{name}", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nnatlas' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *_SUBMODULES})


__all__ = ["AtlasModel", "Box", "Cache", "CacheError", "InputError", "NnatlasError", "NotReached", "OutOfOrderError", "Unavailable",
           "UnknownName", "all_families", "load", "route_kernels", "save", "wrap"]
