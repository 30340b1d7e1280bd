"""A family page's drawing, computed from the IR: the stacks (``layers``, ``vision.layers``), the chain of
modules around each, each block kind's parts in order (norms, mixers, MLPs, residual adds, products and joins),
their cards and identities.

Which hosts apply to which block comes from the printout facts (computed by transformers on the
first recorded checkpoint, ``compiler/emit/printouts.py``) when there are any; otherwise the hosts'
``when:`` conditions are evaluated here on the first checkpoint's recorded config, or on the tiny
config, by ``expr.evaluate``: a walk of the same whitelisted expression tree, never ``eval``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..language.ir import DEFAULT_BLOCK, DEFAULT_TEXT, MAX_BLOCKS, FamilyIR, HostIR, ValueIR
from .cards import (
    Card,
    input_cards,
    module_value,
    native_name,
    own_output,
    sibling_value,
    slug,
    tower_value,
    value_card,
)
from .config_words import evaluate, fallback_config

MAX_KINDS = 8


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
            return value_card(lay, names[value], f)
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


class Drawing:
    """The drawing of one family's page over its printout facts (``PageModel`` is made of it)."""

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

    def serves_processor(self) -> bool:
        """Whether the load this page is built on is the image-text one (its printout built the vision stack)."""
        return bool(self.first and any(k.startswith("vision") for k in self.first.get("blocks", {})))

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
        for cfg in fallback_config(self.f):
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
                for cfg in fallback_config(self.f):
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
                parts.append(Part(self.uid(f"c-{item}"), item, native_name(f, item), role, item, "",
                                  module_value(model_hosts, item, "output", f)))
            out = next((value_card(h, v, f) for h in model_hosts for v in h.values if v.name == "logits"), None)
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
                parts.append(self.stack_part(stack, n, tower_value(vhosts, f)))
                continue
            if item == "projector" and item in rename and f"{prefix}.{item}" not in rename:
                parts.append(Part(self.uid("c-projector"), "projector", native_name(f, "projector"), "vision", "projector",
                                  "", None, subtitle="the merger: each 2 × 2 block of patches to one image token"
                                  if "merger" in dict(f.rename)["projector"][0] else "to the text model's width"))
                continue
            full = f"{prefix}.{item}"
            card = module_value(vhosts, item, "output", f) or module_value(model_hosts, item, "output", f)
            path = full if (full in rename or any(h.path == full for h in f.hosts)) else item
            parts.append(Part(self.uid(f"c-{full}"), item, native_name(f, path), "vision", path, "", card))
        if derived_chain:
            feats = next(((h, v) for h in vhosts for v in h.values if v.name == "image_features"), None)
            if feats is not None:
                parts.append(Part(self.uid(f"c-{prefix}-image_features"), "image_features", "", "vision", prefix, "",
                                  value_card(*feats, f), note="at the scatter"))
                entry = next((value_card(h, v, f) for h in f.hosts_at("layers[i]") for v in h.values
                              if v.name == "layer_input"), None)
                parts.append(Part(self.uid(f"c-{prefix}-into-layers"), "layers[0].input", "", "stack", "layers[i]", "",
                                  entry, note="at image_token_mask"))
        return parts

    def stack_part(self, stack: str, n: int, card_: Card | None = None) -> Part:
        f = self.f
        hosts = list(f.hosts_at(f"{stack}[i]"))
        card = card_ or (own_output(hosts[0], f) if hosts else None)
        cls = ", ".join(dict.fromkeys(h.cls for h in hosts))
        leaf = stack.split(".")[-1]
        return Part(self.uid(f"c-{stack}"), leaf, native_name(f, stack), "stack", f"{stack}[i]", cls, card,
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
            card = module_value([lay], "", "input", f)
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
                        card = module_value([lay], nxt, "input", f)
                    elif nxt is None:
                        card = own_output(lay, f)
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
                                  f"{stack}[i]." + ".".join(mod), "", value_card(lay, v, f), note=note))
                continue
            if item.startswith("mul:"):  # a product with a value of the block (gemma4's per_layer_input, layer_scalar)
                factor = item.removeprefix("mul:")
                card = next((value_card(h, v, f) for h in hosts for v in h.values if v.name == factor), None)
                parts.append(Part(self.uid(f"k{k}-{stack}-mul{j}"), "×", "", "mul", f"{stack}[i]", "", card,
                                  subtitle="multiply"))
                continue
            name = item.removeprefix("host:")
            host = children.get(name)
            if host is not None:
                branch.append(name)
                role = "mlp" if "mlp" in name or name in ("moe", "feed_forward", "experts") else "mixer"
                others = [value_card(host, v, f) for v in host.values]
                others += input_cards(lay, name, native_name(f, f"{stack}[i].{name}"), f)  # mlp_input
                main = own_output(host, f)
                parts.append(Part(self.uid(f"k{k}-{stack}-{name}"), name, native_name(f, f"{stack}[i].{name}"), role,
                                  host.path, host.cls, main, [c for c in others if main is None or c.name != main.name]))
                continue
            card = module_value([lay], name, "output", f) if lay is not None else None
            if card is None:  # a sibling's boundary a child host reads (^.post_attention_layernorm.output)
                card = sibling_value([c for c in children.values()], name, f)
            if card is None and default and f"{stack}[i].{name}" not in dict(f.rename) \
                    and not (name == "mlp" and f.hosts_at(f"{stack}[i].mlp")):
                continue  # a default part this family does not have
            role = "norm" if "norm" in name else "mlp" if name == "mlp" else "module"
            ins = input_cards(lay, name, native_name(f, f"{stack}[i].{name}"), f)
            if card is None and ins:  # a module the block reads only at its input (opt's up_proj: mlp_input)
                card, ins = ins[0], ins[1:]
            parts.append(Part(self.uid(f"k{k}-{stack}-{name}"), name, native_name(f, f"{stack}[i].{name}"), role,
                              f"{stack}[i].{name}", "", card, [c for c in ins if card is None or c.name != card.name],
                              subtitle="" if card else "no value served"))
        if lay is not None and items and items[-1] != "add":  # the block ends on a product: its output apart
            parts.append(Part(self.uid(f"k{k}-{stack}-output"), "out", "", "output", f"{stack}[i]", lay.cls,
                              own_output(lay, f), subtitle="the block's output"))
        everywhere = set.intersection(*[{v.name for v in h.values} for h in f.hosts_at(f"{stack}[i]")]) \
            if f.hosts_at(f"{stack}[i]") else set()
        extra: list[str] = []
        for h in layer_hosts:  # a kind's own values on the block (deepstack_output after blocks 0-2)
            for v in h.values:
                if v.name not in everywhere and not any(p.value is not None and p.value.name == v.name for p in parts):
                    parts.append(Part(self.uid(f"k{k}-{stack}-{v.name}"), "+", "", "add", h.path, h.cls,
                                      value_card(h, v, f), subtitle=h.kind or "", note=h.kind or ""))
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
