"""A tiny random model of one transformers model type: its config shrunk, and the draw ranges
the generated tests will pick from (what goes into the spec's ``tiny:``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from . import configexpr
from .repair import own_sub_configs, repair


class DraftError(Exception):
    """The drafter cannot go on: no such model type, no causal-LM class, a model that does not build (``built``: it
    built and ran, and its forward is one no spec describes)."""

    def __init__(self, message: str, built: bool = False):
        super().__init__(message)
        self.built = built


# config attribute -> the fixed tiny value (the first name of each group that the config has wins)
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
HIDDEN = ("hidden_size", "n_embd", "d_model", "dim")
INTERMEDIATE = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
FIXED: dict[str, Any] = {
    "vocab_size": 96, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0,
    # mixtures of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8, "expert_ffn_hidden": 8,
    # linear attention / state-space mixers
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "mamba_n_heads": 4, "mamba_d_head": 8,
    "time_step_rank": 4, "kv_lora_rank": 8, "q_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "n_group": 1, "topk_group": 1, "n_groups": 1, "mamba_n_groups": 1, "mamba_ngroups": 1,
    "sliding_window": 16, "attention_chunk_size": 16, "rotary_dim": 4,
    # per-layer input embeddings (Gemma 3n, Gemma 4): a table of vocab_size_per_layer_input rows, each one slice
    # of hidden_size_per_layer_input per block (by default 262144 x 256 per block: half a gigabyte on a tiny model)
    "vocab_size_per_layer_input": 96, "hidden_size_per_layer_input": 4,
}
# a mixture's dense blocks: the tiny config makes every block a mixture (one MLP class per host path)
ALL_SPARSE: dict[str, Any] = {"first_k_dense_replace": 0, "num_dense_layers": 0, "first_dense_layers": 0,
                              "moe_layer_start_index": 0, "n_dense_layers": 0, "decoder_sparse_step": 1,
                              "moe_layer_freq": 1, "moe_every_n_layers": 1, "mlp_only_layers": [],
                              "expert_layer_period": 1, "expert_layer_offset": 0}
# (head width, heads, expansion) of a Mamba mixer: heads * head width == expansion * hidden size
SSM_HEADS = (("mamba_d_head", "mamba_n_heads", "mamba_expand"), ("mamba_head_dim", "mamba_num_heads", "expand"),
             ("mamba_headdim", "n_mamba_heads", "mamba_expand"))
ATTENTION_AT = ("attn_layer_indices", "attention_layer_indices")
DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
            "hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclass
class Tiny:
    """What the spec's ``tiny:`` says, and the config it builds first."""

    model_type: str
    model_class: str
    config_class: str
    config: dict[str, Any]  # fixed entries
    draw: dict[str, Any]  # drawn entries: a list of options or an expression of earlier ones
    notes: list[str] = field(default_factory=list)  # a comment per choice the spec should explain
    names: dict[str, str] = field(default_factory=dict)  # role (layers, heads, ...) -> config attribute
    also: list[str] = field(default_factory=list)  # the composite model type asked for, whose text config this is

    def first(self) -> dict[str, Any]:
        """The first option of every draw (the most layers), evaluated: the config the drafter records."""
        scope = dict(self.config)
        params = dict(self.config)
        for name, options in self.draw.items():
            if isinstance(options, list):
                value = options[-1] if name == self.names.get("layers") else options[0]
            else:
                value = configexpr.evaluate(options, dict(scope), {"len": len})
            scope[name] = value
            if not name.startswith("_"):
                params[name] = value
        return params


def causal_lm_class(model_type: str, config_cls: type | None = None) -> str:
    """The causal-LM class of a model type; for a type the mapping lacks (a multimodal wrapper's text config, such as
    emu3_text_model), the mapped class whose config class is ``config_cls``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if cls is None and config_cls is not None:
        cls = next((c for c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(c, str)
                    and getattr(getattr(transformers, c, None), "config_class", None) is config_cls), None)
    if cls is None:
        raise DraftError(f"model type '{model_type}' has no causal-LM class in transformers "
                         "(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")
    return cls if isinstance(cls, str) else cls[0]


def _first(cfg: Any, names: tuple[str, ...]) -> str | None:
    for n in names:
        if isinstance(getattr(cfg, n, None), int) and not isinstance(getattr(cfg, n), bool):
            return n
    return None


def listed_flags(cfg: Any, word: str) -> list[tuple[str, bool]]:
    """The config's boolean entries whose name holds ``word``."""
    return [(k, v) for k, v in cfg.to_dict().items() if word in k and isinstance(v, bool)]


