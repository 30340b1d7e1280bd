"""One generic rule that shrinks a released checkpoint's config to a tiny one laid out as the checkpoint is: the
checkpoint twins of the generated tests (:func:`nnatlas.testing.twin`) and the drafter's tiny model of a given
config (``load(path, draft=True)``, ``nnatlas draft TYPE --config PATH``) are both built by it.

What is kept and what is shrunk is found from the names and values of the config class's entries, never written
per family:

- sizes (:data:`SIZES`, matched by name at any depth of the config: DBRX's ``attn_config.kv_n_heads``) take fixed
  tiny values; key/value heads keep the checkpoint's grouping (as many as the query heads, one, or fewer);
  ``rotary_dim`` never exceeds the shrunk head width; special token ids past the shrunk vocabulary are moved into it;
- the layout (:func:`layout`) is kept: a per-block list or pattern string (``layer_types``, ``mlp_layer_types``,
  ``hybrid_override_pattern``) is cut to one period when it is periodic, else to its runs in order, each run cut
  to at most two blocks, until every kind of block has appeared; a dense-first count (``first_k_dense_replace``,
  ``num_dense_layers``, ...) is kept up to two, at least one, with mixture blocks after it; a period
  (``decoder_sparse_step``, ``moe_layer_freq``, ...) is kept, with enough blocks to hold it; GPT-Neo's
  ``attention_types`` ``[[kinds, repeats]]`` covers the shrunk stack exactly;
- windows shrink with the sequence (``sliding_window``, ``attention_chunk_size``: :data:`WINDOW`, under the tests'
  shortest fixed prompt);
- every other entry (tie, rope type, norms, biases, softcaps, activation, flags, factors) is the checkpoint's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# entries of a recorded config that are no option of the model
NOT_OPTIONS = frozenset({"model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path",
                         "auto_map", "quantization_config", "use_cache"})
# size entries by name -> their tiny value; a name matches at any depth (a sub-config's entries too)
SIZES: dict[str, int] = {
    "vocab_size": 96, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4,
    "head_dim": 16, "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64,
    "intermediate_size": 48, "n_inner": 48, "ffn_dim": 48, "ffn_hidden_size": 48,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "moe_top_k": 2, "top_k": 2, "moe_k": 2,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "expert_ffn_hidden": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "time_step_rank": 4,
    "kv_lora_rank": 8, "q_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "qk_head_dim": 12,
    "index_head_dim": 8, "index_n_heads": 2, "index_topk": 4,
    "vocab_size_per_layer_input": 96, "hidden_size_per_layer_input": 4,
}
_SIZES = SIZES
# counts that are kept when smaller than the tiny value (one shared expert stays one; top-1 routing stays top-1)
AT_MOST = frozenset({"num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "moe_top_k", "top_k", "n_shared_experts", "num_shared_experts",
                     "n_group", "topk_group", "n_groups"})
# the names a size goes by, in the order a config's first one is taken (the drafter reads its roles from these too)
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
# special token ids inside the shrunk vocabulary (those past it are moved to these; others: 0)
TOKEN_IDS = {"bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0}
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "kv_n_heads")
GROUPS = ("n_group", "topk_group", "num_expert_group")  # expert groups: one (the tiny mixture's experts do not split)
DENSE_FIRST = ("first_k_dense_replace", "num_dense_layers", "first_dense_layers", "moe_layer_start_index",
               "n_dense_layers")
# a period of the stack (every p-th block another kind): kept, the stack long enough to hold one
PERIOD = re.compile(r"interval|period|freq|step|every|_pattern$")
# (head width, heads, expansion) of a Mamba mixer: heads * head width == expansion * hidden size
SSM_HEADS = (("mamba_d_head", "mamba_n_heads", "mamba_expand"), ("mamba_head_dim", "mamba_num_heads", "expand"),
             ("mamba_headdim", "n_mamba_heads", "mamba_expand"), ("head_dim", "num_heads", "expand"))
# an entry not named as a size whose recorded value is a named size's (OPT's word_embed_proj_dim == hidden_size,
# RecurrentGemma's lru_width): that size's tiny value
SIZE_LIKE = re.compile(r"dim|size|width|hidden|ff")
WINDOWS = ("sliding_window", "attention_chunk_size", "local_window_size", "window_size")
WINDOW = 4  # under the tests' fixed prompts (16 and 24 tokens) and inside their drawn ones (up to 7)
PATTERN = re.compile(r"pattern|layer|block")  # a string entry that spells the stack (NemotronH's hybrid_override_pattern)
SHARED = re.compile(r"shared\w*_layers$")
ROTARY = ("rotary_dim", "rotary_emb_base_dim")
TOKEN_ID = re.compile(r"_token_id$")


class ShrinkError(ValueError):
    """A recorded config the rule cannot shrink into one its class accepts; the message names the option."""


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _period(seq: list[Any]) -> int | None:
    """The shortest period of ``seq`` (``seq[i] == seq[i % p]``) under half its length, else None."""
    n = len(seq)
    for p in range(1, n // 2 + 1):
        if all(seq[i] == seq[i % p] for i in range(n)):
            return p
    return None


def cut(seq: list[Any], first: int | None = None) -> list[Any]:
    """A per-block list cut so every kind still appears, in order: one period of a periodic list (whole: its layout
    repeats), else its runs in order, each at most two blocks long (the first at most ``first`` when given: a
    dense-first count cut with it), until every kind has appeared, then one block of the kind after, if any."""
    if not seq:
        return list(seq)
    period = _period(seq)
    if period is not None and len(set(map(repr, seq[:period]))) == len(set(map(repr, seq))):
        return list(seq[:period])
    runs: list[list[Any]] = []
    for x in seq:
        if runs and runs[-1][0] == x:
            runs[-1].append(x)
        else:
            runs.append([x])
    kinds = {repr(x) for x in seq}
    out: list[Any] = []
    seen: set[str] = set()
    for k, run in enumerate(runs):
        if seen == kinds:
            break
        size = min(len(run), 2 if k or first is None else max(1, first))
        out += run[:size]
        seen.add(repr(run[0]))
    return out


def _dense_first(k: int) -> int:
    return min(k, 2) if k >= 1 else k


def layout(defaults: Mapping[str, Any], given: Mapping[str, Any], layers: str) -> tuple[dict[str, Any], int]:
    """The structural options of ``given`` (a recorded config's entries) as a tiny stack has them, and its block
    count. ``defaults``: the config class's entries after it filled them in from ``given`` (what it derived)."""
    n_given = given.get(layers, defaults.get(layers))
    out: dict[str, Any] = {}
    n = 2
    dense = {k: given[k] for k in DENSE_FIRST if _is_int(given.get(k))}
    for k, v in dense.items():
        out[k] = _dense_first(v)
    first = max(out.values(), default=None)
    periods = {k: v for k, v in given.items() if PERIOD.search(k) and _is_int(v) and 1 < v <= 8}
    out.update(periods)
    if first:
        n = max(n, first + 1)
    if periods:
        n = max(n, (first or 0) + max(periods.values()))
    for k, v in given.items():
        if isinstance(v, list) and 1 < len(v) <= 8 and _is_int(n_given) and len(v) < n_given and all(
                isinstance(x, str) for x in v):  # a pattern the stack cycles through (RecurrentGemma's block_types)
            n = max(n, len(v))
        elif isinstance(v, list) and v and _is_int(n_given) and all(_is_int(x) for x in v) and v == sorted(set(v)) \
                and v[-1] < n_given:  # block indices (LFM2's full_attn_idxs): the first (at most block 2), one more
            out[k] = [min(v[0], 2)]
            n = max(n, out[k][0] + 2)
    lists: dict[str, Any] = {}
    # per-block lists and pattern strings the checkpoint gives, or the class fills in for its length (Zamba 2's
    # layers_block_type, which it does not derive again from a shorter stack)
    for k, v in {**{k: v for k, v in defaults.items() if isinstance(v, list)}, **given}.items():
        if TOKEN_ID.search(k):  # (GLM's three eos ids on a three-block stack: no per-block list)
            continue
        if isinstance(v, list) and _is_int(n_given) and len(v) == n_given and n_given > 1 and all(
                isinstance(x, (str, bool, int)) and not isinstance(x, list) for x in v):
            lists[k] = v
        elif isinstance(v, str) and _is_int(n_given) and len(v) == n_given and n_given > 1 and PATTERN.search(k):
            lists[k] = v
    # trailing blocks that reuse an earlier block's keys and values (Gemma 4's num_kv_shared_layers): one, after
    # a stack that holds every kind (the kinds it reuses are produced before it)
    shared = {k: v for k, v in given.items() if SHARED.search(k) and _is_int(v) and 0 < v < (n_given or 0)}
    extra = 1 if shared else 0
    out.update(dict.fromkeys(shared, 1))
    if lists:
        # every list cut at the same blocks: the longest cut of any list, the others cut to the same length so
        # that block i keeps its kinds in every list
        cuts = {k: cut(list(v), first) for k, v in lists.items()}
        n = max(n, *(len(c) for c in cuts.values())) + extra
        for k, v in lists.items():
            c = cuts[k]
            if len(c) < n:  # a shorter cut: this list's own blocks up to n, which keep every kind it cut to
                c = _extend(list(v), c, n)
            out[k] = "".join(c) if isinstance(v, str) else c
    elif extra:
        n += extra
    pattern = given.get("attention_types")  # GPT-Neo: [[kinds, repeats]] covers the stack exactly
    if isinstance(pattern, list) and pattern and isinstance(pattern[0], list) and isinstance(pattern[0][0], list):
        kinds = list(pattern[0][0])
        out["attention_types"] = [[kinds, 1]]
        n = len(kinds)
    out[layers] = n
    return out, n


def _extend(full: list[Any], c: list[Any], n: int) -> list[Any]:
    """``c`` (a cut of ``full``) made ``n`` long: the blocks of ``full`` after the cut's last run, in order."""
    rest = full[len(c):] if full[:len(c)] == c else full[-(n - len(c)):]
    return (c + rest)[:n] + [full[-1]] * max(0, n - len(c) - len(rest))


def _shrink_sizes(entries: dict[str, Any], sizes: Mapping[str, int], heads_given: int | None) -> dict[str, Any]:
    """Every size of ``entries`` (a config's or a sub-config's) at its tiny value (``sizes``), recursively."""
    out: dict[str, Any] = {}
    for k, v in entries.items():
        if isinstance(v, dict):
            out[k] = _shrink_sizes(v, sizes, heads_given)
        elif k in KV_HEADS and _is_int(v):
            out[k] = v if v <= 1 else (SIZES["num_attention_heads"] if heads_given is not None and v >= heads_given
                                       else 2)
        elif k in GROUPS and _is_int(v):
            out[k] = 1
        elif k in sizes and _is_int(v) and v > 0:
            out[k] = min(v, sizes[k]) if k in AT_MOST else sizes[k]
        elif k in AT_MOST and _is_int(v):
            out[k] = min(v, 1)
        else:
            out[k] = v
    return out


def shrink(config_class: Any, recorded: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The tiny config parameters of ``recorded`` (a released checkpoint's config entries) for ``config_class``:
    laid out as the checkpoint, its sizes shrunk (the module's rule; ``sizes`` overrides some tiny values: a wrapper's
    text model as wide as its tiny vision tower's output). Raises :class:`ShrinkError` naming the option when the
    class refuses the result."""
    SIZES = {**_SIZES, **(sizes or {})}  # noqa: N806 - the module's table, with the caller's overrides
    given = {k: v for k, v in dict(recorded).items() if k not in NOT_OPTIONS}
    try:
        built = config_class(**_copy(given))
    except Exception as e:  # noqa: BLE001 - the recorded config itself
        raise ShrinkError(f"{config_class.__name__} refuses the recorded config itself: {type(e).__name__}: "
                          f"{_line(e)}") from e
    full = built.to_dict()
    layers = next((n for n in LAYERS if _is_int(given.get(n, full.get(n)))), None)
    derived = layers is None  # a block count the class derives (NemotronH: its pattern's length)
    layers = layers or next((n for n in LAYERS if _is_int(getattr(built, n, None))), None)
    if layers is None:
        raise ShrinkError(f"{config_class.__name__}: no block count ({', '.join(LAYERS)}) in the recorded config")
    n_given = given.get(layers, getattr(built, layers))
    heads = next((given.get(n, full.get(n)) for n in HEADS
                  if _is_int(given.get(n, full.get(n)))), None)
    params = _shrink_sizes(given, SIZES, heads)
    laid, _ = layout(full, {**given, layers: n_given}, layers)
    if derived:
        laid.pop(layers)
    params.update(laid)
    named = {v: SIZES[k] for k, v in given.items() if k in SIZES and _is_int(v) and v > SIZES[k] and k not in AT_MOST}
    for k, v in given.items():
        if k not in SIZES and SIZE_LIKE.search(k) and _is_int(v) and v in named and params.get(k) == v:
            params[k] = named[v]
    hidden = next((params[n] for n in HIDDEN if _is_int(params.get(n))),
                  SIZES["hidden_size"])
    for d_head, n_heads, expand in SSM_HEADS:  # a Mamba mixer's heads tile its expanded width exactly
        ints = [params.get(n, full.get(n)) for n in (d_head, n_heads, expand)]
        if all(_is_int(x) for x in ints) and (n_heads != "num_heads" or not heads_attention(full)):
            params[n_heads] = 4
            params[d_head] = int(ints[2]) * hidden // 4
    # a size the class derives or fills in itself (head_dim from hidden / heads) but the recorded config leaves out
    # stays the class's derivation of the tiny sizes; one that it fills as a default and the model reads is shrunk
    for k, v in full.items():
        if k not in params and k in SIZES and _is_int(v) and v > SIZES[k] and k not in ("head_dim",):
            params[k] = min(v, SIZES[k]) if k in AT_MOST else SIZES[k]
    if _is_int(given.get("head_dim")) and given.get("head_dim") == given.get("qk_rope_head_dim"):
        params["head_dim"] = params["qk_rope_head_dim"]  # (MLA: the head width is its rotary part's: LongCat)
    if _is_int(full.get("mamba_d_ssm")) and _is_int(full.get("mamba_expand")):  # the Mamba mixer's width
        params["mamba_d_ssm"] = int(full["mamba_expand"]) * hidden
    for k in WINDOWS:
        if _is_int(params.get(k)) and params[k] > WINDOW:
            params[k] = WINDOW
    head = int(params["head_dim"]) if _is_int(params.get("head_dim")) else int(hidden) // SIZES["num_attention_heads"]
    for k in ROTARY:
        if _is_int(params.get(k)) and params[k] > head:
            params[k] = head // 2
    rope = params.get("rope_parameters")
    width = next((given[n] for n in ("hidden_size", "n_embd", "d_model") if _is_int(given.get(n))), None)
    half = int(given["head_dim"]) // 2 if _is_int(given.get("head_dim")) else (
        width // heads // 2 if _is_int(width) and _is_int(heads) and heads else 0)
    if isinstance(rope, dict) and half:  # sections of the rotary half (M-RoPE's mrope_section): scaled to the tiny one
        for k, v in rope.items():
            if isinstance(v, list) and v and all(_is_int(x) for x in v) and sum(v) == half:
                small = [max(1, x * (head // 2) // half) for x in v]
                small[-1] += head // 2 - sum(small)
                rope[k] = small
    vocab = params.get("vocab_size", SIZES["vocab_size"])
    for k, v in list(full.items()):  # special token ids the shrunk vocabulary does not hold (a class default too)
        if TOKEN_ID.search(k) and _is_int(v) and _is_int(vocab) and v >= vocab:
            params[k] = TOKEN_IDS.get(k, 0)
        elif TOKEN_ID.search(k) and isinstance(v, list) and _is_int(vocab) and any(_is_int(x) and x >= vocab for x in v):
            params[k] = [3]
    try:
        config_class(**_copy(params))
    except Exception as e:  # noqa: BLE001 - say which option: the first whose recorded value alone is refused
        raise ShrinkError(f"{config_class.__name__} refuses the shrunk checkpoint config"
                          f"{_culprit(config_class, params, given)}: {type(e).__name__}: {_line(e)}") from e
    return params


def heads_attention(full: Mapping[str, Any]) -> bool:
    """Whether ``num_heads`` counts attention heads (a config with key/value heads), not a Mamba mixer's."""
    return any(_is_int(full.get(n)) for n in KV_HEADS)


def _copy(x: Any) -> Any:
    import copy

    return copy.deepcopy(x)


def _line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[-1][:200] if lines else ""


def _culprit(config_class: Any, params: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """`` (option NAME=VALUE)``: the one recorded option whose removal makes the class accept the shrunk config."""
    for k in given:
        if k not in params:
            continue
        trial = {n: v for n, v in _copy(dict(params)).items() if n != k}
        try:
            config_class(**trial)
        except Exception:  # noqa: BLE001 - not this one
            continue
        return f" (option {k}={params[k]!r}, recorded as {given[k]!r})"
    return ""


def build_check(config_class: Any, model_class: Any, params: Mapping[str, Any]) -> None:
    """Raise :class:`ShrinkError` naming the option when the model does not build from ``params`` (on the meta
    device, no weights)."""
    import torch

    def attempt(p: Mapping[str, Any]) -> Exception | None:
        try:
            with torch.device("meta"):
                model_class(config_class(**_copy(dict(p))))
        except Exception as e:  # noqa: BLE001 - the reason
            return e
        return None

    error = attempt(params)
    if error is None:
        return
    name = ""
    for k in params:
        if attempt({n: v for n, v in params.items() if n != k}) is None:
            name = f" (option {k}={params[k]!r})"
            break
    raise ShrinkError(f"{model_class.__name__} does not build from the shrunk checkpoint config{name}: "
                      f"{type(error).__name__}: {_line(error)}") from error
