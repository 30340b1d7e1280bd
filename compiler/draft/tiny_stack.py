"""The tiny stack beyond the size table: how many blocks (every kind of block the default config has), the
sections, loops and per-layer overrides a stack may have, a composite config's other parts, and a fixed size the
config class refuses."""

from __future__ import annotations

import re
from typing import Any

from .tiny_config import (
    FIXED,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    Tiny,
    _first,
    _global,
    causal_lm_class,
)


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
