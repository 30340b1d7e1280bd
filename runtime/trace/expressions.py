"""Helpers the generated adapters call: config lookups and the functions specs may use.

Each implements an entry of the one whitelist, ``nnatlas.spec.FUNCTIONS`` (``cfg_NAME`` one of
``CONFIG_FUNCTIONS``); nothing else is reachable from a spec, and importing this module fails when an
entry has no implementation here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import Unavailable
from ..spec import CONFIG_FUNCTIONS, FUNCTIONS

_MISSING = object()


def cfg(config: Any, name: str) -> Any:
    """``config.a.b`` (``config.a[0].b``: an item of a sequence; ``config.a['word'].b``: a key) or None when an
    attribute is missing (so ``head_dim or ...`` falls back)."""
    node = config
    for part in name.split("."):
        key, _, rest = part.partition("[")
        node = node.get(key, None) if isinstance(node, Mapping) else getattr(node, key, None)
        for index in rest.rstrip("]").split("][") if rest else ():
            if node is None:
                return None
            node = node[index.strip("'")] if index.startswith("'") else node[int(index)]
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


def tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate=approximate)


def softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


def log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x)


def cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cumsum(x, dim)


def einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    return torch.einsum(equation, *operands)


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


def last_token(x: torch.Tensor, attention_mask: Any) -> torch.Tensor:
    """``x[:, i]`` at each row's last real token ``i`` (the last position whose mask is not zero), whichever
    side the padding is on; ``x[:, -1]`` without a mask, or with one of another length (a generation step's
    logits hold the new token only). A row with no real token gives its last position."""
    mask = getattr(attention_mask, "value", attention_mask)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.shape[1] != x.shape[1] or mask.shape[0] != x.shape[0]:
        return x[:, -1]
    real = (mask != 0).to(x.device)
    last = real.shape[1] - 1 - real.flip(1).int().argmax(1)  # [batch] (argmax: the first maximum)
    return x[torch.arange(x.shape[0], device=x.device), last]


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def vnorm(x: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each vector along the last dim (what a rotation leaves unchanged)."""
    return torch.linalg.vector_norm(x.float(), dim=-1)


def config_unavailable(reason: str) -> Any:
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


