"""The tiny config of a model type whose tiny model does not build as planned: what its config class leaves unset,
by default, that its model needs (a checkpoint's config sets it), set, each with a note in the spec's ``tiny:``.

Each repair is tried only while the tiny model does not build, and only where its condition holds; when the model
still does not build after them all, every repair is taken back (the build's own error is the row's reason). A model
that builds runs one forward only where its config leaves a ``FORWARD_UNSET`` value None (set where that fails)."""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any

Tiny = Any  # tiny.Tiny (tiny.py imports this module: no import back)

# sizes a config class may leave None by default that its model still reads (a checkpoint's config sets them):
# Dots1's expert counts (every block a mixture, n_routed_experts None), Qwen4-Exp's token indexer (built on every
# attention block, its sizes None). The indexer's: one key head (Qwen4-Exp refuses more), a width that holds the
# attention's rotary part at either drawn head width, a budget of two compressed blocks.
UNSET: dict[str, Any] = {
    "n_routed_experts": 4, "num_local_experts": 4, "num_experts": 4, "moe_num_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
    "indexer_compress_ratio": 4,
}
# values a model reads unguarded that its config class leaves None by default (DBRX's attention clamps its fused
# query/key/value projection by attn_config.clip_qkv: torch.clamp(min=None, max=None) fails; dbrx-base sets 8): a
# bound that clamps a tiny model's projections
FORWARD_UNSET: dict[str, Any] = {"clip_qkv": 0.5}
# the sizes of a config's own sub-configs (DBRX's attn_config and ffn_config, no model type of their own), beside
# the top config's FIXED and INTERMEDIATE ones: one key head (a divisor of every drawn head count), top 2 experts
SUB_SIZES: dict[str, Any] = {"kv_n_heads": 1, "moe_top_k": 2}
# an expert count unset builds no mixture unless the config sizes one (Gemma 4's num_experts None: a dense model)
MIXTURE_WIDTHS = ("moe_intermediate_size", "expert_ffn_hidden")


def builds(tiny: Tiny) -> Exception | None:
    """None when the tiny model (the first draw) builds, else the exception: built on the meta device (no weights),
    and, where that fails, on the CPU (an init the meta device cannot run)."""
    import torch
    import transformers

    def attempt(device: str) -> Exception | None:
        try:
            config = getattr(transformers, tiny.config_class)(**copy.deepcopy(tiny.first()))
            with torch.device(device):
                getattr(transformers, tiny.model_class)(config)
        except Exception as e:  # noqa: BLE001 - the build's reason
            return e
        return None

    return attempt("meta") and attempt("cpu")


def own_sub_configs(base: Any, fixed: dict[str, Any], checkpoint: bool, tiny_sizes: dict[str, Any]) -> list[str]:
    """The config's own sub-configs (no model type of their own: DBRX's attn_config, ffn_config) as tiny dicts in
    ``fixed``: their sizes shrunk (``tiny_sizes``, the top config's fixed ones, and ``SUB_SIZES``), and, from a
    checkpoint (``checkpoint``), their other scalars that differ from their class's defaults kept; a note per changed
    size."""
    notes = []
    for key in getattr(base, "sub_configs", None) or {}:
        sub = getattr(base, key, None)
        if sub is None or not hasattr(sub, "to_dict") or getattr(sub, "model_type", None):
            continue
        given, own = sub.to_dict(), {}
        if checkpoint:
            defaults = type(sub)().to_dict()
            own = {k: v for k, v in given.items() if isinstance(v, (str, float, bool)) and defaults.get(k) != v
                   and k not in ("model_type", "transformers_version", "_name_or_path", "dtype")}
        sizes = {**tiny_sizes, **SUB_SIZES}
        for k, v in given.items():
            if k in sizes and isinstance(v, int) and not isinstance(v, bool):
                own[k] = sizes[k]
                if v != sizes[k]:
                    notes.append(f"{key}.{k}: {sizes[k]} (the default's {v})")
        if own:
            fixed[key] = {**(fixed[key] if isinstance(fixed.get(key), dict) else {}), **own}
    return notes


