"""What a family page draws, computed from the IR: the stack, each block kind's parts, the cards.

Pure data for the templates (``page.html.j2``, ``page.md.j2``, ``index.html.j2``): no HTML here,
so everything that came from a spec is escaped by the templates' autoescape in one place.

Which hosts apply to which block comes from the printout facts (computed by transformers on the
first recorded checkpoint, ``compiler/emit/printouts.py``) when there are any; otherwise the hosts'
``when:`` conditions are evaluated here on the first checkpoint's recorded config, or on the tiny
config, by ``expr.evaluate``: a walk of the same whitelisted expression tree, never ``eval``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nnatlas.tree.foreign_names import SAE_POINTS, TRANSFORMER_LENS

from ..language import expr
from ..language.expr import Compiled
from ..language.ir import DEFAULT_BLOCK, DEFAULT_TEXT, MAX_BLOCKS, FamilyIR, HostIR, ValueIR, config_value

MAX_KINDS = 8
NOT_SERVED_TEXT = "not served"  # a config cell whose standard name the spec makes unavailable(...)


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


@dataclass
class Part:
    id: str
    std: str  # the standard name drawn
    native: str  # the native name when it differs, else ""
    role: str  # input / embed / stack / norm / mixer / mlp / add / head / output / vision
    path: str  # the standard path (layers[i].self_attn)
    cls: str  # the native class, for hosts
    value: Card | None
    others: list[Card] = field(default_factory=list)
    count: str = ""  # "× 48" on a stack
    subtitle: str = ""
    note: str = ""  # a word drawn under the value (``at image_token_mask``)


@dataclass
class Kind:
    index: int
    label: str
    blocks: list[int]
    parts: list[Part]
    identities: list[str]


@dataclass
class Stack:
    """One stack of blocks (``layers``, ``vision.layers``) with its block kinds."""

    name: str
    prefix: str  # "" for the text model, "vision" for the vision encoder
    chain: list[Part]
    kinds: list[Kind]
    blocks: list[int]  # block i → its kind's index
    title: str




def evaluate(c: Compiled, config: dict[str, Any], i: int | None = None) -> Any:
    """Compute a config or ``when`` expression on a plain config mapping (no eval: see expr.evaluate)."""
    return expr.evaluate(c, lambda name: config_value(config, name), i)


def _fallback_config(f: FamilyIR) -> list[dict[str, Any]]:
    configs = [dict(c.config) for c in f.checkpoints]
    tiny = dict(f.tiny.config)
    for d in f.tiny.draw:
        if d.choices is not None:
            tiny[d.name] = d.choices[-1]
        elif d.expr is not None:
            try:
                tiny[d.name] = evaluate(d.expr, tiny)
            except Exception:  # noqa: BLE001
                pass
    return [*configs, tiny]


# the words beside a pattern read inside eager attention (ValueIR.recomputed; runtime/trace/patterns.py)
RECOMPUTED_WORDS = ("read in eager attention, recomputed under sdpa and flex attention from the call's queries "
                    "and keys (equal to eager's in the generated tests, under each of them the class runs on CPU); "
                    "edits need attn_implementation='eager'")
# a read at eager's softmax in the host's own forward, with recompute: sdpa (Falcon)
SDPA_RECOMPUTED_WORDS = ("read at eager's softmax, recomputed under sdpa from the forward's scaled_dot_product_attention "
                         "call (equal to eager's in the generated tests); edits need attn_implementation='eager'")


def _card(h: HostIR, v: ValueIR, f: FamilyIR) -> Card:
    return Card(v.name, v.layout.text, v.meaning, v.words, v.where,
                "" if v.recomputed or not v.needs else v.needs.says, value_anchor(h, v, f), v.needs.name if v.needs else "")


def _native(f: FamilyIR, std_path: str) -> str:
    rename = dict(f.rename)
    natives = rename.get(std_path)
    if not natives:
        return ""
    last = natives[0].split(".")[-1]
    return "" if last == std_path.split(".")[-1] else last


def _module_value(hosts: list[HostIR], module: str, side: str, f: FamilyIR) -> Card | None:
    for h in hosts:
        for v in h.values:
            r = v.read
            if r is not None and r.kind == "module" and r.module == ((module,) if module else ()) and \
                    r.side == side and not r.access[:1] == ("",):
                if side == "input" and r.param is not None:
                    continue
                return _card(h, v, f)
    return None


def _sibling_value(hosts: list[HostIR], module: str, f: FamilyIR) -> Card | None:
    """A value a child host reads at a sibling's output (``^.module.output``): what the stream receives."""
    for h in hosts:
        for v in h.values:
            r = v.read
            if r is not None and r.kind == "module" and r.up == 1 and r.module == (module,) and r.side == "output":
                return _card(h, v, f)
    return None