def base_config(model_type: str, path: str | None = None) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if path is not None:
        return AutoConfig.from_pretrained(path)
    if model_type not in CONFIG_MAPPING:
        raise DraftError(f"transformers has no model type '{model_type}'")
    try:
        return CONFIG_MAPPING[model_type]()
    except Exception as e:  # noqa: BLE001 - the class refuses its own defaults (Gemma 4 Assistant's validator refuses
        # the gemma4_text defaults of its text config): nothing to shrink
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        raise DraftError(f"transformers' default {CONFIG_MAPPING[model_type].__name__}() fails its own validation: "
                         f"{lines[-1] if lines else type(e).__name__}") from e


# what a multimodal wrapper's forward takes beside its text model's: images, video, audio and what places them
_MULTIMODAL_INPUT = re.compile(r"pixel|image|video|audio|input_features|mm_|token_type_ids|per_layer_inputs")


def _wraps_text_model(own: str, text: str) -> None:
    """A type drafted through its text model is a multimodal wrapper of it: its causal-LM class's forward takes
    nothing beyond the text model's but images, video or audio. One that takes more (Gemma 4 Unified Assistant's
    shared_kv_states, a target model's states it runs on) is no standalone causal LM a text model's spec fits."""
    import inspect

    import transformers

    takes = set(inspect.signature(getattr(transformers, own).forward).parameters)
    extra = sorted(takes - set(inspect.signature(getattr(transformers, text).forward).parameters))
    other = [name for name in extra if not _MULTIMODAL_INPUT.search(name)]
    if other:
        raise DraftError(f"{own} is no multimodal wrapper of {text}: its forward also takes {', '.join(other)}, which "
                         "a prompt does not give, so a spec of its text model would not fit it")