def _runs(tiny: Tiny) -> Exception | None:
    """None when the tiny model runs a forward (on the CPU), else the exception."""
    import torch
    import transformers

    try:
        config = getattr(transformers, tiny.config_class)(**copy.deepcopy(tiny.first()))
        with torch.no_grad():
            getattr(transformers, tiny.model_class)(config).float().eval()(input_ids=torch.randint(4, 16, (1, 5)))
    except Exception as e:  # noqa: BLE001 - the forward's reason
        return e
    return None


def _forward_unset(tiny: Tiny) -> None:
    """``FORWARD_UNSET`` values the tiny config (or an own sub-config of it) leaves None, set where the forward fails
    without them."""
    probe = _probe(tiny)
    if probe is None:
        return
    where = {k: sub for k in (getattr(probe, "sub_configs", None) or {})
             if (sub := getattr(probe, k, None)) is not None and not getattr(sub, "model_type", None)}
    unset = [(k, n) for k, sub in [(None, probe), *where.items()] for n in FORWARD_UNSET
             if n in sub.to_dict() and getattr(sub, n) is None]
    if not unset or _runs(tiny) is None:
        return
    kept = copy.deepcopy(tiny.config)
    for key, name in unset:
        if key is None:
            tiny.config[name] = FORWARD_UNSET[name]
        else:
            tiny.config[key] = {**(tiny.config.get(key) or {}), name: FORWARD_UNSET[name]}
    why = _runs(tiny)
    if why is not None:
        tiny.config = kept
        return
    tiny.notes.append(", ".join(f"{k + '.' if k else ''}{n}: {FORWARD_UNSET[n]!r}" for k, n in unset)
                      + ": the config class leaves it unset (None), which the model reads unguarded (its forward "
                      "fails without it); a checkpoint's config sets it")


def repair(base: Any, tiny: Tiny) -> None:
    """Make the tiny model build where its config class's defaults leave something unset (see the module's note)."""
    error = builds(tiny)
    if error is None:
        _forward_unset(tiny)
        return
    kept = (copy.deepcopy(tiny.config), copy.deepcopy(tiny.draw), list(tiny.notes))
    for step in (_unset_sizes, _layer_kinds, _rope_per_kind, _sub_config_reads, _longer_stack):
        if step(base, tiny, error):
            error = builds(tiny)
            if error is None:
                _forward_unset(tiny)
                return
    tiny.config, tiny.draw, tiny.notes = kept


def _probe(tiny: Tiny) -> Any:
    """The tiny config (the first draw), or None when the config class refuses it."""
    import transformers

    try:
        return getattr(transformers, tiny.config_class)(**copy.deepcopy(tiny.first()))
    except Exception:  # noqa: BLE001 - refused: no repair here knows why
        return None


def _unset_sizes(base: Any, tiny: Tiny, error: Exception) -> bool:
    """Sizes the tiny config leaves None (the class's default; a checkpoint's own are not kept, being full size)."""
    probe = _probe(tiny)
    listed = base.to_dict()
    mixture = any(isinstance(listed.get(n), int) and not isinstance(listed.get(n), bool) for n in MIXTURE_WIDTHS)
    unset = {n: v for n, v in UNSET.items() if n in listed and probe is not None and getattr(probe, n, 0) is None
             and n not in tiny.config and (mixture or not n.endswith(("experts", "experts_per_tok")))}
    if not unset:
        return False
    tiny.config.update(unset)
    tiny.notes.append(f"{', '.join(unset)}: the config class leaves {'it' if len(unset) == 1 else 'them'} unset "
                      "(None), which its model does not build with; a checkpoint's config sets them")
    return True


