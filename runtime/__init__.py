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
    from .cache.data import CacheError
    from .cache.model_cache import Cache
    from .loading.load import load, route_kernels, wrap
    from .model import AtlasModel
    from .registry import all_families
    from .trace.requests import Box

_LAZY = {"AtlasModel": "model", "load": "loading.load", "wrap": "loading.load", "route_kernels": "loading.load",
         "all_families": "registry", "Box": "trace.requests", "Cache": "cache.model_cache",
         "CacheError": "cache.data"}
_SUBMODULES = {"plot": "views.plot", "show": "views.show", "testing": "testing"}  # imported when first named


def save(obj: _typing.Any) -> _typing.Any:
    """Keep a tensor computed in a trace's body from values (or a tuple, list or dict of them, the same container
    back): the real tensor after the ``with`` block, as ``.save()`` on a value or an expression gives.

        with model.trace(prompt):
            x = model.layers[1].layer_output
            feats, err = nnatlas.save((sae.encode(x), (sae.decode(sae.encode(x)) - x).norm(dim=-1)))
    """
    # defined here, not served by __getattr__ as the other names are: nnsight, imported beside nnatlas, puts a
    # ``save`` on every object (object.save), which a module's lookup finds before it asks __getattr__
    return _importlib.import_module(".tree.saving", __name__).save(obj)


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return _importlib.import_module(f".{_SUBMODULES[name]}", __name__)
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
