"""Attention patterns under sdpa and flex attention: recomputed by the family's eager function.

sdpa and flex attention never form the ``[batch, heads, query, key]`` pattern, so the reads made
inside eager attention (``call:attention > op:softmax.input[0]`` …) have nothing to read there. When
such a read is requested, the trace lets the fused call produce the output the forward goes on
with, then calls the module's own family's ``eager_attention_forward`` on the same queries, keys,
values and keyword arguments (scaling, softcap, sinks, sliding window, dropout) with the call's mask
in eager's additive form, and serves the reads from that call; its output is dropped. The recompute
is part of the autograd graph of the queries and keys; edits of it could reach nothing, so an edit
of a pattern under sdpa raises Unavailable (``RECOMPUTED``, asked by ``targets.conditions_met``).
Every family's generated tests check the recomputed pattern against eager's under sdpa and flex
attention (run uncompiled on CPU: ``nnatlas.testing.uncompiled_flex_attention``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unavailable

# the attention implementations under which a pattern read in eager attention is recomputed
RECOMPUTED = ("sdpa", "flex_attention")
RECOMPUTED_WORDS = "read in eager attention, recomputed under sdpa and flex attention from the call's queries and keys"
# the words of a read at eager's softmax in the forward (``recompute: sdpa``)
SDPA_WORDS = "read at eager's softmax, recomputed under sdpa from the forward's scaled_dot_product_attention call"
EDIT_WORDS = "an edit of a recomputed pattern could reach nothing (sdpa and flex attention never form it)"


def eager_mask(mask: Any, query: torch.Tensor, key: torch.Tensor, module: torch.nn.Module,
               is_causal: bool | None) -> torch.Tensor | None:
    """The mask of one sdpa or flex call in eager's form: additive, ``finfo.min`` where a key is hidden.

    sdpa gets None (then causal, top left aligned, when the call has more than one query and the
    module is causal, as ``sdpa_attention_forward`` decides), a boolean mask (True: attend) or an
    additive one; flex attention gets a ``BlockMask``, evaluated at every (batch, head, query, key)."""
    dtype = query.dtype
    q_len, kv_len = query.shape[-2], key.shape[-2]
    if mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if not (q_len > 1 and causal):
            return None
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril()[None, None]
    elif isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool:
            return mask
        allowed = mask
    else:
        allowed = _block_mask_dense(mask, query, key)
    return torch.zeros(allowed.shape, dtype=dtype, device=query.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _block_mask_dense(mask: Any, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """A flex attention ``BlockMask`` as a boolean ``[batch, heads, query, key]`` tensor (its mask_mod
    at every position, within the call's lengths)."""
    from torch.nn.attention.flex_attention import create_mask

    q_len, kv_len = query.shape[-2], key.shape[-2]
    batch, heads = query.shape[0], query.shape[1]
    dense = create_mask(mask.mask_mod, batch, heads, q_len, kv_len, device=query.device)
    return dense.to(torch.bool)


def serving_loads(read: Any) -> str:
    """The loads that serve a recomputable pattern read, for the message of a load that does not
    (flash attention never forms the pattern and has no recompute: it is not verified without a GPU)."""
    fused = "'sdpa'" if read.recompute == "sdpa" else "'sdpa' or 'flex_attention'"
    return f"attn_implementation='eager' (read in the forward) or {fused} (recomputed from the call)"


def words(read: Any) -> str:
    """How a recomputed pattern read is served (support()'s words)."""
    return SDPA_WORDS if read.recompute == "sdpa" else RECOMPUTED_WORDS


def recompute(eager: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              run: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]) -> None:
    """Call ``eager`` (the module's eager attention function) through ``run`` (the op scope that serves
    the reads) on the arguments an sdpa or flex call got: ``args`` is ``(module, query, key, value,
    attention_mask, ...)``, the mask possibly in ``kwargs``."""
    module, query, key, value, *rest = args
    kw = dict(kwargs)
    if rest:
        mask, rest = rest[0], rest[1:]
    else:
        mask = kw.pop("attention_mask", None)
    is_causal = kw.pop("is_causal", None)
    run(eager, (module, query, key, value, eager_mask(mask, query, key, module, is_causal), *rest), kw)


SDPA = "scaled_dot_product_attention"  # the op a forward calls under sdpa in place of eager's softmax


def softmax_from_sdpa(serve: Callable[[str, int, str, Any], Any], module: torch.nn.Module
                      ) -> Callable[[str, int, str, Any], Any]:
    """The server of an op scope over ``module``'s own forward, where the reads are at eager's softmax
    (``recompute: sdpa``: Falcon) and under sdpa the forward calls ``scaled_dot_product_attention``
    instead. At the k-th such call (its output left as it is) the k-th softmax's reads are served from
    eager's form of the call: ``query @ keyᵀ`` divided by ``sqrt(head_dim)`` (times ``scale`` when the
    call gives one), plus the call's mask in eager's additive form, then ``softmax(-1, dtype=query.dtype)``
    (the key heads broadcast: multi-query). Other ops pass to ``serve``."""
    pending: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def serving(name: str, k: int, side: str, payload: Any) -> Any:
        if name != SDPA:
            return serve(name, k, side, payload)
        if side == "input":
            pending.append(payload)
            return payload
        args, kwargs = pending.pop()
        if getattr(getattr(module, "config", None), "alibi", False):
            raise Unavailable(f"{type(module).__name__} with alibi: its eager softmax (alibi added, "
                                      "scaled after) is not recomputed under sdpa; load with attn_implementation='eager'")
        query, key = args[0], args[1] if len(args) > 1 else kwargs["key"]
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        scale = kwargs.get("scale")
        scores = query @ key.transpose(-1, -2)
        scores = scores * scale if scale is not None else scores / math.sqrt(query.shape[-1])
        additive = eager_mask(mask, query, key, module, kwargs.get("is_causal", False))
        inputs = serve("softmax", k, "input", ((scores if additive is None else scores + additive,),
                                                {"dim": -1, "dtype": query.dtype}))
        serve("softmax", k, "output", torch.softmax(*inputs[0], **inputs[1]))
        return payload

    return serving
