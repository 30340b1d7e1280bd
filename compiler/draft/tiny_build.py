"""The tiny model built from a plan: its factors perturbed as the generated tests draw them, its forward's inputs,
and the other sizes to try when the first ones' forward fails."""

from __future__ import annotations

from typing import Any

from .tiny_config import DraftError, Tiny


def takes_mask(model: Any) -> bool:
    """Whether the model's forward takes an attention_mask: a parameter of its own, or through ``**kwargs`` as
    transformers' keywords (as nnatlas's inputs check reads the signature)."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    if "attention_mask" in params:
        return True
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return False
    try:
        from transformers.utils.generic import TransformersKwargs
    except ImportError:  # pragma: no cover (another transformers): as nnatlas's inputs check, taken
        return True
    return "attention_mask" in TransformersKwargs.__annotations__


def alternatives(tiny: Tiny) -> list[tuple[Tiny, str]]:
    """Other tiny sizes, each with the spec's note on it, for a model whose forward fails at the first ones: a relation
    the model needs that the config does not check. Fewer key/value heads than query heads (MiMo-V2-Flash doubles the
    key/value heads of its sliding blocks: with as many as the query heads, a head group is empty); wider heads (xLSTM
    rounds its config's widths up to a multiple of 64, as its cache is sized, where its layers do not round)."""
    import copy

    tries = []
    if tiny.draw.get("_groups") == [1, 2]:
        tries.append(({"_groups": [2]}, "_groups: [2]: two query heads or more per key/value head"))
    if tiny.draw.get("_head_dim") in ([8, 16], [16, 8]):
        tries.append(({"_head_dim": [64]}, "_head_dim: [64]: heads as wide as the model rounds its widths"))
    if len(tries) > 1:
        tries.append(({k: v for t, _ in tries for k, v in t.items()}, "; ".join(why for _, why in tries)))
    out = []
    for draws, why in tries:
        other = copy.deepcopy(tiny)
        other.draw.update(draws)
        out.append((other, why))
    return out


def perturbed(tiny: Tiny, params: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """``params`` with every scalar factor of the config (and of its text config) drawn away from its default, as
    the generated tests and a draft's verification draw them (``nnatlas.testing.perturb``): an identity or a read
    point that holds only at a factor's default (a multiplier of 1, a scale of 0) is then not proposed."""
    import copy

    import transformers

    from nnatlas.testing import perturb_params

    try:
        config = getattr(transformers, tiny.config_class)(**copy.deepcopy(params))
    except Exception as e:  # noqa: BLE001 - the build says so, with the config
        raise DraftError(f"{tiny.model_class} does not build from the tiny config {params}: {type(e).__name__}: {e}") from e
    return perturb_params(config, params, seed)


def build(tiny: Tiny, params: dict[str, Any] | None = None, attn_implementation: str = "eager", seed: int = 0,
          perturb: bool = False) -> Any:
    """The tiny model, float32, eval mode (raises DraftError when it does not build); ``perturb``: its constant
    weights (biases, norm gains, layer scalars) drawn at random (``nnatlas.testing.perturb_tensors``)."""
    import torch
    import transformers

    params = tiny.first() if params is None else params
    try:
        config = getattr(transformers, tiny.config_class)(**params)
        config._attn_implementation = attn_implementation
        for sub in ("text_config",):
            if getattr(config, sub, None) is not None:
                getattr(config, sub)._attn_implementation = attn_implementation
        torch.manual_seed(seed)
        model = getattr(transformers, tiny.model_class)(config).float().eval()
        if perturb:
            from nnatlas.testing import perturb_tensors

            perturb_tensors(model, seed)
    except Exception as e:  # noqa: BLE001 - any failure here means: this type does not build tiny
        raise DraftError(f"{tiny.model_class} does not build from the tiny config {params}: "
                         f"{type(e).__name__}: {e}") from e
    return model
