"""Perturbed tiny models: a tiny config's scalar factors drawn away from their defaults, and every
parameter or buffer the init leaves constant drawn at random, so that an identity or a read point
that forgets a factor (a multiplier, a scaling factor, a correction bias, a norm gain) fails on the
tiny model as it would on a released checkpoint, instead of holding by accident at 1 and 0.

The factors are found from the config class, not listed per family (:func:`config_factors`): every
entry of the config, after the class has filled its defaults in, whose value is a float or a list of
floats (or a positive integer named like a factor: ``*scalar``, ``*multiplier``, ``*scale``), except
the entries named like a non-factor (:data:`NOT_FACTORS`: epsilons, dropouts, init
ranges, rope, jitter, auxiliary losses, time-step init ranges, sizes). A spec narrows a factor's range
or pins it, with its reason, under ``tiny.factors``.

The tensors are found by rule (:func:`perturb_tensors`): every floating parameter and persistent
buffer whose elements are all equal (zeros: biases, correction biases, zero-centred norm gains;
ones: norm gains, layer scalars) is redrawn: a zero one from U(-0.5, 0.5), any other constant c as
c times U(0.5, 1.5) (the sign kept: a positive gain stays positive). Non-persistent buffers (rotary
inv_freq, masks, position ids) and integer or boolean tensors are never touched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

# config entries named like these are not factors of the forward: numerical guards, training-only
# settings, init scales, positional settings, sizes (widths as a fraction of another: DeepSeek-V4's top-level
# partial_rotary_factor, xLSTM's qk_dim_factor and ffn_proj_factor, which the config and the layers round apart)
NOT_FACTORS = re.compile(
    r"eps|epsilon|drop|initializer|init_|_init|std$|theta|rope|rotary|jitter|noise|aux_loss|coef|loss|"
    r"time_step_(min|max|floor|limit|scale)|norm_min|variance|dim_multiplier|dim_factor|proj_factor|_size$|layerdrop|"
    r"ratio$")
CAPS = re.compile(r"cap")  # softcaps: drawn small enough that tanh bends on a tiny model's logits
# an integer entry is a factor when named like one (Gemma's query_pre_attn_scalar, Llama 4's floor_scale, MiniMax's
# alpha/beta *_factor, typed int | float = 1)
INT_FACTORS = re.compile(r"scalar|multiplier|scaling|scale$|factor$")


def config_factors(config: Any) -> dict[str, Any]:
    """The scalar factors of a built config: entry -> its value (a float, a list of floats, or a positive
    integer named like a factor)."""
    out: dict[str, Any] = {}
    for name, value in config.to_dict().items():
        if name.startswith("_") or NOT_FACTORS.search(name):
            continue
        if isinstance(value, float) and not isinstance(value, bool):
            out[name] = value
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0 and INT_FACTORS.search(name):
            out[name] = value
        elif isinstance(value, list) and value and all(isinstance(x, float) for x in value):
            out[name] = list(value)
    return out


def _admits_float(config: Any, name: str) -> bool:
    """Whether the config class annotates ``name`` as taking a float (MiniMax's ``int | float = 1`` factors)."""
    for klass in type(config).__mro__:
        annotation = vars(klass).get("__annotations__", {}).get(name)
        if annotation is not None:
            return "float" in str(annotation)
    return False


def _away(value: float, gen: torch.Generator, low: float | None, high: float | None, cap: bool) -> float:
    """One draw away from ``value``: in [low, high] when the spec narrows it; a softcap over 5 in [1, 5]
    (a released cap, 30 or 50, never bends a tiny model's logits); a zero in ±[0.1, 0.5]; else
    value × [0.5, 0.8] or value × [1.25, 2]."""
    u = float(torch.rand((), generator=gen))
    if low is not None and high is not None:
        return float(low + (high - low) * u)
    if cap and value > 5.0:
        return 1.0 + 4.0 * u
    if value == 0.0:
        sign = 1.0 if float(torch.rand((), generator=gen)) < 0.5 else -1.0
        return sign * (0.1 + 0.4 * u)
    scale = 0.5 + 0.3 * u * 2 if u < 0.5 else 1.25 + 0.75 * (u - 0.5) * 2
    return float(value * scale)


def perturb_config(config: Any, seed: int, factors: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Draw every factor of ``config`` away from its value, in place; returns what was drawn.
    ``factors``: the spec's ``tiny.factors``, entry -> {range: [low, high]} or {pin: value, reason: ...}."""
    factors = factors or {}
    gen = torch.Generator().manual_seed(int(seed) + 7919)
    drawn: dict[str, Any] = {}
    for name, value in sorted(config_factors(config).items()):
        rule = factors.get(name) or {}
        if "pin" in rule:
            new: Any = rule["pin"]
        else:
            low, high = (rule.get("range") or (None, None))
            cap = bool(CAPS.search(name))
            new = ([_away(v, gen, low, high, cap) for v in value] if isinstance(value, list)
                   else _away(float(value), gen, low, high, cap))
            if isinstance(value, int) and not isinstance(new, list) and not _admits_float(config, name):
                # an integer factor stays one, moved by >= 1 (one the class types int | float is drawn as a float)
                new = max(1, round(new))
                new = new if new != value else value + 1
        setattr(config, name, new)
        drawn[name] = new
    return drawn


def perturb_params(config: Any, params: Mapping[str, Any], seed: int, factors: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """``params`` (what built ``config``) with every factor of ``config`` drawn away from its value, and of its
    text_config and vision_config where ``params`` give those as mappings (:func:`perturb_config`, seeds apart)."""
    out = {**params, **perturb_config(config, seed, factors)}
    for sub, offset in (("text_config", 1), ("vision_config", 2)):
        inner = config.get_text_config() if sub == "text_config" else getattr(config, sub, None)
        if inner is not None and inner is not config and isinstance(out.get(sub), dict):
            out[sub] = {**out[sub], **perturb_config(inner, seed + offset, factors)}
    return out


def constant_tensors(model: torch.nn.Module) -> tuple[list[tuple[str, torch.Tensor]], list[str]]:
    """(name, tensor) of every floating parameter and persistent buffer whose elements are all equal,
    and the names of the floating buffers left alone (non-persistent: rotary inv_freq, masks ...)."""
    found: list[tuple[str, torch.Tensor]] = []
    skipped: list[str] = []
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        own = [(n, p) for n, p in module._parameters.items() if p is not None]
        persistent = [(n, b) for n, b in module._buffers.items()
                      if b is not None and n not in module._non_persistent_buffers_set]
        for n, b in module._buffers.items():
            if b is not None and n in module._non_persistent_buffers_set and b.is_floating_point():
                skipped.append(f"{mod_name}.{n}" if mod_name else n)
        for n, t in own + persistent:
            if id(t) in seen or not t.is_floating_point() or t.numel() == 0 or t.device.type == "meta":
                continue
            seen.add(id(t))
            flat = t.detach().reshape(-1)
            if bool((flat == flat[0]).all()) and bool(torch.isfinite(flat[0])):
                found.append((f"{mod_name}.{n}" if mod_name else n, t))
    return found, skipped


def perturb_tensors(model: torch.nn.Module, seed: int) -> list[str]:
    """Redraw every constant parameter and persistent buffer of ``model`` in place; their names."""
    gen = torch.Generator().manual_seed(int(seed) + 104729)
    names = []
    found, _ = constant_tensors(model)
    with torch.no_grad():
        for name, t in found:
            c = float(t.reshape(-1)[0])
            u = torch.rand(t.shape, generator=gen, dtype=torch.float32)
            new = (u - 0.5) if c == 0.0 else c * (0.5 + u)
            t.copy_(new.to(t.dtype))
            names.append(name)
    return names