def _tower(hosts: list[HostIR], f: FamilyIR) -> Card | None:
    """The vision stack's own output as the encoder returns it (``tower_output``), drawn on the stack."""
    return next((_card(h, v, f) for h in hosts for v in h.values if v.name == "tower_output"), None)


def _input_cards(lay: HostIR | None, name: str, native: str, f: FamilyIR) -> list[Card]:
    """The block's values read at the input of its child ``name`` (``mlp_input``), by either name."""
    if lay is None:
        return []
    return [_card(lay, v, f) for v in lay.values if v.read is not None and v.read.kind == "module" and not v.read.up
            and v.read.module in ((name,), (native,)) and v.read.side == "input"]


def _sides(text: str) -> tuple[str, str] | None:
    """The two sides of an identity ``a == b`` as written, None for another relation."""
    if text.count("==") != 1:
        return None
    a, b = text.split("==")
    return a.strip(), b.strip()


def _equations(lay: HostIR) -> Iterator[tuple[str, str]]:
    """Each ``a == b`` identity of the host, as (a, b) and then (b, a)."""
    for ident in lay.identities:
        sides = _sides(ident.text)
        if sides is not None:
            yield sides
            yield sides[::-1]


def _sum_value(lay: HostIR, stream: str, branch: list[str], drawn: set[str], f: FamilyIR) -> Card | None:
    """The value a block identity names as the sum of the stream and the branch drawn since the last add
    (``layer_input + self_attn.attention_output == layer_mid``), when no module's input reads it."""
    names = {v.name: v for v in lay.values if v.missing is None}
    for value, total in _equations(lay):
        terms = [t.strip() for t in total.split("+")]
        if value not in names or value in drawn or len(terms) < 2 or stream not in terms:
            continue
        rest = [t for t in terms if t != stream]
        if rest and all(t.split(".")[0] in branch for t in rest):
            return _card(lay, names[value], f)
    return None


def _join_branches(items: list[str], lay: HostIR, children: dict[str, HostIR], subbed: dict[str, ValueIR],
                   joins: dict[str, tuple[str, str]]) -> list[str]:
    """A branch a block identity adds into a module's input (zamba2's hybrid block:
    ``mamba_decoder.input_layernorm.input == layer_input + shared_block_output``, the value read at
    ``linear.output`` and ``linear.input == shared_transformer.mlp.mlp_raw_output``): drawn before that
    module as the child hosts that feed the value's module, the module with the value, and the add."""
    names = {v.name: v for v in lay.values if v.missing is None}
    for target, total in _equations(lay):
        terms = [t.strip() for t in total.split("+")]
        if not target.endswith(".input") or len(terms) < 2:
            continue
        into = target.removesuffix(".input")
        # the part drawn for that module: the norm read at its output
        at = next((x for x in items if x.startswith("sub:") and subbed[x[4:]].read is not None
                   and ".".join(subbed[x[4:]].read.module) == into), None)  # type: ignore[union-attr]
        if at is None and into in items:
            at = into
        joined = [t for t in terms if t in names and t != "layer_input"]
        if at is None or not joined:
            continue
        branch: list[str] = []
        for value in joined:
            r = names[value].read
            if r is None or r.kind != "module" or len(r.module) != 1 or r.side != "output" or r.access:
                continue
            mod = r.module[0]
            feeders = []  # the child hosts whose values an identity puts at the module's input
            for a, b in _equations(lay):
                if a == f"{mod}.input" and b.split(".")[0] in children:
                    feeders.append(b.split(".")[0])
            branch += [f"host:{h}" for h in dict.fromkeys(feeders)] + [mod if mod not in children else f"host:{mod}"]
        if not branch:
            continue
        joins[joined[0]] = (total, into)
        items = [x for x in items if x not in branch]
        pos = items.index(at)
        items[pos:pos] = [*branch, f"join:{joined[0]}"]
    return items