def plan(model_type: str, path: str | None = None) -> Tiny:
    """Shrink the model type's default config (or a local checkpoint's) to a tiny one."""
    import transformers

    base = base_config(model_type, path)
    asked = model_type
    model_type = base.model_type
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    inner = base.get_text_config() if hasattr(base, "get_text_config") else base
    try:
        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and inner is not base \
                and inner.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            # a multimodal wrapper with no causal-LM class of its own (LLaVA): its text model's
            model_class = causal_lm_class(inner.model_type)
        else:
            model_class = causal_lm_class(model_type, type(base))
    except DraftError as e:
        if inner is base:
            raise
        raise DraftError(f"model type '{model_type}' has no causal-LM class in transformers, nor has its text model "
                         f"({inner.model_type}, {type(inner).__name__})") from e
    text = getattr(getattr(transformers, model_class, None), "config_class", None)
    if isinstance(text, type) and not isinstance(base, text) and isinstance(getattr(base, "text_config", None), text):
        # a composite config (text and vision ...) whose causal-LM class takes the text config alone
        base = text() if path is None else base.text_config
        model_type = base.model_type
    inner = base.get_text_config() if hasattr(base, "get_text_config") else base
    if inner is not base and _first(base, LAYERS) is None and _first(inner, LAYERS) is not None:
        # a multimodal wrapper whose causal-LM class takes the whole config (Gemma 3, Fuyu): drafted through its
        # text model, the causal-LM class of its text config
        try:
            text_class = causal_lm_class(inner.model_type, type(inner))
        except DraftError:
            text_class = None
        if text_class is not None:
            _wraps_text_model(model_class, text_class)
            base = inner if path is not None else type(inner)()
            model_type, model_class = base.model_type, text_class
    base = _global(base)
    config_class = type(base).__name__
    for cls in (model_class, config_class):
        if not hasattr(transformers, cls):
            raise DraftError(f"transformers exports no {cls}")
    defaults = type(base)().to_dict() if path is not None else base.to_dict()
    fixed: dict[str, Any] = {}
    tiny_notes: list[str] = []
    if path is not None:  # keep the checkpoint's own choices (activation, norm eps, flags) beside the sizes
        sizes = set(FIXED) | set(LAYERS + HEADS + KV_HEADS + HIDDEN + INTERMEDIATE) | {"head_dim", "layer_types"}
        for k, v in base.to_diff_dict().items():
            if k not in sizes and isinstance(v, (str, float, bool)) and defaults.get(k) != v and k not in (
                    "model_type", "transformers_version", "dtype", "torch_dtype", "_name_or_path"):
                fixed[k] = v
    for name, value in FIXED.items():
        cur = getattr(base, name, None)
        if isinstance(cur, int) and not isinstance(cur, bool) and not isinstance(getattr(type(base), name, None), property):
            fixed[name] = value  # (a property is derived: xLSTM's v_head_dim, from its widths)
    if "num_experts_per_tok" in base.to_dict() and base.num_experts_per_tok is None and any(
            isinstance(getattr(base, n, None), int) for n in ("num_experts", "n_routed_experts", "num_local_experts")):
        fixed["num_experts_per_tok"] = FIXED["num_experts_per_tok"]
    for name, value in ALL_SPARSE.items() if path is None else ():  # (a given config keeps its layout: _laid_out)
        cur = getattr(base, name, None)
        if cur is not None and isinstance(cur, (int, list)) and not isinstance(cur, bool):
            fixed[name] = value  # (also when a checkpoint's config says so already: the class default may not)
        if cur is not None and cur != value and isinstance(cur, (int, list)) and not isinstance(cur, bool):
            tiny_notes.append(f"{name}: {value} makes every tiny block a mixture; the checkpoints' config says {cur!r}: "
                              "their dense blocks are not mapped by this draft (one MLP class per host path)")
    tiny_notes += own_sub_configs(base, fixed, path is not None,  # (DBRX's attn_config and ffn_config)
                                  {**FIXED, **dict.fromkeys(INTERMEDIATE, 24)})
    shared = getattr(base, "num_kv_shared_layers", None)
    if isinstance(shared, int) and not isinstance(shared, bool):  # (also a checkpoint's 0: the class default may not be)
        fixed["num_kv_shared_layers"] = 0  # (the last blocks reuse an earlier block of their kind's keys and values)
        if shared > 0:
            tiny_notes.append(f"num_kv_shared_layers: 0: a tiny stack is too short for blocks that reuse an earlier "
                              f"block's keys and values (the checkpoints' last {shared} blocks do): they are not mapped "
                              f"by this draft")
    for name in DROPOUTS:
        if isinstance(getattr(base, name, None), float):
            fixed[name] = 0.0
    for name in ATTENTION_AT:  # a hybrid whose default stack has no attention block: one at block 1
        given = getattr(base, name, None)
        if path is not None and isinstance(given, list) and given:  # a checkpoint's own: kept (those in a tiny stack)
            fixed[name] = [i for i in given if isinstance(i, int) and i < 3] or [1]
        elif name in base.to_dict() and not given:
            fixed[name] = [1]
            tiny_notes.append(f"{name}: [1] puts an attention block in the tiny stack (the default config has none)")
    for name, value in listed_flags(base, "auto_adjust"):  # sizes the model rounds itself (lfm2's MLP width)
        if value:
            fixed[name] = False
            tiny_notes.append(f"{name}: false keeps the drawn sizes as they are (the checkpoints' config says true: "
                              "the model rounds them)")
    _other_parts(base, model_class, fixed, tiny_notes)
    tiny = Tiny(model_type, model_class, config_class, fixed, {}, tiny_notes)
    tiny.also = [asked] if asked != model_type and path is None else []
    listed = base.to_dict()
    # the layer count the config stores (LongCat-Flash stores num_layers; its num_hidden_layers, twice that, counts
    # the sublayers and is derived)
    layers = _first(base, LAYERS)
    if layers is not None and layers not in listed and layers not in (getattr(type(base), "attribute_map", None) or {}):
        layers = next((n for n in LAYERS if isinstance(listed.get(n), int) and not isinstance(listed.get(n), bool)),
                      layers)
    heads, kv, hidden = _first(base, HEADS), _first(base, KV_HEADS), _first(base, HIDDEN)
    kv = kv or next((n for n in KV_HEADS if n in listed), None)  # None by default: as many as the heads
    inter = _first(base, INTERMEDIATE) or next((n for n in INTERMEDIATE if n in base.to_dict()), None)
    if any(isinstance(fixed.get(k), dict) for k in getattr(base, "sub_configs", None) or {}):
        # a config that copies its sizes into its own sub-configs in __post_init__ (DBRX: ffn_config.hidden_size =
        # d_model, num_key_value_heads = attn_config.kv_n_heads), which runs before an alias given as a keyword is
        # set: each size by the field it is stored as, and no key-head count but the sub-config's
        aliases = getattr(type(base), "attribute_map", None) or {}
        layers, heads, hidden = (aliases.get(n, n) if n else n for n in (layers, heads, hidden))
        if kv is not None and is_dataclass(base) and kv not in {f.name for f in fields(base)}:
            kv = None
    # a state-space stack whose only head count is its mixer's (Mamba 2: num_heads, head_dim, expand): no attention
    ssm = ("head_dim", "num_heads", "expand")
    if heads == ssm[1] and kv is None and all(isinstance(getattr(base, n, None), int) for n in ssm) \
            and _attention_free(base, ssm[1]):
        heads = None
    if layers is None or hidden is None or (heads is None and not _attention_free(base, ssm[1])):
        stacks = [k for k in (getattr(base, "sub_configs", None) or {})
                  if _first(getattr(base, k, None), LAYERS) is not None]  # (BLT: four models, four stacks)
        if len(stacks) > 1:
            raise DraftError(f"{config_class} sizes several stacks, one per sub-config ({', '.join(stacks)}): a spec "
                             "describes one decoder stack")
        raise DraftError(f"{config_class} has no layer, head or width size the drafter knows "
                         f"(looked for {LAYERS[0]}, {HEADS[0]}, {HIDDEN[0]} and their aliases)")
    tiny.names = {"layers": layers, "hidden": hidden}
    draw = tiny.draw
    draw[layers] = _layer_options(type(base), layers, fixed)
    _sections(base, tiny, layers)
    _looped(base, tiny, layers)
    pattern = getattr(base, "attention_types", None)  # GPT-Neo's [[kinds, repeats]]: the kinds once each
    if isinstance(pattern, list) and pattern and isinstance(pattern[0], list) and isinstance(pattern[0][0], list):
        fixed["attention_types"] = [[pattern[0][0], 1]]
        draw[layers] = [len(pattern[0][0])]
        tiny.notes.append(f"attention_types: each kind of block once ({', '.join(map(str, pattern[0][0]))})")
    if heads is None:  # a state-space stack without attention (Mamba): widths drawn as they are, the rest derived
        draw[hidden] = [16, 32]
        tiny.notes.append(f"{hidden}: no attention heads (a state-space stack): the mixer's widths follow from it")
        ints = [getattr(base, n, None) for n in ssm]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in ints):  # its heads tile its expanded width
            fixed[ssm[1]] = 4
            draw[ssm[0]] = f"{ints[2]} * {hidden} // 4"
        return tiny
    tiny.names["heads"] = heads
    kinds = getattr(base, "mlp_layer_types", None)
    if isinstance(kinds, list) and kinds and path is None:  # per-block MLP kinds: every tiny block the commonest (also when the
        # checkpoint's are all one: the config class's default for another layer count may not be)
        common = max(set(kinds), key=kinds.count)
        options = draw[layers]
        draw["mlp_layer_types"] = f"{[[common] * n for n in options]!r}[{layers} - {options[0]}]"
        if len(set(kinds)) > 1:
            tiny.notes.append(f"mlp_layer_types: every tiny block {common!r}; the checkpoints' first blocks are "
                              f"{kinds[0]!r}, which this draft does not map (one MLP class per host path)")
    draw[heads] = [2, 4]
    if kv is not None:
        tiny.names["kv_heads"] = kv
        if isinstance(getattr(base, "kv_lora_rank", None), int):  # MLA: a key and a value per query head
            draw[kv] = heads
        else:
            draw["_groups"] = [1, 2]
            draw[kv] = f"{heads} // _groups"
    # a latent-attention config (MLA) derives its head widths from the qk_*/v_* sizes: leave head_dim to it
    has_head_dim = (isinstance(getattr(base, "head_dim", None), int) or "head_dim" in listed) \
        and getattr(base, "qk_rope_head_dim", None) is None \
        and not isinstance(getattr(type(base), "head_dim", None), property)
    if getattr(base, "qk_rope_head_dim", None) is not None:  # MLA: the rotary part is head_dim's, the query's sum
        if "head_dim" in listed:
            fixed["head_dim"] = fixed.get("qk_rope_head_dim", FIXED["qk_rope_head_dim"])
        if "qk_head_dim" in listed:
            fixed["qk_head_dim"] = FIXED["qk_nope_head_dim"] + FIXED["qk_rope_head_dim"]
    # (MLA: a width per head unlike v_head_dim's on the drafted model, so that no expression of the
    # width matches the heads' sizes by chance)
    draw["_head_dim"] = [16, 8] if getattr(base, "qk_rope_head_dim", None) is not None else [8, 16]
    if has_head_dim:
        draw["head_dim"] = "_head_dim"
        tiny.names["head_dim"] = "head_dim"
    draw[hidden] = f"{heads} * _head_dim"
    for d_head, n_heads, expand in SSM_HEADS:  # a Mamba mixer's heads tile its expanded width exactly
        ints = [getattr(base, n, None) for n in (d_head, n_heads, expand)]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in ints):
            fixed.pop(d_head, None)
            fixed[n_heads] = FIXED.get(n_heads, 4)
            draw[d_head] = f"{ints[2]} * {hidden} // {fixed[n_heads]}"
            if isinstance(getattr(base, "mamba_d_ssm", None), int):
                fixed.pop("mamba_d_ssm", None)
                draw["mamba_d_ssm"] = f"{ints[2]} * {hidden}"
    if inter is not None:
        tiny.names["intermediate"] = inter
        if getattr(base, inter, None) is None:  # None by default: the model picks a multiple of the width
            tiny.names["intermediate_default"] = "none"
        draw[inter] = [24, 40]
    if getattr(base, "layer_types", None) is not None and len(set(base.layer_types)) > 1:
        tiny.notes.append(f"{layers}: enough blocks that the default layer_types has every kind of block")
    if path is not None:
        _laid_out(base, tiny, layers)
    _per_layer(base, tiny)
    _refused_fixed(base, tiny)
    _unaliased(base, tiny)
    repair(base, tiny)  # (what the config class leaves unset that its model needs)
    return tiny


