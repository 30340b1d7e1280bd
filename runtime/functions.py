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


def cfg_int(x: Any) -> int:
    return int(x)


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


def tokens(x: torch.Tensor) -> torch.Tensor:
    """[batch, seq, ...] → [batch * seq, ...]: the flattened tokens a mixture of experts works on."""
    return x.flatten(0, 1)


def topk_weights(probs: torch.Tensor, k: int, normalize: Any) -> torch.Tensor:
    """The ``k`` largest probabilities of each row, divided by their sum when ``normalize``."""
    top = torch.topk(probs, int(k), dim=-1).values
    return top / top.sum(-1, keepdim=True) if normalize else top


def topk_indices(probs: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest entries of each row, largest first."""
    return torch.topk(probs, int(k), dim=-1).indices


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


def chunk(x: torch.Tensor, chunks: int, dim: int) -> tuple[torch.Tensor, ...]:
    return torch.chunk(x, chunks, dim)


def delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time, written out here (not transformers' kernel).

    ``q``, ``k`` [batch seq key_heads key_dim], ``v`` [batch seq heads value_dim], ``g`` (log decay)
    and ``beta`` [batch seq heads], ``state`` [batch heads key_dim value_dim] or None. As the kernel
    does: query and key heads are repeated up to the value heads, l2-normed (eps 1e-6 under the
    root) and the queries scaled by 1/sqrt(key_dim). For each token t and head:
    S = exp(g_t) S;  S += k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t.
    Returns (outputs [batch seq heads value_dim], the final state), in float32.
    """
    q, k, v, g, beta, state = (getattr(x, "value", x) if not isinstance(x, torch.Tensor) else x
                               for x in (q, k, v, g, beta, state))
    heads = v.shape[2]
    if q.shape[2] != heads:
        q = q.repeat_interleave(heads // q.shape[2], dim=2)
        k = k.repeat_interleave(heads // k.shape[2], dim=2)
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / q.shape[-1] ** 0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    b, seq, _, dk = k.shape
    s = torch.zeros(b, heads, dk, v.shape[-1], dtype=torch.float64) if state is None else state.double().clone()
    out = torch.zeros_like(v)
    for t in range(seq):
        s = s * g[:, t].exp()[..., None, None]
        kt, vt = k[:, t], v[:, t]  # [b h dk], [b h dv]
        recalled = torch.einsum("bhkv,bhk->bhv", s, kt)
        s = s + torch.einsum("bhk,bhv->bhkv", kt, (vt - recalled) * beta[:, t, :, None])
        out[:, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, t])
    return out.float(), s.float()
