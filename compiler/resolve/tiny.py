"""A family's tiny model and checkpoints: the draws (in dependency order), ranges, experts, processor, images
and factors the generated tests build models from, and the released checkpoints' stack sizes.
"""

from __future__ import annotations

from typing import Any

from ..errors import suggest
from ..language import expr
from ..language.ir import MAX_BLOCKS, DrawIR, TinyIR, config_value
from ..language.yamlpos import Path as DataPath
from .context import FamilyContext

EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")  # what transformers runs on CPU
MIN_EXAMPLES, MAX_EXAMPLES = 3, 1000  # hypothesis examples per generated test (fewer draws too little of the config space)
MAX_TINY_RANGE = 4096  # the largest batch or sequence a generated test may draw


class TinyChecks(FamilyContext):
    """The tiny configs the generated tests draw, and the checkpoints' sizes."""

    def tiny(self) -> TinyIR | None:
        t = self.raw.tiny
        assert t is not None
        todo: list[tuple[DataPath, Any]] = [(("tiny",), self.merged.data.get("tiny"))]
        while todo:  # every integer of a tiny model is small (sizes, counts): the generated tests build it
            at, node = todo.pop()
            if at in (("tiny", "batch"), ("tiny", "seq")):
                continue  # ranges, checked below
            if isinstance(node, dict):
                todo.extend(((*at, k), v) for k, v in node.items())
            elif isinstance(node, list):
                todo.extend(((*at, k), v) for k, v in enumerate(node))
            elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_TINY_RANGE:
                self.err(at, f"{'.'.join(map(str, at))}: {node} is not tiny (at most {MAX_TINY_RANGE}): the "
                         "generated tests build this model")
        draws = []
        known: set[str] = set(t.config)
        for key, spec in self.draw_order(t.draw):
            at = ("tiny", "draw", key)
            if isinstance(spec, list):
                if not spec:
                    self.err(at, f"tiny.draw.{key}: an empty list has nothing to draw")
                draws.append(DrawIR(key, tuple(spec), None))
            else:
                try:
                    c = expr.compile_config(spec)
                except expr.ExprError as e:
                    self.err(at, f"tiny.draw.{key}: {e}", col=e.col)
                    continue
                for n in c.names:
                    if n not in known and n.split(".")[0] not in known:
                        self.err(at, f"tiny.draw.{key}: '{n}' is not drawn or fixed before it")
                draws.append(DrawIR(key, None, c))
            known.add(key)  # a dotted key (text_config.hidden_size) sets one entry of a nested config
        for rng, name in ((t.batch, "batch"), (t.seq, "seq")):
            if not 1 <= rng[0] <= rng[1] <= MAX_TINY_RANGE:
                self.err(("tiny", name), f"tiny.{name}: a range [low, high] with 1 <= low <= high <= {MAX_TINY_RANGE}")
        for k, impl in enumerate(t.experts):
            if impl not in EXPERTS_IMPLEMENTATIONS:
                self.err(("tiny", "experts", k), f"tiny.experts: unknown experts implementation '{impl}' (CPU: "
                         f"{', '.join(EXPERTS_IMPLEMENTATIONS)})" + suggest(impl, EXPERTS_IMPLEMENTATIONS))
        processor: tuple[tuple[str, Any], ...] | None = None
        images: tuple[tuple[str, Any], ...] | None = None
        if t.processor is not None:
            processor = _processor(t.processor)
        if t.images is not None:
            if t.processor is None:
                self.err(("tiny", "images"), "tiny.images: image inputs need tiny.processor (how to build them)")
            if not t.images.count or not t.images.sizes:
                self.err(("tiny", "images"), "tiny.images: count and sizes each need at least one choice")
            images = (("count", tuple(t.images.count)), ("sizes", tuple(tuple(x) for x in t.images.sizes)))
        image_text = None
        if t.image_text is not None:
            it = t.image_text
            it_draws: list[tuple[str, Any, Any]] = []
            for key, spec in it.draw.items():
                iat: DataPath = ("tiny", "image_text", "draw", key)
                if isinstance(spec, list):
                    it_draws.append((key, tuple(spec), None))
                    continue
                try:
                    it_draws.append((key, None, expr.compile_config(spec)))
                except expr.ExprError as e:
                    self.err(iat, f"tiny.image_text.draw.{key}: {e}", col=e.col)
            image_text = (("model_class", it.model_class), ("config_class", it.config_class),
                          ("config", dict(it.config)), ("draw", tuple(it_draws)),
                          ("processor", _processor(it.processor)),
                          ("images", (("count", tuple(it.images.count)), ("sizes", tuple(tuple(x) for x in it.images.sizes)))),
                          ("examples", it.examples))
        factors = []
        for key, fr in t.factors.items():
            fat: DataPath = ("tiny", "factors", key)
            if (fr.range is None) == (fr.pin is None):
                self.err(fat, f"tiny.factors.{key}: give one of range: [low, high] or pin: value (with its reason)")
                continue
            if fr.pin is not None and not fr.reason:
                self.err(fat, f"tiny.factors.{key}: a pinned factor says why (reason: ...), true of the released checkpoints")
                continue
            if fr.range is not None and not fr.range[0] < fr.range[1]:
                self.err(fat, f"tiny.factors.{key}: range [low, high] needs low < high")
                continue
            rule: dict[str, Any] = {"range": tuple(fr.range)} if fr.range is not None else {"pin": fr.pin}
            if fr.reason:
                rule["reason"] = fr.reason
            factors.append((key, rule))
        layouts = []
        for key, lr in t.layouts.items():
            lat: DataPath = ("tiny", "layouts", key)
            if (lr.options is None) == (lr.pin is None):
                self.err(lat, f"tiny.layouts.{key}: give one of options: [...] or pin: value (with its reason)")
                continue
            if not lr.reason:
                self.err(lat, f"tiny.layouts.{key}: a narrowed or pinned structural option says why (reason: ...), "
                              "true of the released checkpoints")
                continue
            if lr.options is not None and not lr.options:
                self.err(lat, f"tiny.layouts.{key}: options: give at least one value")
                continue
            lrule: dict[str, Any] = {"options": tuple(lr.options)} if lr.options is not None else {"pin": lr.pin}
            lrule["reason"] = lr.reason
            layouts.append((key, lrule))
        return TinyIR(t.model_class, t.config_class, tuple(t.config.items()), tuple(draws), t.batch, t.seq, t.examples,
                      experts=tuple(t.experts), processor=processor, images=images, image_text=image_text,
                      factors=tuple(factors), layouts=tuple(layouts))

    def draw_order(self, draw: dict[str, Any]) -> list[tuple[str, Any]]:
        """The draws in an order that follows their dependencies (each after every draw its
        expression names), otherwise in the order written: a family overriding one draw of its
        base, or adding one a base's expression names, needs no care for the merged key order."""
        keys = list(draw)
        deps: dict[str, set[str]] = {}
        for key, spec in draw.items():
            deps[key] = set()
            if isinstance(spec, str):
                try:
                    names = expr.compile_config(spec).names
                except expr.ExprError:
                    continue  # reported where the draw is compiled
                deps[key] = {d for n in names for d in (n, n.split(".")[0]) if d in draw and d != key}
        order: list[str] = []
        while len(order) < len(keys):
            ready = next((k for k in keys if k not in order and deps[k] <= set(order)), None)
            if ready is None:
                stuck = [k for k in keys if k not in order]
                self.err(("tiny", "draw", stuck[0]), "tiny.draw: these draws depend on each other in a cycle: "
                         + ", ".join(f"{k} (needs {', '.join(sorted(deps[k] - set(order)))})" for k in stuck))
                order += stuck
                break
            order.append(ready)
        return [(k, draw[k]) for k in order]

    def check_checkpoint_sizes(self, config: list[tuple[str, expr.Compiled, str]]) -> None:
        """A checkpoint's stacks are built block by block on the meta device for its printout and
        drawn on its page: a stack of more than MAX_BLOCKS blocks is a SpecError."""
        stacks = [(key, c) for key, c, _ in config if key == "num_layers" or key.endswith("_num_layers")]
        for k, ckpt in enumerate(self.raw.checkpoints):
            values = dict(ckpt.config)

            def lookup(name: str, values: dict[str, Any] = values) -> Any:
                return config_value(values, name)

            for key, c in stacks:
                try:
                    n = expr.evaluate(c, lookup)
                except Exception:  # noqa: BLE001 - the recorded config does not say: transformers' default
                    continue
                if isinstance(n, int) and not isinstance(n, bool) and n > MAX_BLOCKS:
                    self.err(("checkpoints", k, "config"), f"checkpoint {ckpt.name}: {key} is {n}; at most "
                             f"{MAX_BLOCKS} blocks (the printout builds each one)", key=True)



def _processor(p: Any) -> tuple[tuple[str, Any], ...]:
    """A tiny processor's entries (its class's own keyword arguments only when it has some)."""
    out: tuple[tuple[str, Any], ...] = (("class", p.cls), ("image_processor", p.image_processor),
                                        ("image_processor_config", dict(p.image_processor_config)),
                                        ("tokens", tuple(p.tokens)))
    if p.config:
        out = (*out, ("config", dict(p.config)))
    if p.token_names:
        out = (*out, ("token_names", dict(p.token_names)))
    return out
