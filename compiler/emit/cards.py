"""A value as a family page's card says it, and where it sits: the anchors of hosts and values, the card of a
value (its layout, meaning, read words and load condition), the native names and paths a page prints beside the
standard ones (``native_path``, ``nnsight_path``), and the finders of the value a diagram's part shows (the value
read at a module's boundary, at a sibling's output, the block's own output, the vision tower's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..language.ir import FamilyIR, HostIR, ValueIR


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")


def value_anchor(h: HostIR, v: ValueIR, f: FamilyIR) -> str:
    return "v-" + slug(h.path) + _host_suffix(h, f) + "-" + v.name


def host_anchor(h: HostIR, f: FamilyIR) -> str:
    return "host-" + slug(h.path) + _host_suffix(h, f)


def _host_suffix(h: HostIR, f: FamilyIR) -> str:
    same = f.hosts_at(h.path)
    return f"-{same.index(h) + 1}" if len(same) > 1 else ""


@dataclass
class Card:
    """One value as the page describes it."""

    name: str
    layout: str
    meaning: str
    words: str
    where: str
    needs: str
    anchor: str
    cond: str = ""  # the name of the load condition (``processor``), "" when unconditional


# the words beside a pattern read inside eager attention (ValueIR.recomputed; runtime/trace/patterns.py)
RECOMPUTED_WORDS = ("read in eager attention, recomputed under sdpa and flex attention from the call's queries "
                    "and keys (equal to eager's in the generated tests, under each of them the class runs on CPU); "
                    "edits need attn_implementation='eager'")
# a read at eager's softmax in the host's own forward, with recompute: sdpa (Falcon)
SDPA_RECOMPUTED_WORDS = ("read at eager's softmax, recomputed under sdpa from the forward's scaled_dot_product_attention "
                         "call (equal to eager's in the generated tests); edits need attn_implementation='eager'")


def value_card(h: HostIR, v: ValueIR, f: FamilyIR) -> Card:
    return Card(v.name, v.layout.text, v.meaning, v.words, v.where,
                "" if v.recomputed or not v.needs else v.needs.says, value_anchor(h, v, f), v.needs.name if v.needs else "")


def native_name(f: FamilyIR, std_path: str) -> str:
    rename = dict(f.rename)
    natives = rename.get(std_path)
    if not natives:
        return ""
    last = natives[0].split(".")[-1]
    return "" if last == std_path.split(".")[-1] else last


def module_value(hosts: list[HostIR], module: str, side: str, f: FamilyIR) -> Card | None:
    for h in hosts:
        for v in h.values:
            r = v.read
            if r is not None and r.kind == "module" and r.module == ((module,) if module else ()) and \
                    r.side == side and not r.access[:1] == ("",):
                if side == "input" and r.param is not None:
                    continue
                return value_card(h, v, f)
    return None


def sibling_value(hosts: list[HostIR], module: str, f: FamilyIR) -> Card | None:
    """A value a child host reads at a sibling's output (``^.module.output``): what the stream receives."""
    for h in hosts:
        for v in h.values:
            r = v.read
            if r is not None and r.kind == "module" and r.up == 1 and r.module == (module,) and r.side == "output":
                return value_card(h, v, f)
    return None


def tower_value(hosts: list[HostIR], f: FamilyIR) -> Card | None:
    """The vision stack's own output as the encoder returns it (``tower_output``), drawn on the stack."""
    return next((value_card(h, v, f) for h in hosts for v in h.values if v.name == "tower_output"), None)


def input_cards(lay: HostIR | None, name: str, native: str, f: FamilyIR) -> list[Card]:
    """The block's values read at the input of its child ``name`` (``mlp_input``), by either name."""
    if lay is None:
        return []
    return [value_card(lay, v, f) for v in lay.values if v.read is not None and v.read.kind == "module" and not v.read.up
            and v.read.module in ((name,), (native,)) and v.read.side == "input"]



def own_output(h: HostIR, f: FamilyIR) -> Card | None:
    for v in h.values:
        r = v.read
        if r is not None and r.kind == "module" and not r.module and r.side == "output":
            return value_card(h, v, f)
    return None


def native_path(f: FamilyIR, std: str) -> str:
    """The first native module path of a standard one, from the root (``layers[i].self_attn`` → ``model.layers[i].self_attn``).

    A rename whose native holds a dot is a path from the root (``model.language_model.layers``); one
    without is the child's own name under its parent (``attn``)."""
    rename = dict(f.rename)
    if std == "model":
        return ""
    out = ""
    key = ""
    for seg in std.split("."):
        plain = seg.removesuffix("[i]")
        key = f"{key}.{plain}" if key else plain
        natives = rename.get(key)
        if natives and "." in natives[0]:
            out = natives[0]
        else:
            name = natives[0] if natives else plain
            out = f"{out}.{name}" if out else name
        if seg.endswith("[i]"):
            out += "[i]"
            key += "[i]"
    return out


def nnsight_path(f: FamilyIR, host: str, v: ValueIR) -> str:
    """Where nnsight reaches the tensor of a value read at a module boundary, else ""."""
    r = v.read
    if r is None or r.kind != "module" or r.up:
        return ""
    path = native_path(f, ".".join([host, *r.module]) if host != "model" else ".".join(r.module) or "model")
    base = f"model.{path}" if path else "model"
    side = "output" if r.side == "output" else ("input" if r.param is None else f"inputs[1][{r.param!r}]")
    acc = "".join(f"[{a!r}]" if isinstance(a, str) else f"[{a}]" for a in r.access if a != "")
    if r.side == "output" and any(isinstance(a, str) for a in r.access):
        acc = "".join(f".{a}" if isinstance(a, str) else f"[{a}]" for a in r.access)
    return f"{base}.{side}{acc}"

