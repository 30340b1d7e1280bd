"""The state of one match (the recording, the tiny config, the proposal it fills) and the helpers every part of
it uses: how a read point names a child, a module class's role, which config entry a measured size is (an
expression of the drawn sizes, fitted and checked on the recording)."""

from __future__ import annotations

import re
from typing import Any

import torch

from . import configexpr
from .measure import hidden_in, holds, tensor_of
from .proposal import Proposal
from .recorder import ModuleCall, Recording
from .tiny import Tiny


class MatchBase:
    """One recording's match: the state the attention, MLP and block matchers share, and its helpers."""

    def __init__(self, rec: Recording, tiny: Tiny, params: dict[str, Any]):
        self.rec = rec
        self.model = rec.model
        self.tiny = tiny
        self.params = params
        self.config = rec.model.config
        self.modules = dict(rec.model.named_modules())
        self.input_ids = rec.inputs["input_ids"]
        self.batch, self.seq = self.input_ids.shape
        self.p = Proposal(re.sub(r"[^a-z0-9_]", "_", tiny.model_type.lower()), tiny.model_type, tiny.model_class, _title(tiny.model_class), tiny)
        self.seen: set[str] = set()  # module paths the proposal accounts for
        self.fitted: set[str] = set()  # config entries a measured size fit
        self.kind_type: str | None = None  # the layer type of the blocks being matched (a kind of block)
        self.mlp_kind: tuple[str, str] | None = None  # their MLP's own kind (name, when), where it has one

    # -- helpers
    def name_in(self, host_native: str, child_native: str, standard: str | None, host_std: str) -> str:
        """How a read point names a child: its standard name when it is renamed to it (or is it)."""
        if standard is None or child_native == standard:
            return child_native
        siblings = {n for n, _ in self.modules[host_native].named_children()}
        if standard in siblings:  # the standard name is another native child: keep the native one
            if child_native.isidentifier():
                return child_native
            # an item of a ModuleList (LongCat-Flash's input_layernorm.0): a read point names a module by one word,
            # so the item gets one (input_layernorm_0), renamed to it
            standard = re.sub(r"\W", "_", child_native)
            self.p.rename[f"{host_std}.{standard}"] = child_native
            self.p.rename_sure[f"{host_std}.{standard}"] = f"sure: the item {child_native} of a ModuleList"
            return standard
        self.p.rename[f"{host_std}.{standard}"] = child_native
        self.p.rename_sure[f"{host_std}.{standard}"] = f"likely: {child_native} plays the part of {standard} in the dataflow"
        return standard

    def role(self, cls: str) -> str:
        """A module class's name without the model's own (GraniteMoeHybridMambaLayer -> MambaLayer): what it is, for the
        name patterns (the 'Moe' of the model's name makes no Mamba layer a mixture of experts)."""
        prefix = _title(self.tiny.model_class)
        return cls[len(prefix):] if cls.startswith(prefix) and len(cls) > len(prefix) else cls

    def child(self, path: str, parent: str) -> str:
        return path[len(parent) + 1:] if parent else path

    def cfg_attr(self, value: int, hints: tuple[str, ...]) -> str | None:
        cfg = self.config.to_dict()
        names = [k for k, v in cfg.items() if v == value and not isinstance(v, bool)]
        for h in hints:
            for n in names:
                if h in n:
                    return n
        return None

    # -- sizes: config entries and expressions of the drawn ones
    def per_layer(self, text: str, at: str = "0") -> str:
        """``text`` with each per-layer attribute of a heterogeneous config (one whose blocks' sizes differ, which
        refuses a global read: AmbiguousGlobalPerLayerAttributeError) read on block 0 (``per_layer_config[0].head_dim``),
        or ``at`` (``'full_attention'``: the blocks of that kind)."""
        for attr in sorted(getattr(self.config, "per_layer_attributes", None) or ()):
            text = re.sub(rf"(?<![\w.\]]){attr}\b", f"per_layer_config[{at}].{attr}", text)
        return text

    def cfg_eval(self, text: str, at: str = "0") -> Any:
        """A config expression evaluated on the tiny model's config (a missing attribute is None)."""
        cfg = self.config
        text = self.per_layer(text, at)

        class Names(dict):  # type: ignore[type-arg]
            def __missing__(self, key: str) -> Any:
                return getattr(cfg, key, None)
        try:
            return configexpr.evaluate(text, Names())
        except Exception:  # noqa: BLE001 - a candidate that does not apply (or is not a config expression)
            return None

    def fit(self, key: str, measured: int | None, candidates: list[str], where: str) -> None:
        """Keep the config entry that gives the measured size, or say that none does (a kind of block after the first
        keeps the entry an earlier kind fit: its blocks' sizes differ from theirs, per_layer_config)."""
        if measured is None:
            return
        if self.p.kind is not None and key in self.fitted and self.cfg_eval(self.p.config.get(key, "")) != measured:
            # a kind of block whose size differs from the earlier kinds' (a per-layer override): its own config entry,
            # read on the blocks of its kind (per_layer_config['full_attention'].head_dim), sizes its hosts there
            kname, at = self.p.kind[0], repr(self.kind_type)
            for text in dict.fromkeys([self.p.config[key]] + candidates):
                if text and self.kind_type is not None and self.cfg_eval(text, at) == measured:
                    entry = f"{key}_{kname}"
                    self.p.config[entry] = self.per_layer(text, at)
                    self.p.kind_dims.setdefault(kname, {})[key] = entry
                    return
            self.p.todos.append(f"{where}: config.{key} should be {measured} here, unlike on the blocks of another "
                                f"kind, and no config expression the drafter tried gives it")
            return
        for text in dict.fromkeys([self.p.config.get(key, "")] + candidates):
            if text and self.cfg_eval(text) == measured:
                self.fitted.add(key)
                self.p.config[key] = text
                return
        self.p.todos.append(f"{where}: config.{key} should be {measured} here and no config expression the drafter "
                            f"tried gives it (check config.{key})")

    def fit_sizes(self, H: int | None, q_dim: int | None, kv: int | None, val: Any, where: str) -> None:
        t = self.tiny.names
        heads, hidden = t["heads"], t["hidden"]
        self.fit("num_heads", H, [heads, "num_attention_heads", "n_head", "num_heads"], where)
        self.fit("num_kv_heads", kv, [t.get("kv_heads", heads), "num_key_value_heads", heads, "multi_query_group_num",
                                      f"1 if multi_query else {heads}"], where)  # (multi-query: one key head)
        per_head = [f"head_dim or {hidden} // {heads}", "head_dim", "v_head_dim", f"{hidden} // {heads}", "kv_channels",
                    "qk_head_dim", "qk_nope_head_dim + qk_rope_head_dim", "attention_head_dim"]
        v_dim = int(val.shape[-1]) if isinstance(val, torch.Tensor) and val.dim() == 4 else None
        self.fit("head_dim", v_dim, per_head, where)
        self.fit("qk_head_dim", q_dim, per_head, where)

    def out_proj(self, c: ModuleCall) -> ModuleCall | None:
        out = tensor_of(c.output)
        for k in reversed(self.rec.children_calls(c.path)):
            if isinstance(self.modules[k.path], torch.nn.Dropout):
                continue
            if holds(tensor_of(k.output), out) == 0.0 and hidden_in(k) is not None:
                return k
        return None

    def neurons_width(self, c: ModuleCall) -> int | None:
        out = tensor_of(c.output)
        for k in reversed(self.rec.children_calls(c.path)):
            x = hidden_in(k)
            if holds(tensor_of(k.output), out) == 0.0 and x is not None:
                return int(x.shape[-1])
        return None

    def size_expr(self, width: int | None, names: tuple[str, ...]) -> str | None:
        """A config expression of a measured width: a named entry, or a product of two entries."""
        if width is None:
            return None
        ints = {k: v for k, v in self.config.to_dict().items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
        for n in names:
            if ints.get(n) == width:
                return n
        inter = [k for k in ints if "intermediate" in k or "ffn" in k]
        counts = [k for k in ints if "shared" in k]
        for a in inter:
            for b in counts:
                if ints[a] * ints[b] == width:
                    return f"{a} * {b}"
        return next((a for a in inter if ints[a] == width), None)


def _title(model_class: str) -> str:
    """The product name the causal-LM class carries: MistralForCausalLM -> Mistral."""
    return re.sub(r"(ForCausalLM|LMHeadModel|ForConditionalGeneration)$", "", model_class) or model_class