def _laid_out(base: Any, tiny: Tiny, layers: str) -> None:
    """A given config (a checkpoint's): the tiny stack laid out as it is, by the checkpoint twins' rule
    (:func:`nnatlas.testing.shrink.layout`: dense-first counts, per-block lists cut so every kind appears, periods),
    one stack length, so that the draft maps each kind of block the model has."""
    from nnatlas.testing.suite import layout

    given = base.to_dict()
    laid, n = layout(given, given, layers)
    laid.pop(layers, None)
    changed = {k: v for k, v in laid.items() if k not in tiny.config or tiny.config[k] != v}
    tiny.config.update(laid)
    if "layer_types" in laid:
        tiny.draw.pop("layer_types", None)
    n = max(n, *(len(v) for v in laid.values() if isinstance(v, (list, str))), 1)
    tiny.draw[layers] = [n]
    if changed:
        tiny.notes.append(f"{layers}: {n}, laid out as the given config ({', '.join(f'{k}: {v!r}' for k, v in changed.items())}): "
                          "each kind of block it has appears")


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


def _other_parts(base: Any, model_class: str, fixed: dict[str, Any], notes: list[str]) -> None:
    """A composite config's other parts, built with the causal-LM model but not run on text (Phi-4-multimodal's vision
    and audio encoders: 870M parameters at their defaults, past the sweep's time): one block each, 32 wide (every
    entry equal to the part's width), two heads; kept at their defaults when the model does not build so."""
    import torch
    import transformers

    text = base.get_text_config() if hasattr(base, "get_text_config") else base
    shrunk: dict[str, dict[str, Any]] = {}
    for name in getattr(base, "sub_configs", None) or {}:
        part = getattr(base, name, None)
        # (a part with no model type of its own is one the text forward runs: DBRX's attn_config, ffn_config)
        own = part is not None and not getattr(part, "model_type", None)
        width = _first(part, HIDDEN) if part is not None and part is not text and not own else None
        if part is None or width is None:
            continue
        given = part.to_dict()
        sizes = {k: 32 for k, v in given.items() if v == getattr(part, width) and type(v) is int}
        for names, value in ((LAYERS + ("num_blocks",), 1), (HEADS, 2), (INTERMEDIATE, 32)):
            n = _first(part, names)
            if n is not None and n in given:
                sizes[n] = value
        shrunk[name] = sizes
    if not shrunk:
        return
    try:
        with torch.device("meta"):  # (whether it builds so, without the weights)
            getattr(transformers, model_class)(type(base)(**{**base.to_diff_dict(), **shrunk}))
    except Exception:  # noqa: BLE001 - a relation the shrunk parts break: their defaults stay
        return
    fixed.update(shrunk)
    notes.append(f"{', '.join(shrunk)}: one block each, 32 wide (the model builds them; a text forward does not run "
                 "them)")