def _own_output(h: HostIR, f: FamilyIR) -> Card | None:
    for v in h.values:
        r = v.read
        if r is not None and r.kind == "module" and not r.module and r.side == "output":
            return _card(h, v, f)
    return None


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


class PageModel:
    def __init__(self, f: FamilyIR, facts: dict[str, Any] | None):
        self.f = f
        self.facts = facts or {}
        ckpts = self.facts.get("checkpoints") or []
        self.first = ckpts[0] if ckpts else None
        self._ids: set[str] = set()

    def uid(self, base: str) -> str:
        base = slug(base)
        out, k = base, 2
        while out in self._ids:
            out, k = f"{base}-{k}", k + 1
        self._ids.add(out)
        return out

    # ---- which hosts apply to which block ----
    def block_hosts(self, stack: str) -> list[list[int]]:
        if self.first and stack in self.first.get("blocks", {}):
            return [list(x) for x in self.first["blocks"][stack]]
        hosts = [(k, h) for k, h in enumerate(self.f.hosts) if h.path.startswith(f"{stack}[i]")]
        n = min(self.count(stack) or 1, MAX_BLOCKS)
        rows = []
        for i in range(n):
            row = []
            for k, h in hosts:
                if h.when is None or self._when(h, i):
                    row.append(k)
            rows.append(row)
        return rows

    def _when(self, h: HostIR, i: int) -> bool:
        assert h.when is not None
        for cfg in _fallback_config(self.f):
            try:
                return bool(evaluate(h.when, cfg, i))
            except Exception:  # noqa: BLE001 - this config does not say; try the next
                continue
        return True

    def count(self, stack: str) -> int | None:
        if self.first and stack in self.first.get("blocks", {}):
            return len(self.first["blocks"][stack])
        name = "num_layers" if stack == "layers" else f"{stack.split('.')[0]}_num_layers"
        if self.first and isinstance(self.first.get("normalized", {}).get(name), int):
            return int(self.first["normalized"][name])
        for key, c, _ in self.f.config:
            if key == name:
                for cfg in _fallback_config(self.f):
                    try:
                        v = evaluate(c, cfg)
                    except Exception:  # noqa: BLE001
                        continue
                    if isinstance(v, int):
                        return v
        return None

    # ---- the drawing ----
    def stacks(self) -> list[Stack]:
        out = [self.stack("layers", "")]
        if any(h.path == "vision" or h.path.startswith("vision.") for h in self.f.hosts):
            out.append(self.stack("vision.layers", "vision"))
        if self.serves_processor():  # the page's own load serves these: no ⚠︎ on their cards
            for s in out:
                for p in [*s.chain, *(p for k in s.kinds for p in k.parts)]:
                    for c in [p.value, *p.others]:
                        if c is not None and c.cond == "processor":
                            c.needs = ""
        return [s for s in out if s is not None]

    def stack(self, name: str, prefix: str) -> Stack:
        f = self.f
        rows = self.block_hosts(name)
        keys: list[tuple[int, ...]] = []
        blocks = []
        for row in rows:
            key = tuple(row)
            if key not in keys:
                keys.append(key)
            blocks.append(keys.index(key))
        parts_spec = f.diagram.block if not prefix else f.diagram.vision_block
        kinds = []
        for k, key in enumerate(keys[:MAX_KINDS]):
            hosts = [f.hosts[x] for x in key]
            kinds.append(self.kind(k, name, hosts, parts_spec, [i for i, b in enumerate(blocks) if b == k]))
        blocks = [min(b, MAX_KINDS - 1) for b in blocks]
        chain = self.chain(name, prefix, len(rows))
        title = "the residual stream" if not prefix else "the vision encoder"
        return Stack(name, prefix, chain, kinds, blocks, title)

    def chain(self, stack: str, prefix: str, n: int) -> list[Part]:
        f = self.f
        rename = {k for k, _ in f.rename}
        model_hosts = list(f.hosts_at("model"))
        parts: list[Part] = []
        if not prefix:
            items = [x for x in f.diagram.text if x in rename or x == "layers" or f.diagram.text != DEFAULT_TEXT]
            for item in items:
                if item == "layers":
                    parts.append(self.stack_part(stack, n))
                    continue
                role = {"embed_tokens": "embed", "norm": "norm", "lm_head": "head"}.get(item, "module")
                parts.append(Part(self.uid(f"c-{item}"), item, _native(f, item), role, item, "",
                                  _module_value(model_hosts, item, "output", f)))
            out = next((_card(h, v, f) for h in model_hosts for v in h.values if v.name == "logits"), None)
            if out is not None:
                parts.append(Part(self.uid("c-logits"), "logits", "", "output", "model", "", out,
                                  subtitle="the output"))
            return parts
        vhosts = list(f.hosts_at(prefix))
        items = list(f.diagram.vision)
        if not items:
            for h in vhosts:
                for v in h.values:
                    if v.read is not None and v.read.kind == "module" and v.read.module and v.read.side == "output":
                        m = v.read.module[0]
                        if m not in items and m != "layers":
                            items.append(m)
            if any(h.path.startswith(f"{stack}[i]") for h in f.hosts):
                items.insert(min(1, len(items)), "layers")
        derived_chain = not f.diagram.vision
        if derived_chain and "projector" in rename and "projector" not in items:
            items.append("projector")
        if derived_chain:
            parts.append(Part(self.uid(f"c-{prefix}-image"), "image", "", "input", prefix, "", None,
                              subtitle="pixel_values, image_grid_thw"))
        for item in items:
            if item == "layers":
                parts.append(self.stack_part(stack, n, _tower(vhosts, f)))
                continue
            if item == "projector" and item in rename and f"{prefix}.{item}" not in rename:
                parts.append(Part(self.uid("c-projector"), "projector", _native(f, "projector"), "vision", "projector",
                                  "", None, subtitle="the merger: each 2 × 2 block of patches to one image token"
                                  if "merger" in dict(f.rename)["projector"][0] else "to the text model's width"))
                continue
            full = f"{prefix}.{item}"
            card = _module_value(vhosts, item, "output", f) or _module_value(model_hosts, item, "output", f)
            path = full if (full in rename or any(h.path == full for h in f.hosts)) else item
            parts.append(Part(self.uid(f"c-{full}"), item, _native(f, path), "vision", path, "", card))
        if derived_chain:
            feats = next(((h, v) for h in vhosts for v in h.values if v.name == "image_features"), None)
            if feats is not None:
                parts.append(Part(self.uid(f"c-{prefix}-image_features"), "image_features", "", "vision", prefix, "",
                                  _card(*feats, f), note="at the scatter"))
                entry = next((_card(h, v, f) for h in f.hosts_at("layers[i]") for v in h.values
                              if v.name == "layer_input"), None)
                parts.append(Part(self.uid(f"c-{prefix}-into-layers"), "layers[0].input", "", "stack", "layers[i]", "",
                                  entry, note="at image_token_mask"))
        return parts

    def stack_part(self, stack: str, n: int, card_: Card | None = None) -> Part:
        f = self.f
        hosts = list(f.hosts_at(f"{stack}[i]"))
        card = card_ or (_own_output(hosts[0], f) if hosts else None)
        cls = ", ".join(dict.fromkeys(h.cls for h in hosts))
        leaf = stack.split(".")[-1]
        return Part(self.uid(f"c-{stack}"), leaf, _native(f, stack), "stack", f"{stack}[i]", cls, card,
                    count=f"× {n}" if n else "")

    def kind(self, k: int, stack: str, hosts: list[HostIR], spec: tuple[str, ...], blocks: list[int]) -> Kind:
        f = self.f
        layer_hosts = [h for h in hosts if h.path == f"{stack}[i]"]
        children = {h.path[len(stack) + 4:]: h for h in hosts
                    if h.path.startswith(f"{stack}[i].") and "." not in h.path[len(stack) + 4:]}
        named = {x.partition(" if ")[0] for x in spec} - {"mixer", "add"}
        mixers = [c for c in children if c not in named]  # a host named mixer (Mamba's) is a mixer too
        parts: list[Part] = []
        lay = layer_hosts[0] if layer_hosts else None
        served = {v.name for h in hosts for v in h.values if v.missing is None}
        items: list[str] = []
        for item in spec:
            item, _, cond = item.partition(" if ")
            if cond and cond.strip() not in served:
                continue  # a part of another kind (gemma4's per-layer input branch)
            if item == "mixer":
                items.extend(f"host:{m}" for m in mixers)
            else:
                items.append(item)
        subbed: dict[str, ValueIR] = {}  # "sub:NAME" items: a norm read inside a wrapper (dbrx's norm_attn_norm)
        joins: dict[str, tuple[str, str]] = {}  # "join:V" items: the add of a branch's V into a module's input
        def read_at(*names: str) -> str | None:
            assert lay is not None
            v = next((v for v in lay.values if v.name in names and v.read is not None
                      and v.read.kind == "module" and v.read.module and not v.read.up
                      and v.read.side == "output"), None)
            if v is None or v.read is None:
                return None
            if len(v.read.module) == 1 and not v.read.access:
                return v.read.module[0]
            subbed[v.name] = v
            return f"sub:{v.name}"
        if spec != DEFAULT_BLOCK and lay is not None:
            # a spec's own order: a norm it names whose value is read at an item of it (LongCat-Flash's
            # input_layernorm.0) is drawn as that item
            for name, values in (("input_layernorm", ("attention_norm_output", "mixer_norm_output")),
                                 ("post_attention_layernorm", ("mlp_norm_output",))):
                sub = read_at(*values) if name in items else None
                read = subbed[sub[4:]].read if sub and sub.startswith("sub:") else None
                if sub and read is not None and len(read.module) == 2 and read.module[0] == name \
                        and read.module[1].isdigit():
                    items = [sub if x == name else x for x in items]
        if spec == DEFAULT_BLOCK and lay is not None:
            # the default's norms are the modules the block's own values read (jamba's pre_ff_layernorm,
            # Mamba's norm; a module inside a wrapper, dbrx's norm_attn_norm.norm_1, or a wrapper's element,
            # norm_attn_norm.output[1]); a block without an MLP host ends on its mixer's add
            subs = {"input_layernorm": read_at("attention_norm_output", "mixer_norm_output"),
                    "post_attention_layernorm": read_at("mlp_norm_output")}
            items = [subs.get(x) or x for x in items]
            # an MLP host on other blocks only (glm4_moe's and deepseek_v3's dense first blocks): the
            # module is there, drawn with no value served
            if "mlp" not in children and f"{stack}[i].mlp" not in dict(f.rename) and not f.hosts_at(f"{stack}[i].mlp"):
                items = [x for x in items if x != "mlp"]
            if subs["post_attention_layernorm"] is None and "post_attention_layernorm" not in children \
                    and f"{stack}[i].post_attention_layernorm" not in dict(f.rename):
                items = [x for x in items if x != "post_attention_layernorm"]
            while any(a == b == "add" for a, b in zip(items, items[1:], strict=False)):  # an empty branch
                k2 = next(j for j, (a, b) in enumerate(zip(items, items[1:], strict=False)) if a == b == "add")
                items.pop(k2)
            items = _join_branches(items, lay, children, subbed, joins)
        if lay is not None:
            card = _module_value([lay], "", "input", f)
            parts.append(Part(self.uid(f"k{k}-{stack}-input"), "x", "", "input", f"{stack}[i]", lay.cls, card,
                              subtitle="the block's input"))
        default = spec == DEFAULT_BLOCK
        stream = "layer_input"  # the stream's value before the branch drawn since the last add
        branch: list[str] = []
        for j, item in enumerate(items):
            nxt = items[j + 1] if j + 1 < len(items) else None
            if item.startswith("join:"):  # a branch's value added into a module's input (zamba2's shared block)
                total, into = joins[item.removeprefix("join:")]
                parts.append(Part(self.uid(f"k{k}-{stack}-join{j}"), "+", "", "add", f"{stack}[i]", "", None,
                                  subtitle=total, note=f"into {into}"))
                branch = []
                continue
            if item == "add":
                card = None
                if lay is not None:
                    if nxt is not None and not nxt.startswith(("host:", "sub:", "join:")) and nxt != "add":
                        card = _module_value([lay], nxt, "input", f)
                    elif nxt is None:
                        card = _own_output(lay, f)
                    if card is None and nxt is not None:  # the sum a block identity names (dbrx's layer_mid)
                        drawn_ = {c.name for p in parts for c in [p.value, *p.others] if c is not None}
                        card = _sum_value(lay, stream, branch, drawn_, f)
                note = ""
                if joins and card is not None:  # after a join the drawn stream is not the residual: say the sum
                    note = next((t for v_, t in _equations(lay) if v_ == card.name and "+" in t), "") \
                        if lay is not None else ""
                parts.append(Part(self.uid(f"k{k}-{stack}-add{j}"), "+", "", "add", f"{stack}[i]", "", card,
                                  subtitle="residual add", note=note))
                stream, branch = (card.name if card else ""), []
                continue
            if item.startswith("sub:") and lay is not None:  # a norm inside a wrapper, or a wrapper's element
                v = subbed[item.removeprefix("sub:")]
                assert v.read is not None
                mod = v.read.module
                # a list item is named with its index (input_layernorm[0], not 0 in input_layernorm)
                item_read = len(mod) > 1 and mod[-1].isdigit()
                leaf, within = (f"{mod[-2]}[{mod[-1]}]", mod[:-2]) if item_read else (mod[-1], mod[:-1])
                note = f"in {'.'.join(within)}" if within else ""
                if v.read.access:
                    note = (note + " " if note else "") + "output" + "".join(f"[{a}]" for a in v.read.access)
                parts.append(Part(self.uid(f"k{k}-{stack}-{'-'.join(mod)}"), leaf, "", "norm",
                                  f"{stack}[i]." + ".".join(mod), "", _card(lay, v, f), note=note))
                continue
            if item.startswith("mul:"):  # a product with a value of the block (gemma4's per_layer_input, layer_scalar)
                factor = item.removeprefix("mul:")
                card = next((_card(h, v, f) for h in hosts for v in h.values if v.name == factor), None)
                parts.append(Part(self.uid(f"k{k}-{stack}-mul{j}"), "×", "", "mul", f"{stack}[i]", "", card,
                                  subtitle="multiply"))
                continue
            name = item.removeprefix("host:")
            host = children.get(name)
            if host is not None:
                branch.append(name)
                role = "mlp" if "mlp" in name or name in ("moe", "feed_forward", "experts") else "mixer"
                others = [_card(host, v, f) for v in host.values]
                others += _input_cards(lay, name, _native(f, f"{stack}[i].{name}"), f)  # mlp_input
                main = _own_output(host, f)
                parts.append(Part(self.uid(f"k{k}-{stack}-{name}"), name, _native(f, f"{stack}[i].{name}"), role,
                                  host.path, host.cls, main, [c for c in others if main is None or c.name != main.name]))
                continue
            card = _module_value([lay], name, "output", f) if lay is not None else None
            if card is None:  # a sibling's boundary a child host reads (^.post_attention_layernorm.output)
                card = _sibling_value([c for c in children.values()], name, f)
            if card is None and default and f"{stack}[i].{name}" not in dict(f.rename) \
                    and not (name == "mlp" and f.hosts_at(f"{stack}[i].mlp")):
                continue  # a default part this family does not have
            role = "norm" if "norm" in name else "mlp" if name == "mlp" else "module"
            ins = _input_cards(lay, name, _native(f, f"{stack}[i].{name}"), f)
            if card is None and ins:  # a module the block reads only at its input (opt's up_proj: mlp_input)
                card, ins = ins[0], ins[1:]
            parts.append(Part(self.uid(f"k{k}-{stack}-{name}"), name, _native(f, f"{stack}[i].{name}"), role,
                              f"{stack}[i].{name}", "", card, [c for c in ins if card is None or c.name != card.name],
                              subtitle="" if card else "no value served"))
        if lay is not None and items and items[-1] != "add":  # the block ends on a product: its output apart
            parts.append(Part(self.uid(f"k{k}-{stack}-output"), "out", "", "output", f"{stack}[i]", lay.cls,
                              _own_output(lay, f), subtitle="the block's output"))
        everywhere = set.intersection(*[{v.name for v in h.values} for h in f.hosts_at(f"{stack}[i]")]) \
            if f.hosts_at(f"{stack}[i]") else set()
        extra: list[str] = []
        for h in layer_hosts:  # a kind's own values on the block (deepstack_output after blocks 0-2)
            for v in h.values:
                if v.name not in everywhere and not any(p.value is not None and p.value.name == v.name for p in parts):
                    parts.append(Part(self.uid(f"k{k}-{stack}-{v.name}"), "+", "", "add", h.path, h.cls,
                                      _card(h, v, f), subtitle=h.kind or "", note=h.kind or ""))
                    extra.append(h.kind or v.name)
        # an identity names a child host of another kind only where a spec shares it across kinds:
        # leave those out; one naming a module (per_layer_projection) or the model stays
        absent = {h.path[len(stack) + 4:].split(".")[0] for h in f.hosts if h.path.startswith(f"{stack}[i].")} - set(children)
        identities = []
        for h in layer_hosts:
            for ident in h.identities:
                heads = {t.split(".")[0] for t in ident.terms if "." in t}
                if not heads & absent:
                    identities.append(ident.text)
        ordered = sorted(children.items(), key=lambda kv: (kv[0] in named, kv[0]))  # the mixers first
        label = " · ".join(f"{n}: {h.cls}" for n, h in ordered) or (lay.cls if lay else stack)
        if extra:
            label += " · " + " · ".join(dict.fromkeys(extra))
        return Kind(k, label, blocks, parts, identities)

    # ---- support() tables ----
    def hosts(self) -> list[dict[str, Any]]:
        f = self.f
        out = []
        for h in f.hosts:
            cls = h.cls
            built = str(self.first.get("class", "")) if self.first else ""
            if h.path == "model" and built and built != h.cls:  # the page's load builds another class
                cls = f"{built} (or {h.cls})"
            out.append({"host": h, "cls": cls, "anchor": host_anchor(h, f),
                        "label": "model" if h.path == "model" else f"model.{h.path}",
                        "values": [(v, _card(h, v, f)) for v in h.values]})
        return out

    def serves_processor(self) -> bool:
        """Whether the load this page is built on is the image-text one (its printout built the vision stack)."""
        return bool(self.first and any(k.startswith("vision") for k in self.first.get("blocks", {})))

    def tensor_parallel(self) -> dict[str, Any] | None:
        """What support() says of each value under tensor parallel (2 ranks), or why the family cannot be sharded:
        the printout's facts, computed by the runtime's own code (``nnatlas.parallel.tensor_parallel.planned``)."""
        found = self.facts.get("tensor_parallel")
        return found if isinstance(found, dict) else None

    def image_text(self) -> str:
        return str(self.first.get("class", "")) if self.serves_processor() and self.first else ""

    def page_serves(self, v: ValueIR) -> bool:
        """Whether the load this page is built on serves ``v`` although it needs a load (the image-text
        one builds the vision encoder, so a value needing the processor is unconditional here; a pattern
        read inside eager attention is recomputed under sdpa and flex attention)."""
        return bool(v.needs and ((v.needs.name == "processor" and self.serves_processor()) or v.recomputed))

    @staticmethod
    def served_words(v: ValueIR) -> str:
        """How the loads serve a conditional value the page serves."""
        if v.recomputed:
            return SDPA_RECOMPUTED_WORDS if v.read is not None and v.read.recompute else RECOMPUTED_WORDS
        return v.needs.says.replace("needs ", "served by ", 1) if v.needs else ""

    def warn(self, v: ValueIR) -> bool:
        return bool(v.needs) and not self.page_serves(v)

    def _mixers(self) -> list[str]:
        return [h.path for h in self.f.hosts if h.path.startswith("layers[i].") and h.path.count(".") == 1
                and not h.path.endswith(".mlp")]

    def _served(self, host: str, value: str) -> list[tuple[HostIR, ValueIR]]:
        """``{attn}``: every mixer of the block; ``{softmax}``: the mixers with an attention pattern
        (TransformerLens's attn.hook_* name softmax attention's tensors, not a DeltaNet's)."""
        if "{softmax}" in host:
            hosts = [m for m in self._mixers() if any(v.name == "attention_probabilities"
                                                      for h in self.f.hosts_at(m) for v in h.values)]
        else:
            hosts = self._mixers() if "{attn}" in host else [host]
        out = []
        for path in hosts:
            for h in self.f.hosts_at(path):
                for v in h.values:
                    if v.name == value and v.missing is None:
                        out.append((h, v))
                        break
        return out

    def coming_from(self) -> list[dict[str, Any]]:
        """TransformerLens hook names and nnsight paths → the standard values this family serves."""
        rows = []
        seen = set()
        rotary = any("rotary" in t.lower() for t, _ in self.f.traits)
        for tl, host, value, differs in TRANSFORMER_LENS:
            if ".hook_rot_" in tl and not rotary:
                continue  # TransformerLens names rotated queries and keys only on a rotary model
            if tl.endswith((".hook_q", ".hook_k")) and not rotary:
                differs = "per key/value head (no repeat to the query heads)" if tl.endswith("k") else ""
            for h, v in self._served(host, value):
                if (tl, h.path) in seen:
                    continue
                seen.add((tl, h.path))
                std = (f"model.{h.path}." if h.path != "model" else "model.") + v.name
                when = f" (when {h.when_text})" if h.when_text else ""
                rows.append({"tl": tl, "nnatlas": std, "anchor": value_anchor(h, v, self.f),
                             "nnsight": nnsight_path(self.f, h.path, v) or "no module boundary: " + v.words,
                             "differs": (differs + when).strip(), "warn": self.warn(v),
                             "needs": v.needs.says if v.needs else ""})
        return rows

    def sae_points(self) -> list[dict[str, str]]:
        """The SAE hook points, for a page whose notes name SAE repositories."""
        if not any("sae" in (n.title + n.body).lower() for n in self.f.notes):
            return []
        rows = []
        for point, host, value in SAE_POINTS:
            for h, v in self._served(host, value):
                rows.append({"point": point, "nnatlas": (f"model.{h.path}." if h.path != "model" else "model.") + v.name,
                             "anchor": value_anchor(h, v, self.f), "nnsight": nnsight_path(self.f, h.path, v)})
        return rows

    def sizes(self) -> list[dict[str, Any]]:
        """Per checkpoint: layers, d_model, heads, kv heads, head_dim, vocab and parameters (meta device)."""
        facts = {c["name"]: c for c in self.facts.get("checkpoints", [])}
        out = []
        for c in self.checkpoints():
            n = c["normalized"]
            out.append({"name": c["name"], "layers": n.get("num_layers"), "d_model": n.get("hidden_size"),
                        "heads": n.get("num_heads"), "kv_heads": n.get("num_kv_heads"), "head_dim": n.get("head_dim"),
                        "vocab": n.get("vocab_size"), "parameters": facts.get(c["name"], {}).get("parameters")})
        return out

    def checkpoints(self) -> list[dict[str, Any]]:
        facts = {c["name"]: c for c in self.facts.get("checkpoints", [])}
        # a standard config name the spec makes unavailable(...) says so (its reason is in the config
        # table's "from the native config" column), not the exception the printout met computing it
        unavailable = {key for key, _, text in self.f.config if text.startswith("Unavailable: ")}
        out = []
        for c in self.f.checkpoints:
            fc = facts.get(c.name, {})
            normalized = fc.get("normalized")
            if normalized is None:
                normalized = {}
                for key, comp, _ in self.f.config:
                    try:
                        normalized[key] = evaluate(comp, dict(c.config))
                    except Exception:  # noqa: BLE001
                        normalized[key] = None
            normalized = {k: NOT_SERVED_TEXT if k in unavailable else v for k, v in normalized.items()}
            out.append({"name": c.name, "normalized": normalized, "config": c.config, "cls": fc.get("class", "")})
        return out


def config_text(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(config_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {config_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def config_label(name: str) -> str:
    """The standard config name as a researcher types it (``vision_num_heads`` → ``model.vision.num_heads``)."""
    if name.startswith("vision_"):
        rest = name[len("vision_"):]
        return f"model.vision.{name if rest == 'hidden_size' else rest}"
    return f"model.{name}"


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


def param_text(n: Any) -> str:
    """A parameter count as a model card says it: 752.4 M, 79.67 B."""
    if not isinstance(n, int):
        return "—"
    if n >= 10**9:
        return f"{n / 10**9:.2f} B"
    if n >= 10**6:
        return f"{n / 10**6:.1f} M"
    return f"{n:,}"