def grouped_topk_indices(choice: torch.Tensor, k: int, groups: int, topk_groups: int, best: int = 2) -> torch.Tensor:
    """The indices of the ``k`` largest entries of each row of ``choice``, taken only among the
    ``topk_groups`` best of its ``groups`` equal groups of columns (a group scores the sum of its ``best``
    largest entries: 2 in DeepSeek-V3's group-limited routing, 1, its largest, in DeepSeek-V2's), largest first."""
    groups, topk_groups = int(groups), int(topk_groups)
    rows = choice.reshape(-1, choice.shape[-1])
    n = rows.shape[-1]
    per_group = rows.view(-1, groups, n // groups)
    group_scores = per_group.topk(min(int(best), n // groups), dim=-1).values.sum(-1)
    kept = group_scores.topk(topk_groups, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
    keep = keep.unsqueeze(-1).expand(-1, groups, n // groups).reshape(-1, n)
    picked = rows.masked_fill(~keep, float("-inf")).topk(int(k), dim=-1).indices
    return picked.reshape(*choice.shape[:-1], int(k))


def chosen_weights(probs: torch.Tensor, indices: torch.Tensor, normalize: Any) -> torch.Tensor:
    """The entries of ``probs`` at ``indices`` (along the last dim), divided by their sum when ``normalize``."""
    picked = torch.gather(probs, -1, indices.to(torch.long))
    return picked / picked.sum(-1, keepdim=True) if normalize else picked


def masked(pattern: torch.Tensor, values: Mapping[str, Any], window: Any = None, chunk: Any = None,
           sinks: Any = 0) -> torch.Tensor:
    """The entries of a [batch heads query key] pattern that the model's attention mask hides.

    Causal and padding always (transformers' ``causal_mask_function`` and ``padding_mask_function``);
    ``window``: also the keys ``window`` or more positions behind the query (``sliding_window_overlay``:
    key > query - window is kept); ``chunk``: also the keys outside the query's chunk, chunks counted
    from each row's first real token (``chunked_overlay`` with the left padding); ``sinks``: the last
    ``sinks`` columns of the pattern are attention sinks (gpt-oss's softmax input/output before the
    sink is dropped), never hidden. Queries are the last ``query`` of the ``key`` positions.
    Rows of padding queries are left out: every key is hidden from them, and the model's softmax
    over a fully masked row is not defined to be zero.
    """
    sinks = int(sinks or 0)
    q, k = pattern.shape[-2], pattern.shape[-1] - sinks
    device = pattern.device
    qpos = torch.arange(k - q, k, device=device)[:, None]  # [query 1]
    kpos = torch.arange(k, device=device)[None, :]  # [1 key]
    hidden = (kpos > qpos)[None]  # [1 query key]
    if window is not None:
        hidden = hidden | (kpos <= qpos - int(window))[None]
    mask = values.get("attention_mask")
    if chunk is not None:
        if mask is not None:  # left padding per row: the leading zeros of the attention mask
            left = (mask.cumsum(-1) == 0).sum(-1).to(device)[:, None, None]
        else:
            left = torch.zeros(1, 1, 1, dtype=torch.long, device=device)
        size = int(chunk)
        hidden = hidden | ((kpos[None] - left) // size != (qpos[None] - left) // size)
    if mask is not None:
        keys_real = mask[:, None, :k] != 0  # [batch 1 key]
        queries_real = mask[:, k - q : k, None] != 0  # [batch query 1]
        hidden = (hidden | ~keys_real) & queries_real
    if sinks:
        hidden = torch.cat([hidden, hidden.new_zeros(*hidden.shape[:-1], sinks)], -1)
    return pattern.masked_select(hidden[:, None].expand_as(pattern))


def chunk(x: torch.Tensor, chunks: int, dim: int) -> tuple[torch.Tensor, ...]:
    return torch.chunk(x, chunks, dim)


def delta_rule(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time, written out here (not transformers' kernel).

    ``q``, ``k`` [batch seq key_heads key_dim], ``v`` [batch seq heads value_dim], ``g`` (log decay)
    [batch seq heads], or [batch seq heads key_dim] for a decay per key channel (Kimi Delta
    Attention: each row of the state decays at its own rate), ``beta`` [batch seq heads], ``state``
    [batch heads key_dim value_dim] or None. As the kernel does: query and key heads are repeated up
    to the value heads, l2-normed (eps 1e-6 under the root) and the queries scaled by 1/sqrt(key_dim).
    For each token t and head: S = exp(g_t) S (row by row when g_t is per channel);
    S += k_t ⊗ beta_t (v_t - Sᵀ k_t);  o_t = Sᵀ q_t.
    Returns (outputs [batch seq heads value_dim], the final state), in float32.
    """
    q, k, v, g, beta, state = (getattr(x, "value", x) if not isinstance(x, torch.Tensor) else x
                               for x in (q, k, v, g, beta, state))
    heads = v.shape[2]
    if g.dim() not in (3, 4) or tuple(g.shape[:3]) != (v.shape[0], v.shape[1], heads) or (
            g.dim() == 4 and g.shape[3] != k.shape[3]):
        raise ValueError(f"delta_rule: g is [batch seq heads] or [batch seq heads key_dim] (a decay per key channel): "
                         f"here {tuple(g.shape)}, with v {tuple(v.shape)} and k {tuple(k.shape)}")
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
        s = s * (g[:, t].exp()[..., None] if g.dim() == 4 else g[:, t].exp()[..., None, None])
        kt, vt = k[:, t], v[:, t]  # [b h dk], [b h dv]
        recalled = torch.einsum("bhkv,bhk->bhv", s, kt)
        s = s + torch.einsum("bhk,bhv->bhkv", kt, (vt - recalled) * beta[:, t, :, None])
        out[:, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, t])
    return out.float(), s.float()


def linear_attention(q: Any, k: Any, v: Any, slope: Any, state: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention with a decay per head, one token at a time (MiniMax's lightning attention; not the
    delta rule: the state only accumulates, it is never corrected toward a value).

    ``q``, ``k`` [batch heads seq key_dim], ``v`` [batch heads seq value_dim], ``slope`` the decay rate
    of each head ([heads], or any shape of heads elements: MiniMax's slope_rate buffer [heads 1 1]),
    ``state`` [batch heads key_dim value_dim] or None (zeros). For each token t and head:
    S = exp(-slope) S + k_tᵀ v_t;  o_t = q_t S. No norm and no scale. Returns (outputs [batch heads
    seq value_dim], the final state), in float32.
    """
    q, k, v, slope, state = (getattr(x, "value", x) if not isinstance(x, torch.Tensor) else x
                             for x in (q, k, v, slope, state))
    heads = q.shape[1]
    if slope.numel() != heads or k.shape[:3] != q.shape[:3] or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"linear_attention: q, k [batch heads seq key_dim], v [batch heads seq value_dim] and a "
                         f"slope per head: here q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"slope {tuple(slope.shape)}")
    q, k, v = (x.double() for x in (q, k, v))
    keep = torch.exp(-slope.double().reshape(1, heads, 1, 1))
    b, _, seq, dk = k.shape
    s = torch.zeros(b, heads, dk, v.shape[-1], dtype=torch.float64) if state is None else state.double().clone()
    out = torch.zeros_like(v)
    for t in range(seq):
        s = keep * s + torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
        out[:, :, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, :, t])
    return out.float(), s.float()


def selective_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None  # noqa: N803 - Mamba's names
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan, one token at a time, written out here (not transformers' kernel).

    ``x``, ``dt``, ``z`` [batch seq channels] (``dt`` after its bias and softplus), ``A`` [channels
    state] (negative: ``-exp(A_log)``), ``B``, ``C`` [batch seq state], ``D`` [channels] or None.
    For each token t: h = exp(dt_t A) h + (dt_t x_t) B_t (h [batch channels state], zero at first);
    y_t = h C_t + D x_t, then y_t * silu(z_t) when ``z`` is given. As transformers'
    ``mamba_selective_scan`` computes it, in float64 here; returns (y [batch seq channels], the final
    state [batch channels state]), in x's dtype and float32.
    """
    x, dt, A, B, C, D, z = (getattr(t, "value", t) if t is not None and not isinstance(t, torch.Tensor) else t
                            for t in (x, dt, A, B, C, D, z))
    xd, dtd, Ad, Bd, Cd = (t.double() for t in (x, dt, A, B, C))
    b, seq, channels = xd.shape
    h = torch.zeros(b, channels, Ad.shape[-1], dtype=torch.float64, device=xd.device)
    ys = []
    for t in range(seq):
        h = torch.exp(dtd[:, t, :, None] * Ad) * h + (dtd[:, t] * xd[:, t])[..., None] * Bd[:, t, None, :]
        ys.append((h * Cd[:, t, None, :]).sum(-1))
    y = torch.stack(ys, 1)
    if D is not None:
        y = y + xd * D.double()
    if z is not None:
        y = y * torch.nn.functional.silu(z.double())
    return y.to(x.dtype), h.float()


def unimplemented() -> list[str]:
    """The whitelisted names without a helper here (none: the import below refuses any)."""
    here = globals()
    return ([n for n in FUNCTIONS if not callable(here.get(n))]
            + [f"cfg_{n}" for n in CONFIG_FUNCTIONS if not callable(here.get(f"cfg_{n}"))])


if unimplemented():
    raise ImportError(f"nnatlas.trace.expressions implements no {', '.join(unimplemented())} of nnatlas.spec's whitelist")
