"""``model.value(sae)``: the value a sparse autoencoder reads, found by its own hook name and checked against it.

An SAE as sae-lens holds it (``pip install 'nnatlas[sae]'``) names its hook point after TransformerLens in
``sae.cfg.metadata.hook_name`` (``blocks.3.hook_resid_post``) and reads ``d_in`` features there. The name resolves
as any TransformerLens name does (``model.value``); then the SAE must be able to run on the value inside a trace:
its input width must be the value's last size, and it must not reshape its input itself (sae-lens's ``hook_z``
reshaping runs einops, which needs a real tensor; a value inside the body is still a deferred expression). Each
refusal is one line naming the hook and why. Nothing here imports sae-lens: any object with that ``cfg`` works.
"""

from __future__ import annotations

from typing import Any

from ..errors import NnatlasError, Unavailable, UnknownName


def hook_name(sae: Any) -> str:
    """The SAE's hook name (sae-lens 6: ``cfg.metadata.hook_name``; before it: ``cfg.hook_name``)."""
    cfg = getattr(sae, "cfg", None)
    metadata = getattr(cfg, "metadata", None)
    name = getattr(metadata, "hook_name", None) or getattr(cfg, "hook_name", None)
    if not isinstance(name, str) or not name:
        raise UnknownName(f"model.value: {type(sae).__name__} has no hook name (an SAE names it in "
                          "cfg.metadata.hook_name, as sae-lens does); pass the name instead")
    return name


def value(model: Any, sae: Any) -> Any:
    """The value ``sae`` reads on ``model`` (``model.value(sae)``), once it fits the SAE; else one line saying why."""
    name = hook_name(sae)
    try:
        found = model.value(name)
    except NnatlasError as e:  # no standard value there on this family (UnknownName, Unavailable)
        why = str(e).splitlines()[0]
        raise UnknownName(f"{name}: the hook this SAE reads has no standard value on {model.family}: {why}") from None
    return _checked(model, sae, name, found)


def _checked(model: Any, sae: Any, name: str, value: Any) -> Any:
    cfg = sae.cfg
    reshape = getattr(cfg, "reshape_activations", "none")
    spec = value._spec
    if reshape not in (None, "none"):
        dims = " ".join(spec.layout.dims) if spec is not None else "its layout"
        raise UnknownName(
            f"{name}: this SAE reshapes its input itself (reshape_activations={reshape!r}: [... num_heads head_dim] "
            f"-> [... num_heads*head_dim] with einops), which cannot run on a value inside a trace; {value.label} is "
            f"[{dims}]: build the SAE with reshape_activations='none' and give it model.value(name).flatten(-2)")
    d_in = getattr(cfg, "d_in", None)
    if spec is not None and spec.layout.dims and isinstance(d_in, int):
        last = spec.layout.dims[-1]
        try:
            width = model.config_value(last)
        except (KeyError, Unavailable):  # a size this load cannot give: nothing to check against
            width = None
        if isinstance(width, int) and width != d_in:
            raise UnknownName(f"{name}: this SAE reads d_in={d_in} features, but {value.label} "
                              f"({spec.layout.text}) has {last}={width} on this model: an SAE of another model "
                              "or another hook point")
    return value