def _sections(base: Any, tiny: Tiny, layers: str) -> None:
    """Layer counts that split the stack into sections (Dory: n_input_layers + n_recurrent_layers + n_output_layers ==
    num_hidden_layers, by default 8 + 20 + 8): shrunk with it, each section one block or more, the rest to the
    largest (a default left as it is would make the tiny stack's middle section negative)."""
    given = base.to_dict()
    total = getattr(base, layers, None)
    parts = {n: getattr(base, n) for n in given if n != layers and re.fullmatch(r"(n|num)_\w+_layers", n)
             and isinstance(getattr(base, n, None), int) and not isinstance(getattr(base, n), bool)
             and getattr(base, n) > 0}
    n = max(tiny.draw[layers])
    if len(parts) < 2 or sum(parts.values()) != total or n < len(parts):
        return
    sizes = dict.fromkeys(parts, 1)
    sizes[max(parts, key=lambda k: parts[k])] += n - len(parts)
    tiny.draw[layers] = [n]
    tiny.config.update(sizes)
    tiny.notes.append(f"{', '.join(sizes)}: {', '.join(map(str, sizes.values()))}: the sections of the stack, "
                      f"which sum to {layers} (the checkpoints' {' + '.join(map(str, parts.values()))} == {total})")


def _looped(base: Any, tiny: Tiny, layers: str) -> None:
    """A stack whose blocks from one index to another run several times (Inkling 2 Loop: blocks 6 to 17, 3 passes):
    the tiny stack holds those blocks, so that its forward loops as the checkpoints' does (a stack cut below the loop's
    start never loops, and its draft would verify a model no checkpoint is)."""
    given = base.to_dict()
    ends = {n: v for n, v in given.items() if re.fullmatch(r"loop\w*_(end|stop)", n) and isinstance(v, int)
            and not isinstance(v, bool)}
    passes = [v for n, v in given.items() if re.fullmatch(r"loop\w*(passes|repeats|iterations)", n) and isinstance(v, int)]
    n = max(tiny.draw[layers])
    if not ends or not passes or max(passes) < 2 or max(ends.values()) <= n:
        return
    end = max(ends.values())
    tiny.draw[layers] = [end]
    tiny.notes.append(f"{layers}: {end}, the looped blocks' end ({', '.join(ends)}): a stack cut below the loop never "
                      "runs it")


