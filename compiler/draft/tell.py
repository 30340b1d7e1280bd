"""What in a config tells a stack's differing blocks apart, written as the spec's ``when:`` conditions: a per-block
list of kinds (``layer_types``, ``mlp_layer_types``), a dense-first count (``i < first_k_dense_replace``), a list of
block indices (``count(moe_layers, i) > 0``) or a period (``i % expert_layer_period == expert_layer_offset``,
``(i + 1) % decoder_sparse_step == 0``, with ``mlp_only_layers`` left out). Each condition is evaluated by the spec
language's own evaluator on the config, block by block, and proposed only when it selects exactly its blocks."""

from __future__ import annotations

import re
from typing import Any

from ..language.expr import compile_when, evaluate
from .measure import DENSE_FIRST, KIND_LISTS, LAYER_TYPES
from .tiny_config import PERIOD

Groups = dict[Any, list[int]]  # a signature -> the blocks that have it


def partitions(types: list[str], sigs: Groups) -> bool:
    """Whether every block of one kind in ``types`` has one signature (the kinds tell the differing blocks apart)."""
    return all(len({types[i] for i in blocks}) == 1 for blocks in sigs.values()) and \
        all(len({s for s, blocks in sigs.items() if t in {types[i] for i in blocks}}) == 1 for t in set(types))


def kind_lists(config: Any, n: int) -> list[tuple[str, list[str]]]:
    """The config's per-block lists of each block's kind (two kinds or more), by name."""
    out = []
    for name in (*LAYER_TYPES, *KIND_LISTS):
        listed = getattr(config, name, None)
        if isinstance(listed, (list, tuple)) and len(listed) == n and len(set(map(str, listed))) > 1:
            out.append((name, [str(x) for x in listed]))
    return out


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def dense_first(config: Any, sigs: Groups, n: int) -> tuple[str, int] | None:
    """(entry, k) of a dense-first count whose blocks [0, k) and [k, n) are the two signatures of the stack."""
    for name in DENSE_FIRST:
        k = getattr(config, name, None)
        if isinstance(k, int) and not isinstance(k, bool) and 0 < k < n and sorted(map(sorted, sigs.values())) == sorted([list(range(k)), list(range(k, n))]):
            return name, k
    return None


def selects(config: Any, when: str, n: int) -> list[int] | None:
    """The blocks ``when`` selects on ``config`` (the spec language's evaluator), or None where it does not apply."""
    try:
        c = compile_when(when)
        return [i for i in range(n) if evaluate(c, lambda name: getattr(config, name, None), i)]
    except Exception:  # noqa: BLE001 - a name the config lacks, a type it cannot compare: no condition of this config
        return None


def _negated(when: str) -> str:
    if " and " not in when and when.count(" == ") == 1:
        return when.replace(" == ", " != ")
    if " and " not in when and when.count(" > 0") == 1:
        return when.replace(" > 0", " == 0")
    return f"not ({when})"


def conditions(config: Any, n: int, prefer: re.Pattern[str]) -> list[str]:
    """Candidate conditions for one kind of two: index lists, periods (with their offsets), each alone and beside
    a dense-first count or an index list the kind's blocks leave out; the entries ``prefer`` names first."""
    entries = {**{k: v for k, v in config.to_dict().items()}}
    ranked = sorted(entries, key=lambda k: not prefer.search(k))
    indices = [k for k in ranked if isinstance(entries[k], list) and entries[k] and all(_int(x) for x in entries[k])
               and entries[k] == sorted(set(entries[k])) and entries[k][-1] < n and len(entries[k]) < n]
    firsts = [k for k in DENSE_FIRST if _int(entries.get(k)) and entries[k] > 0]
    out = [f"count({k}, i) > 0" for k in indices]
    for p in (k for k in ranked if PERIOD.search(k) and _int(entries[k]) and entries[k] > 1):
        stem = PERIOD.sub("", p)
        offsets = [k for k in entries if "offset" in k and _int(entries[k]) and PERIOD.sub("", k.replace("offset", ""))
                   == stem.replace("offset", "")]
        offsets += [k for k in entries if "offset" in k and _int(entries[k]) and k not in offsets]
        bases = [f"i % {p} == {o}" for o in offsets] + [f"(i + 1) % {p} == 0", f"i % {p} == 0"]
        out += bases
        out += [f"{b} and i >= {k}" for b in bases for k in firsts]
        out += [f"{b} and count({k}, i) == 0" for b in bases for k in indices]
    return out


def two_kinds(config: Any, sigs: Groups, n: int, prefer: re.Pattern[str]) -> dict[Any, str] | None:
    """A condition per signature of a stack whose blocks have two (the dense-first count's, an index list's or a
    period's), each selecting exactly its blocks; None when no entry of the config tells them apart."""
    if len(sigs) != 2:
        return None
    (a, blocks_a), (b, blocks_b) = sigs.items()
    first = dense_first(config, sigs, n)
    if first is not None:
        name, k = first
        return {a: f"i < {name}", b: f"i >= {name}"} if 0 in blocks_a else {a: f"i >= {name}", b: f"i < {name}"}
    for when in conditions(config, n, prefer):
        got = selects(config, when, n)
        for s, blocks, other in ((a, blocks_a, b), (b, blocks_b, a)):
            if got == sorted(blocks) and selects(config, _negated(when), n) == sorted(sigs[other]):
                return {s: when, other: _negated(when)}
    return None


__all__ = ["Groups", "conditions", "dense_first", "kind_lists", "partitions", "selects", "two_kinds"]