def _layer_kinds(base: Any, tiny: Tiny, error: Exception) -> bool:
    """layer_types None in the tiny config, and not derived (LFM2-MoE's class default; its checkpoints list them):
    each kind of block of the checkpoint's list once, else each kind the modeling code names."""
    import transformers
    from transformers.configuration_utils import ALLOWED_LAYER_TYPES

    probe = _probe(tiny)
    if "layer_types" not in base.to_dict() or "layer_types" in tiny.config or probe is None \
            or getattr(probe, "layer_types", None) is not None:
        return False
    given = base.to_dict()["layer_types"]
    if isinstance(given, list) and given:
        kinds, whence = list(dict.fromkeys(given)), "each kind of block of the checkpoint's list, once"
    else:
        source = inspect.getsource(inspect.getmodule(getattr(transformers, tiny.model_class)))  # type: ignore[arg-type]
        kinds = sorted({k for k in re.findall(r"""["'](\w+)["']""", source) if k in ALLOWED_LAYER_TYPES})
        whence = "the config class leaves them unset (None) and derives none: each kind of block its modeling code " \
                 "names, once"
    if not kinds:
        return False
    types = kinds if len(kinds) > 1 else kinds * 2
    tiny.config["layer_types"] = types
    tiny.draw[tiny.names["layers"]] = [len(types)]
    tiny.notes.append(f"layer_types: {types}: {whence}")
    return True


def _rope_per_kind(base: Any, tiny: Tiny, error: Exception) -> bool:
    """Rotary parameters keyed by kind of block that the default config leaves empty (Cohere Compass: a checkpoint's
    give each kind its own, or None for a block without): each kind the default rotary (the class's default_theta)."""
    import transformers

    if not isinstance(error, KeyError) or "rope_parameters" in tiny.config:
        return False
    try:
        probe = getattr(transformers, tiny.config_class)(**copy.deepcopy(tiny.first()))
    except Exception:  # noqa: BLE001 - not this repair's case
        return False
    kinds = list(dict.fromkeys(getattr(probe, "layer_types", None) or ()))
    rope = getattr(probe, "rope_parameters", None)
    if not (error.args and error.args[0] in kinds and isinstance(rope, dict) and not set(rope) & set(kinds)):
        return False
    theta = float(getattr(probe, "default_theta", 10000.0))
    tiny.config["rope_parameters"] = {k: {"rope_type": "default", "rope_theta": theta} for k in kinds}
    tiny.notes.append(f"rope_parameters: the default rotary (rope_theta {theta:g}) for each kind of block: the config "
                      "class leaves them empty, keyed by kind, which its model does not build with")
    return True


def _sub_config_reads(base: Any, tiny: Tiny, error: Exception) -> bool:
    """An attribute the model reads from a sub-config whose class no longer declares it (DBRX's attention reads
    attn_config.rope_theta; checkpoints' configs carry it): the value the whole config holds for it."""
    import transformers

    m = re.match(r"'(\w+)' object has no attribute '(\w+)'", str(error))
    if not isinstance(error, AttributeError) or m is None:
        return False
    try:
        probe = getattr(transformers, tiny.config_class)(**copy.deepcopy(tiny.first()))
    except Exception:  # noqa: BLE001 - not this repair's case
        return False
    key = next((k for k in (getattr(probe, "sub_configs", None) or {})
                if type(getattr(probe, k, None)).__name__ == m.group(1)), None)
    rope = getattr(probe, "rope_parameters", None)
    value = rope.get(m.group(2)) if isinstance(rope, dict) else None
    value = getattr(probe, m.group(2), None) if value is None else value
    if key is None or value is None:
        return False
    given = tiny.config.get(key)
    tiny.config[key] = {**(given if isinstance(given, dict) else {}), m.group(2): value}
    tiny.notes.append(f"{key}: {{{m.group(2)}: {value!r}}}: the model reads it from the {key}, whose class does not "
                      f"declare it (a checkpoint's config carries it); the whole config's value")
    return True


def _longer_stack(base: Any, tiny: Tiny, error: Exception) -> bool:
    """A stack too short to build (Zamba ties its shared attention block's weights across its hybrid blocks, and
    refuses a stack with one): the fewest more blocks that build."""
    layers = tiny.names["layers"]
    options = tiny.draw.get(layers)
    if not isinstance(options, list) or "layer_types" in tiny.config:
        return False
    start = max(options)
    for n in range(start + 1, 13):
        tiny.draw[layers] = [n]
        if builds(tiny) is None:
            tiny.notes.append(f"{layers}: {n}: the model does not build from a stack of {start} blocks "
                              f"({type(error).__name__}: {str(error).splitlines()[0][:100]})")
            return True
    tiny.draw[layers] = options
    return False