def _unaliased(base: Any, tiny: Tiny) -> None:
    """layer_types under the field it names (Zamba 2's attribute_map: layer_types -> layers_block_type): an alias is
    set after the config's __post_init__, which derives from the field (Zamba 2's hybrid_layer_ids) before that."""
    field = (getattr(type(base), "attribute_map", None) or {}).get("layer_types")
    if field and field in base.to_dict() and "layer_types" in tiny.config:
        tiny.config[field] = tiny.config.pop("layer_types")


def _refused_fixed(base: Any, tiny: Tiny) -> None:
    """A fixed tiny size the config class refuses (ZAYA routes each token to one expert: num_experts_per_tok=1 only)
    is left at the class default, when that alone makes the tiny config build."""
    import transformers

    cls = getattr(transformers, tiny.config_class)
    try:
        cls(**tiny.first())
        return
    except Exception as e:  # noqa: BLE001 - refused: try each fixed size at its default
        why = str(e).splitlines()[-1][:120]
    defaults = type(base)().to_dict()
    for name in [n for n in FIXED if n in tiny.config and n in defaults and defaults[n] != tiny.config[n]]:
        kept = tiny.config.pop(name)
        try:
            cls(**tiny.first())
        except Exception:  # noqa: BLE001 - not this one
            tiny.config[name] = kept
            continue
        tiny.notes.append(f"{name}: the config's default ({defaults[name]!r}): it refuses {kept!r} ({why})")
        return


