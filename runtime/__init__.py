"""nnatlas: read and edit what happens inside transformers models, under one set of names.

    import nnatlas
    model = nnatlas.wrap(hf_model, tokenizer=tok)      # or nnatlas.load("path/or/name")
    with model.trace("The Eiffel Tower is in the city of"):
        out = model.layers[1].layer_output.save()
        model.layers[0].mlp.mlp_output[:] = 0
"""

from .errors import NnatlasError, NotReached, OutOfOrderError, SpecError, Unavailable, UnknownName
from .model import AtlasModel, load, route_kernels, wrap
from .registry import all_families
from .trace import Box

__all__ = ["AtlasModel", "Box", "NnatlasError", "NotReached", "OutOfOrderError", "SpecError", "Unavailable",
           "UnknownName", "all_families", "load", "route_kernels", "wrap"]
