"""A tiny random model of one transformers model type: its config shrunk (the checkpoint twins' rule, laid out as a
given config is), and the draw ranges the generated tests will pick from (what goes into the spec's ``tiny:``).

    tiny_config.py  the size tables, the Tiny plan, the causal-LM class
    tiny_stack.py   the stack: block counts, sections, loops, per-layer overrides, other parts
    tiny_build.py   the model built from a plan, perturbed; other sizes to try
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from typing import Any

from .repair import builds, own_sub_configs, repair
from .tiny_build import alternatives, build, perturbed, takes_mask
from .tiny_config import (
    ALL_SPARSE,
    ATTENTION_AT,
    DRAWN,
    DROPOUTS,
    FIXED,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    SSM_HEADS,
    TOKEN_IDS,
    DraftError,
    Tiny,
    _first,
    _global,
    causal_lm_class,
    listed_flags,
    tiny_size,
)
from .tiny_stack import (
    _attention_free,
    _layer_options,
    _looped,
    _other_parts,
    _per_layer,
    _refused_fixed,
    _sections,
    _unaliased,
)


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
    for name in FIXED:
        cur = getattr(base, name, None)
        if isinstance(cur, int) and not isinstance(cur, bool) and not isinstance(getattr(type(base), name, None), property):
            if cur > 0 or name in TOKEN_IDS:  # (0 or less: an option off, as shrink keeps it)
                fixed[name] = tiny_size(name, cur)  # (a property is derived: xLSTM's v_head_dim, from its widths)
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
    if not isinstance(given.get(layers), int) and isinstance(getattr(base, layers, None), int):
        given[layers] = getattr(base, layers)  # (a block count the class derives: NemotronH's, from its kinds' list)
    laid, n = layout(given, given, layers)
    laid.pop(layers, None)
    alias = (getattr(type(base), "attribute_map", None) or {}).get("layer_types")
    whole = ""
    for attempt in ("cut", "whole"):
        if attempt == "whole":  # the cut stack does not build (Zamba: one hybrid block ties its shared block's weights
            # to nothing) and the given one is small: the given stack whole
            n_given = given.get(layers)
            if not isinstance(n_given, int) or n_given > 12 or builds(tiny) is None:
                break
            laid = {k: given[k] for k in laid if k in given}
            n, whole = n_given, " (whole: cut to fewer blocks, the model does not build)"
        changed = {k: v for k, v in laid.items() if k not in tiny.config or tiny.config[k] != v}
        tiny.config.update(laid)
        if "layer_types" in laid or alias in laid:  # (the list under its alias too: Zamba 2's layers_block_type)
            tiny.draw.pop("layer_types", None)
            if alias in laid:
                tiny.config.pop("layer_types", None)
        n = max(n, *(len(v) for v in laid.values() if isinstance(v, (list, str))), 1)
        tiny.draw[layers] = [n]
    if changed:
        tiny.notes.append(f"{layers}: {n}, laid out as the given config{whole} "
                          f"({', '.join(f'{k}: {v!r}' for k, v in changed.items())}): each kind of block it has appears")


__all__ = ["ALL_SPARSE", "ATTENTION_AT", "DRAWN", "DROPOUTS", "FIXED", "SSM_HEADS", "DraftError", "Tiny", "_global",
           "alternatives", "base_config", "build", "causal_lm_class", "listed_flags", "perturbed", "plan",
           "takes_mask", "tiny_size"]
