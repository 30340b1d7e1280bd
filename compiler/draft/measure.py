"""The numbers and names the matcher reads a recording by (the patterns of module classes, the config lists of
block kinds): the tensor of a call's output, a block's hidden input, how far
two tensors are apart and the tolerance an identity is proposed at (one that held on the recorded tensors)."""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from .proposal import Identity
from .recorder import ModuleCall

# ---- tensors --------------------------------------------------------------------------------


def tensor_of(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def hidden_in(call: ModuleCall) -> torch.Tensor | None:
    if call.args and isinstance(call.args[0], torch.Tensor):
        return call.args[0]
    for key in ("hidden_states", "x", "input", "hidden_state"):
        if isinstance(call.kwargs.get(key), torch.Tensor):
            return call.kwargs[key]  # type: ignore[no-any-return]
    return next((v for v in call.kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def err(a: Any, b: Any) -> float | None:
    """The largest absolute difference, or None when the shapes (or types) differ."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return None
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool or not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    return float((a.double() - b.double()).abs().nan_to_num(0.0).max())


def tolerance(e: float | None, scale: float = 1e-4) -> float | None:
    """The atol an identity with error ``e`` is written with (None: it did not hold)."""
    if e is None or e > scale:
        return None
    if e == 0:
        return 0.0
    return float(f"1e{math.ceil(math.log10(e)) + 1}")


def holds(a: Any, b: Any, scale: float = 1e-4) -> float | None:
    """``a`` (or what the callable ``a`` computes) equals ``b`` within ``scale``: the atol to write."""
    if callable(a):
        try:
            a = a()
        except (RuntimeError, TypeError, ValueError):  # shapes that do not combine: it did not hold
            return None
    return tolerance(err(a, b), scale)


def ident(check: str, atol: float | None, sure: str) -> Identity:
    return Identity(check, float(atol or 0.0), 0.0, sure)


# ---- names ----------------------------------------------------------------------------------

NORM = re.compile(r"norm", re.I)
MLP = re.compile(r"mlp|moe|sparse|feedforward|ffn|expert|feed_forward", re.I)
SSM = re.compile(r"mixer|mamba|ssm", re.I)
ACT_CLASSES = re.compile(r"activation|gelu|silu|relu|tanh|sigmoid|swish|quickgelu|mish", re.I)
LAYER_TYPES = ("layer_types", "layers_block_type", "block_types", "layers_block_types", "layer_block_types")
KIND_LISTS = ("mlp_layer_types", "mlp_types", "ffn_layer_types")  # per-block lists of MLP kinds
DENSE_FIRST = ("first_k_dense_replace", "num_dense_layers", "first_dense_layers", "moe_layer_start_index",
               "n_dense_layers")
ACT_OPS = ("silu", "gelu", "relu", "tanh", "sigmoid", "gelu_new", "relu2", "mish", "softplus")
