"""Structural perturbation: beside the factors (:mod:`nnatlas.testing.perturb`), a perturbed tiny case draws the
config's structural options, found by rule from the config class, never listed per family:

- dense-first counts (:data:`nnatlas.testing.shrink.DENSE_FIRST`): 0 up to 2, never the whole stack;
- a period of the stack that is 1 (:func:`stack_periods`: Qwen2-MoE's ``decoder_sparse_step``, ERNIE's
  ``moe_layer_interval``): 1 or 2 (where its offset fits under 2);
- an empty list of block indices that take the other kind (``mlp_only_layers``): empty, or the first block;
- per-block kind lists (an entry as long as the stack, two kinds or more): as given, reversed, or rotated by one
  (each kind still at least once);
- ``tie_word_embeddings``: tied or not;
- a sliding window on or off: ``use_sliding_window`` where the class has the flag, else a window of
  :data:`nnatlas.testing.shrink.WINDOW` (it bites on the drawn prompts) or the tiny config's own;
- bias flags (boolean entries named ``*bias``: ``attention_bias``, ``mlp_bias``, ``use_bias`` ...): on or off.

A spec narrows an option's choices or pins it, with its reason, under ``tiny.layouts``. A drawn value the config
class refuses (a combination it does not allow) is not drawn: the option keeps the tiny config's value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from .shrink import DENSE_FIRST, LAYERS, PERIOD, WINDOW

BIAS = re.compile(r"bias$")
LAID_PERIOD = re.compile(r"layer|moe|expert|sparse|attn|attention|mlp|dense")  # a period that lays out the blocks
INDEX_LIST = re.compile(r"(mlp|dense|moe|sparse|expert)\w*_layers$")  # block indices of one kind (mlp_only_layers)
NOT_LAYOUT = re.compile(r"router|gate|correction|e_score|aux|init|moe_bias")  # (a router's bias is a factor's business)


def _blocks(entries: Mapping[str, Any]) -> int | None:
    return next((entries[n] for n in LAYERS if isinstance(entries.get(n), int) and not isinstance(entries[n], bool)),
                None)


def structural_options(config: Any) -> dict[str, list[Any]]:
    """The config's structural options, entry -> the values a perturbed case draws from (the config's own first)."""
    entries = config.to_dict()
    n = _blocks(entries) or getattr(config, "num_hidden_layers", None)
    out: dict[str, list[Any]] = {}
    for k in DENSE_FIRST:
        v = entries.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and isinstance(n, int) and n > 1:
            out[k] = list(dict.fromkeys([v, *range(0, min(2, n - 1) + 1)]))
    if isinstance(n, int) and n > 1:
        moved = stack_periods(entries)
        for k, v in moved.items():
            if PERIOD.search(k) and PERIOD.sub("offset", k) not in moved:  # (a period whose offset moves too: not drawn)
                out[k] = [entries[k], v]
        for k, v in entries.items():
            if v == [] and INDEX_LIST.search(k):
                out[k] = [[], [0]]
    for k, v in entries.items():
        if isinstance(v, list) and isinstance(n, int) and len(v) == n and n > 1 and all(isinstance(x, str) for x in v) \
                and len(set(v)) > 1:
            arrangements = [v, v[::-1], v[1:] + v[:1]]
            out[k] = [list(x) for x in dict.fromkeys(tuple(a) for a in arrangements)]
    if isinstance(entries.get("tie_word_embeddings"), bool):
        out["tie_word_embeddings"] = [entries["tie_word_embeddings"], not entries["tie_word_embeddings"]]
    if isinstance(entries.get("use_sliding_window"), bool):
        out["use_sliding_window"] = [entries["use_sliding_window"], not entries["use_sliding_window"]]
    elif isinstance(entries.get("sliding_window"), int) and not isinstance(entries["sliding_window"], bool):
        out["sliding_window"] = list(dict.fromkeys([entries["sliding_window"], WINDOW]))
    for k, v in entries.items():
        if isinstance(v, bool) and BIAS.search(k) and not NOT_LAYOUT.search(k):
            out[k] = [v, not v]
    return {k: v for k, v in out.items() if len(v) > 1}


def stack_periods(entries: Mapping[str, Any]) -> dict[str, Any]:
    """Each period of the stack that is 1 (every block alike: Qwen2-MoE's decoder_sparse_step, Llama 4's
    interleave_moe_layer_step, Jamba's expert_layer_period as the drafter's tiny config has them) set to 2, as
    released checkpoints have them (Llama 4 Maverick, Jamba), its offset (``..._offset``) moved under it where it
    is 2 or more; a period above 1 already lays out two kinds of block and is kept."""
    out: dict[str, Any] = {}
    for k, v in entries.items():
        if _stack_period(k) and isinstance(v, int) and not isinstance(v, bool) and v == 1:
            out[k] = 2
            offset = PERIOD.sub("offset", k)
            if isinstance(entries.get(offset), int) and not isinstance(entries[offset], bool) and entries[offset] >= 2:
                out[offset] = 1
    return out


def moves_block_kinds(name: str) -> bool:
    """Whether the structural option ``name`` decides which blocks take which module (a dense-first count, a period
    of the stack, a list of block indices): a spec without kinds along it describes one of its values only."""
    return name in DENSE_FIRST or _stack_period(name) or bool(INDEX_LIST.search(name))


def _stack_period(name: str) -> bool:
    """A period (shrink's names: interval, period, freq, step, every) that lays out the blocks."""
    return bool(PERIOD.search(name) and LAID_PERIOD.search(name))


def draw_layout(config_class: Any, params: Mapping[str, Any], choose: Callable[[str, list[Any]], Any],
                rules: Mapping[str, Any] | None = None, family: str = "") -> dict[str, Any]:
    """``params`` with each structural option of the config they build drawn by ``choose(label, options)``
    (``rules``: the spec's ``tiny.layouts``, entry -> {options: [...]} or {pin: value}, each with its reason)."""
    rules = dict(rules or {})
    out = copy.deepcopy(dict(params))
    found = structural_options(config_class(**copy.deepcopy(out)))
    unknown = sorted(set(rules) - set(found) - set(config_class(**copy.deepcopy(out)).to_dict()))
    if unknown:
        raise ValueError(f"{family}: tiny.layouts names {', '.join(unknown)}, which is no structural option of "
                         f"{config_class.__name__} (its options: {', '.join(sorted(found)) or 'none'})")
    for k in sorted(set(found) | {k for k, r in rules.items() if "pin" in r}):
        rule = rules.get(k) or {}
        if "pin" in rule:
            value = copy.deepcopy(rule["pin"])
        else:
            options = [list(x) if isinstance(x, tuple) else x for x in rule.get("options", found.get(k, []))]
            if not options:
                continue
            value = choose(f"layout {k}", options)
        trial = {**out, k: copy.deepcopy(value)}
        try:
            built = config_class(**copy.deepcopy(trial))
        except Exception:  # noqa: BLE001 - a combination the class refuses: this option keeps the tiny config's value
            continue
        if _windowless_sliding(built):
            continue  # a sliding kind with no window (Qwen2's layer_types beside use_sliding_window off): no model runs it
        out = trial
    return out


def _windowless_sliding(config: Any) -> bool:
    """Whether a block kind list names sliding blocks while the config has no window for them (the class accepts
    it; the model's cache does not)."""
    entries = config.to_dict()
    kinds = [x for v in entries.values() if isinstance(v, list) for x in v if isinstance(x, str)]
    return any("sliding" in x for x in kinds) and "sliding_window" in entries and entries["sliding_window"] is None
