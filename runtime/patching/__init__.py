"""Activation patching and attribution patching, each as one call.

    from nnatlas import patching
    answer = ...
    metric = lambda logits: logits[:, -1].log_softmax(-1)[:, answer]
    effect = patching.sweep(model, clean, corrupt, value="layer_output", metric=metric)   # [layers, positions]
    estimate = patching.attribute(model, clean, corrupt, value="layer_output", metric=metric)

``sweep`` runs the patched forwards themselves (blocks before the patch skipped, many patches per forward);
``attribute`` estimates the same table from one forward and one backward (see each).

May import: the model facade (``nnatlas.model``) and every room below it; not the loaders or the CLI.
"""

from __future__ import annotations

from .activation import SweepFallback, loop, recorded, sweep
from .attribution import attribute

__all__ = ["SweepFallback", "attribute", "loop", "recorded", "sweep"]
