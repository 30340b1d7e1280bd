"""Helpers the generated adapters call: config lookups and the functions specs may use.

Every name here is whitelisted by ``nnatlas.compiler.expr``; nothing else is reachable from a spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_MISSING = object()


def cfg(config: Any, name: str) -> Any:
    """``config.a.b`` or None when an attribute is missing (so ``head_dim or ...`` falls back)."""
    node = config
    for part in name.split("."):
        node = node.get(part, None) if isinstance(node, Mapping) else getattr(node, part, None)
        if node is None:
            return None
    return node


def cfg_len(x: Any) -> int:
    return len(x)


def cfg_min(a: Any, b: Any) -> Any:
    return min(a, b)


def cfg_max(a: Any, b: Any) -> Any:
    return max(a, b)


def cfg_count(xs: Any, item: Any) -> int:
    return list(xs).count(item)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x)


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.softmax(x.float(), dim).to(x.dtype)


def exp(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x)


def abs(x: torch.Tensor) -> torch.Tensor:  # noqa: A001 - the spec's name
    return torch.abs(x)


def flatten(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    return x.flatten(start)


def unflatten(x: torch.Tensor, dim: int, sizes: Any) -> torch.Tensor:
    return x.unflatten(dim, sizes)


def transpose(x: torch.Tensor, a: int, b: int) -> torch.Tensor:
    return x.transpose(a, b)


def sum(x: torch.Tensor, dim: int) -> torch.Tensor:  # noqa: A001 - the spec's name
    return x.sum(dim)


def shape(x: torch.Tensor) -> list[int]:
    return list(x.shape)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def vnorm(x: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each vector along the last dim (what a rotation leaves unchanged)."""
    return torch.linalg.vector_norm(x.float(), dim=-1)


def config_unavailable(reason: str) -> Any:
    from .errors import Unavailable

    raise Unavailable(reason)


def cat(xs: Any, dim: int) -> torch.Tensor:
    return torch.cat(list(xs), dim)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1)


def masked(pattern: torch.Tensor, values: Mapping[str, Any]) -> torch.Tensor:
    """The entries of a [batch heads query key] pattern that the causal and padding mask hides.

    Rows of padding queries are left out: every key is hidden from them, and the model's
    softmax over a fully masked row is not defined to be zero.
    """
    q, k = pattern.shape[-2], pattern.shape[-1]
    qpos = torch.arange(k - q, k, device=pattern.device)[:, None]
    hidden = (torch.arange(k, device=pattern.device)[None, :] > qpos)[None]  # [1 query key]
    mask = values.get("attention_mask")
    if mask is not None:
        keys_real = mask[:, None, :k] != 0  # [batch 1 key]
        queries_real = mask[:, k - q : k, None] != 0  # [batch query 1]
        hidden = (hidden | ~keys_real) & queries_real
    return pattern.masked_select(hidden[:, None].expand_as(pattern))
