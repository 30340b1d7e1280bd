"""What each condition a spec may name means: the one place that decides them.

A value may need a load (``needs:``, kind ``load``: eager attention, the image-text processor, the
token-by-token kernels) or be reached only on some calls (``reached:``, kind ``call``: a call with
images, a call that keeps a cache). The vocabulary (``specs/_vocabulary.yaml``) words each condition
for people; this module decides it. A load condition may instead name a config ``attribute`` and the
``values`` that serve it (decided from the config alone), or be ``never`` met: those need no entry
here. The compiler refuses a vocabulary condition that is none of these, so no spec can name a
condition the runtime cannot decide. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import NnatlasError
from ..spec import Condition

LOAD = ("eager", "processor", "torch_kernels")  # decided by how the model was loaded
CALL = ("images", "cached")  # decided by the inputs of one call, before its forward


def decided_here(name: str, kind: str) -> bool:
    """Whether this module decides a condition ``name`` of ``kind`` (load or call)."""
    return name in (LOAD if kind == "load" else CALL)


def load_met(condition: Condition, config: Any, processor: Any, kernels: str | None) -> bool:
    """Whether a load serves a value that needs ``condition``: ``config`` is the config of the module the
    value is read in (else the model's), ``processor`` the load's processor, ``kernels`` its kernel route."""
    if condition.attribute:
        return getattr(config, condition.attribute, None) in condition.values
    if condition.never:
        return False
    if condition.name == "eager":
        return getattr(config, "_attn_implementation", None) == "eager"
    if condition.name == "processor":
        return processor is not None and getattr(processor, "image_processor", None) is not None
    if condition.name == "torch_kernels":
        return kernels == "torch"
    raise NnatlasError(f"unknown load condition '{condition.name}'")


def call_met(name: str, inputs: Mapping[str, Any]) -> bool:
    """Whether one call's inputs reach a value with call condition ``name``."""
    if name == "images":
        return inputs.get("pixel_values") is not None
    if name == "cached":  # a recurrent mixer returns its final state only on a call that keeps a cache
        return inputs.get("use_cache") is not False
    raise NnatlasError(f"unknown call condition '{name}'")


def under(condition: Condition, config: Any, attn_config: Any, model_class: str, processor: Any) -> str:
    """How this load stands on ``condition``, for the message of a value it makes Unavailable."""
    if condition.attribute:
        return f"under this load ({condition.attribute.lstrip('_')}={getattr(config, condition.attribute, None)!r})"
    if condition.name == "eager":
        return f"under this load (attn_implementation={getattr(attn_config, '_attn_implementation', None)!r})"
    if condition.name == "processor":
        proc = type(processor).__name__ if processor is not None else None
        return f"under this load ({model_class}, processor={proc})"
    return "here"
