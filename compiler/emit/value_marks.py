"""The marks of the index's matrix: for each family's value, on each of its loads (text-only, and image-text where a
value needs the processor), whether it is served, served only under some load, or not served.
"""

from __future__ import annotations

from ..language.ir import FamilyIR, ValueIR

# the loads the index's matrix marks a value on: every family has a text-only load; one whose values
# need the processor has an image-text load besides (its vision values are served there only)
TEXT_ONLY = "text-only"
IMAGE_TEXT = "image-text"
SERVED, SOME_LOAD, NOT_SERVED = "●", "⚠︎", "○"
MARK_WORDS = {SERVED: "served", SOME_LOAD: "served only under some load (the family's page says which)",
              NOT_SERVED: "not served"}


def loads(f: FamilyIR) -> tuple[str, ...]:
    """The loads the matrix gives a family a mark for: text-only, then image-text where a value needs it."""
    image = any(v.needs is not None and v.needs.name == "processor" for h in f.hosts for v in h.values)
    return (TEXT_ONLY, IMAGE_TEXT) if image else (TEXT_ONLY,)


def _mark(v: ValueIR, load: str) -> str:
    if v.needs is None or v.recomputed:
        return SERVED
    if v.needs.never:
        return NOT_SERVED
    if v.needs.name == "processor":  # what the page says: a text-only load serves no vision value
        return SERVED if load == IMAGE_TEXT else NOT_SERVED
    return SOME_LOAD


def load_marks(f: FamilyIR) -> dict[str, list[tuple[str, str]]]:
    """value name → [(load, mark)] for each of the family's loads: ● served, ⚠︎ served only under some
    attention, kernel or experts load, ○ not served on that load; the best over the hosts serving it (a
    text block's layer_output is served on every load though the vision block's needs the image-text one).
    A value missing on every host has no entry."""
    out: dict[str, list[tuple[str, str]]] = {}
    rank = {SERVED: 0, SOME_LOAD: 1, NOT_SERVED: 2}
    for load in loads(f):
        best: dict[str, str] = {}
        for h in f.hosts:
            for v in h.values:
                if v.missing is None:
                    m = _mark(v, load)
                    if v.name not in best or rank[m] < rank[best[v.name]]:
                        best[v.name] = m
        for name, m in best.items():
            out.setdefault(name, []).append((load, m))
    return out