def _global(cfg: Any) -> Any:
    """``cfg``, its per-layer attributes (a heterogeneous config's: transformers' per_layer_config) read as their
    global values, as the tiny config shrinks them; the per-layer overrides are shrunk apart (``_per_layer``)."""
    if getattr(cfg, "is_heterogeneous", False):
        cfg.allow_global_per_layer_attribute_access = True
    return cfg


def _per_layer(base: Any, tiny: Tiny) -> None:
    """A heterogeneous config (per_layer_config: some blocks' sizes differ from the global ones, as Gemma 4's full
    blocks' head width): each kind of block the default config overrides keeps its sizes (every per-layer attribute,
    overridden or global), all shrunk by one factor, the most the tiny config shrank a global one (so that their
    relations hold: Dots 3's sliding head_dim == qk_nope_head_dim + qk_rope_head_dim), on the tiny stack's blocks of
    that kind."""
    import transformers

    spec = base.__dict__.get("_heterogeneity_spec")
    overrides = getattr(spec, "per_layer_overrides", None)
    types = list(getattr(base, "layer_types", None) or ())
    if not overrides or len(types) != base.num_hidden_layers:
        return
    explicit = sorted(getattr(spec, "explicit_per_layer_attributes", None) or {a for o in overrides.values() for a in o})
    default = {a: base._getattr_without_heterogeneous_validation(a, None) for a in explicit}
    by_kind: dict[str, dict[str, Any]] = {}  # each overridden kind's sizes: its first block's in the default stack
    for i, kind in enumerate(types):
        if kind not in by_kind and overrides.get(i):
            by_kind[kind] = {a: overrides[i].get(a, default[a]) for a in explicit}
    cls = getattr(transformers, tiny.config_class)
    params = tiny.first()
    probe = None
    tries: tuple[dict[str, Any], ...] = ({"per_layer_config": {}}, {})
    for given in tries:  # the tiny stack at the globals, or with the class's own overrides
        try:
            probe = _global(cls(**{**params, **given}))
            break
        except Exception:  # noqa: BLE001 - refused: the next, else the build says why
            continue
    if probe is None:
        return
    small = {a: probe._getattr_without_heterogeneous_validation(a, None) for a in explicit}

    def size(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0
    ratios = [small[a] / default[a] for a in explicit if size(small[a]) and size(default[a])]
    if not ratios:
        return
    factor = max(ratios)
    scaled: dict[str, dict[str, Any]] = {}
    for kind, sizes in by_kind.items():
        shrunk = {a: max(1, round(v * factor)) if size(v) and size(small[a]) else v for a, v in sizes.items()}
        shrunk = {a: v for a, v in shrunk.items() if v != small[a]}  # (one equal to the global is dropped)
        if shrunk:
            scaled[kind] = shrunk
    tiny_types = list(getattr(probe, "layer_types", None) or ())
    per_layer = {i: dict(scaled[k]) for i, k in enumerate(tiny_types) if k in scaled}
    if not per_layer:
        return
    try:
        cls(**{**params, "per_layer_config": per_layer})
    except Exception as e:  # noqa: BLE001 - the config refuses the shrunk overrides: the class's own defaults stay
        tiny.notes.append(f"per_layer_config: the default's overrides, shrunk, are refused ({type(e).__name__}: "
                          f"{str(e).splitlines()[-1][:120]}); the config class's own per-layer defaults are kept")
        return
    tiny.config["per_layer_config"] = per_layer
    layers = tiny.names["layers"]
    tiny.draw[layers] = [params[layers]]  # (the overrides name blocks by index: one stack length)
    tiny.notes.append("per_layer_config: each kind of block the default config overrides keeps its sizes ("
                      + "; ".join(f"{k}: {', '.join(f'{a} {sizes[a]}' for a in sorted(scaled.get(k, {})))}"
                                  for k, sizes in by_kind.items()) + f"), all shrunk by one factor ({factor:g})")


def _attention_free(base: Any, mixer_heads: str | None = None) -> bool:
    """A model type with no attention at all: its causal-LM class refuses sdpa, and its config names
    no head count (a Mamba stack) but its mixer's (``mixer_heads``)."""
    import transformers

    cls = getattr(transformers, causal_lm_class(base.model_type), None)
    heads = [n for n in HEADS + KV_HEADS if n != mixer_heads]
    return cls is not None and not getattr(cls, "_supports_sdpa", True) and _first(base, tuple(heads)) is None


def _layer_options(config_cls: Any, layers: str, fixed: dict[str, Any]) -> list[int]:
    """[2, 3], or, on a stack of several block kinds (config.layer_types), the fewest blocks that
    hold every kind the default config has."""
    base = _global(config_cls())
    default = list(getattr(base, "layer_types", None) or ())
    kinds = set(default)
    if len(kinds) == 1 and re.search(r"linear|mamba", default[0]) and getattr(base, "num_attention_heads", None):
        # a hybrid whose default stack has no attention block: one in the middle of three
        hybrid = [default[0], "full_attention", default[0]]
        try:
            config_cls(**{layers: 3, "layer_types": hybrid})  # (the default sizes: the fixed ones are not matched yet)
        except Exception:  # noqa: BLE001 - no such block kind here: keep the default's
            pass
        else:
            fixed["layer_types"] = hybrid
            return [3]
    if len(kinds) <= 1 and not _explicit_types(config_cls, layers, fixed, 3, default):
        return [2, 3]
    for n in range(2, 13):
        try:
            types = getattr(config_cls(**{**fixed, layers: n}), "layer_types", None) or ()
        except Exception:  # noqa: BLE001 - a size this config refuses: try the next one
            continue
        if len(types) == n and set(types) == kinds:
            return [n]
    # layer_types is a list of the default stack's length, not derived from the layer count: the
    # tiny stack takes the blocks of the default's first occurrence of each kind, in order
    first = sorted({default.index(k) for k in kinds})
    tiny_types = [default[i] for i in first] if len(first) > 1 else [default[0]] * 2
    n = len(tiny_types)
    if _explicit_types(config_cls, layers, fixed, n, tiny_types):
        fixed["layer_types"] = tiny_types
        return [n]
    return [2, 3]


def _explicit_types(config_cls: Any, layers: str, fixed: dict[str, Any], n: int, types: list[str]) -> bool:
    """The config builds with these n layer types given, and refuses n blocks without them."""
    if not types:
        return False
    try:
        cfg = config_cls(**{**fixed, layers: n})
        if len(getattr(cfg, "layer_types", None) or ()) == n:
            return False
    except Exception:  # noqa: BLE001 - refused: layer_types must be given
        pass
    try:
        config_cls(**{**fixed, layers: n, "layer_types": list(types[:n]) + [types[-1]] * (n - len(types))})
    except Exception:  # noqa: BLE001 - refused even so
        return False
    return True


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
