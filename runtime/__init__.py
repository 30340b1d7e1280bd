"""nnatlas: read and edit what happens inside transformers models, under one set of names.

    import nnatlas
    model = nnatlas.wrap(hf_model, tokenizer=tok)      # or nnatlas.load("path/or/name")
    with model.trace("The Eiffel Tower is in the city of"):
        out = model.layers[1].layer_output.save()
        model.layers[0].mlp.mlp_output[:] = 0
"""

from typing import TYPE_CHECKING, Any

from .errors import NnatlasError, NotReached, OutOfOrderError, SpecError, Unavailable, UnknownName
from .registry import all_families

if TYPE_CHECKING:
    from .model import AtlasModel, load, wrap
    from .trace import Box

# torch loads on first use, so `nnatlas generate` (nnatlas.compiler) starts without it
_LAZY = {"AtlasModel": "model", "load": "model", "wrap": "model", "Box": "trace"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'nnatlas' has no attribute '{name}'")


__all__ = ["AtlasModel", "Box", "NnatlasError", "NotReached", "OutOfOrderError", "SpecError", "Unavailable",
           "UnknownName", "all_families", "load", "wrap"]
