"""Match a recorded forward against the vocabulary: which module is the embedding, the blocks,
the norms around each mixer, the attention and its interface call, the MLP and its activation,
the router and experts of a mixture, the delta-rule kernel of a linear-attention mixer. Every
proposal is checked on the recorded tensors; an identity is proposed only when it held."""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import torch

from . import configexpr
from .proposal import Function, Host, Identity, Kind, Proposal, Value
from .recorder import FnCall, ModuleCall, Op, Recording
from .tiny import DraftError, Tiny, _global

# ---- tensors --------------------------------------------------------------------------------


def tensor_of(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def hidden_in(call: ModuleCall) -> torch.Tensor | None:
    if call.args and isinstance(call.args[0], torch.Tensor):
        return call.args[0]
    for key in ("hidden_states", "x", "input", "hidden_state"):
        if isinstance(call.kwargs.get(key), torch.Tensor):
            return call.kwargs[key]  # type: ignore[no-any-return]
    return next((v for v in call.kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), None)


def err(a: Any, b: Any) -> float | None:
    """The largest absolute difference, or None when the shapes (or types) differ."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return None
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool or not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    return float((a.double() - b.double()).abs().nan_to_num(0.0).max())


def tolerance(e: float | None, scale: float = 1e-4) -> float | None:
    """The atol an identity with error ``e`` is written with (None: it did not hold)."""
    if e is None or e > scale:
        return None
    if e == 0:
        return 0.0
    return float(f"1e{math.ceil(math.log10(e)) + 1}")


def holds(a: Any, b: Any, scale: float = 1e-4) -> float | None:
    """``a`` (or what the callable ``a`` computes) equals ``b`` within ``scale``: the atol to write."""
    if callable(a):
        try:
            a = a()
        except (RuntimeError, TypeError, ValueError):  # shapes that do not combine: it did not hold
            return None
    return tolerance(err(a, b), scale)


def ident(check: str, atol: float | None, sure: str) -> Identity:
    return Identity(check, float(atol or 0.0), 0.0, sure)


# ---- names ----------------------------------------------------------------------------------

NORM = re.compile(r"norm", re.I)
MLP = re.compile(r"mlp|moe|sparse|feedforward|ffn|expert|feed_forward", re.I)
SSM = re.compile(r"mixer|mamba|ssm", re.I)
ACT_CLASSES = re.compile(r"activation|gelu|silu|relu|tanh|sigmoid|swish|quickgelu|mish", re.I)
LAYER_TYPES = ("layer_types", "layers_block_type", "block_types", "layers_block_types", "layer_block_types")
KIND_LISTS = ("mlp_layer_types", "mlp_types", "ffn_layer_types")  # per-block lists of MLP kinds
DENSE_FIRST = ("first_k_dense_replace", "num_dense_layers", "first_dense_layers", "moe_layer_start_index",
               "n_dense_layers")


def _partitions(types: list[str], sigs: dict[Any, list[int]]) -> bool:
    """Whether every block of one kind in ``types`` has one signature (the kinds tell the differing blocks apart)."""
    return all(len({types[i] for i in blocks}) == 1 for blocks in sigs.values()) and \
        all(len({s for s, blocks in sigs.items() if t in {types[i] for i in blocks}}) == 1 for t in set(types))


def _dense_first(config: Any, sigs: dict[Any, list[int]], n: int) -> tuple[str, int] | None:
    """(entry, k) of a dense-first count whose blocks [0, k) and [k, n) are the two signatures of the stack."""
    for name in DENSE_FIRST:
        k = getattr(config, name, None)
        if isinstance(k, int) and not isinstance(k, bool) and 0 < k < n and sorted(map(sorted, sigs.values())) == \
                sorted([list(range(k)), list(range(k, n))]):
            return name, k
    return None


ACT_OPS = ("silu", "gelu", "relu", "tanh", "sigmoid", "gelu_new", "relu2", "mish", "softplus")


class Matcher:
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

    # -- the whole model
    def run(self) -> Proposal:
        p, rec = self.p, self.rec
        t = self.tiny.names
        hd = "head_dim or " if "head_dim" in t else ""
        p.config = {"num_layers": t["layers"], "hidden_size": t["hidden"]}
        if "heads" in t:  # (none in a state-space stack)
            p.config.update({
                "num_heads": t["heads"], "num_kv_heads": t.get("kv_heads", t["heads"]),
                "head_dim": f"{hd}{t['hidden']} // {t['heads']}", "qk_head_dim": f"{hd}{t['hidden']} // {t['heads']}"})
        p.config.update({"vocab_size": "vocab_size", "intermediate_size": t.get("intermediate", "intermediate_size")})
        if t.get("intermediate_default") == "none":
            p.config["intermediate_size"] = f"{t['intermediate']} or 4 * {t['hidden']}"
            p.todos.append(f"config.intermediate_size: {t['intermediate']} is None by default; the draft assumes the "
                           f"MLP is then 4 * {t['hidden']} wide (check the modeling code)")
        root = rec.call("")
        assert root is not None
        p.todos.extend(n for n in self.tiny.notes if "not mapped" in n)
        layers = self.find_layers()
        embed = next((c for c in rec.calls if isinstance(self.modules[c.path], torch.nn.Embedding)
                      and c.args and isinstance(c.args[0], torch.Tensor) and torch.equal(c.args[0], self.input_ids)), None)
        head_mod = self.model.get_output_embeddings()
        head = next((c for c in rec.calls if self.modules[c.path] is head_mod), None)
        host = p.host("model", type(self.model).__name__, "the class transformers maps this model type to")
        v = host.values
        v["input_ids"] = Value("input.input_ids", sure="sure: the call's keyword")
        if "attention_mask" in rec.inputs:  # (xLSTM's forward takes none)
            v["attention_mask"] = Value("input.attention_mask", sure="sure: the call's keyword")
        v["input_size"] = Value(derived="shape(input_ids)", sure="sure")
        first_in = None
        if layers is not None:
            path, n = layers
            runs = [sum(c.path == f"{path}.{i}" for c in rec.calls) for i in range(n)]
            if max(runs) > 1:  # (Dory's recurrent section, HRM's stacks: a read point would name one of its calls)
                raise DraftError(f"{self.tiny.model_class}: its blocks run in a loop ({path}.{runs.index(max(runs))} "
                                 f"runs {max(runs)} times per forward); a spec reads each block once", built=True)
            p.rename["layers"] = path
            p.rename_sure["layers"] = f"sure: the ModuleList of {n} blocks, called in order"
            self.seen.add(path)
            c0 = rec.call(f"{path}.0")
            first_in = hidden_in(c0) if c0 else None
            if first_in is not None and first_in.dim() == 3 and first_in.shape[0] == self.batch and \
                    first_in.shape[1] > self.seq:  # (CPM-Ant's prompt tokens, which its hidden states drop)
                raise DraftError(f"{self.tiny.model_class}: prepended tokens: the blocks' stream has "
                                 f"{first_in.shape[1]} positions for {self.seq} input tokens; a spec's values are per "
                                 "input token", built=True)
        else:
            p.todos.append("no ModuleList of num_hidden_layers blocks was called in order: the blocks are not mapped")
        if embed is not None:
            p.rename["embed_tokens"] = embed.path
            p.rename_sure["embed_tokens"] = "sure: the nn.Embedding called with input_ids"
            self.seen.add(embed.path)
            v["token_embeddings"] = Value("embed_tokens.output", sure="sure")
            pos = self.find_positions(embed, first_in)
            if pos is not None:
                p.rename["embed_positions"] = pos.path
                p.rename_sure["embed_positions"] = "likely: an nn.Embedding whose output is added to the tokens'"
                self.seen.add(pos.path)
                pos_out = tensor_of(pos.output)
                # one row for the batch, or one per sequence (positions that count each sequence's real tokens)
                name = "token_position_embeddings" if pos_out is not None and pos_out.dim() == 3 and \
                    pos_out.shape[0] == self.batch > 1 else "position_embeddings"
                v[name] = Value("embed_positions.output", sure="likely" if name == "position_embeddings" else
                                "likely: one row per sequence (its positions depend on the attention mask)")
                p.traits.append("Learned positions")
                e = holds(lambda: tensor_of(embed.output) + pos_out, first_in)  # type: ignore[operator]
                if e is not None:
                    host.identities.append(ident(f"token_embeddings + {name} == layers[0].layer_input", e,
                                                 "held on the tiny model"))
            elif holds(tensor_of(embed.output), first_in) is not None:
                host.identities.append(ident("layers[0].layer_input == token_embeddings", 0.0, "held on the tiny model"))
        else:
            p.todos.append("no nn.Embedding was called with input_ids: token_embeddings is not mapped")
        if head is not None:
            norm = self.find_final_norm(head)
            if norm is not None:
                p.rename["norm"] = norm.path
                p.rename_sure["norm"] = "sure: its output is what lm_head reads" if holds(
                    tensor_of(norm.output), hidden_in(head)) == 0.0 else "sure: its output is what the prediction head reads"
                self.seen.add(norm.path)
                v["final_norm_output"] = Value("norm.output", sure="sure")
                if rec.call(norm.path) is not norm:  # the norm runs before too (NanoChat's, on the embeddings): a
                    # read of its output is its first call's; what the head reads is the last one's
                    calls = sum(c.path == norm.path for c in rec.calls)
                    v["final_norm_output"] = Value("lm_head.input", sure=f"sure: the final norm's output (the norm "
                                                   f"runs {calls} times in one forward: norm.output reads its first)")
            p.rename["lm_head"] = head.path
            p.rename_sure["lm_head"] = "sure: the model's output embeddings"
            self.seen.add(head.path)
            v["lm_head_output"] = Value("lm_head.output", sure="sure")
        v["logits"] = Value("output.logits", sure="sure")
        v["next_token_probs"] = Value(derived="softmax(last_token(logits, attention_mask), -1)" if "attention_mask" in v
                                      else "softmax(logits[:, -1], -1)", sure="sure")
        if head is not None and holds(tensor_of(head.output), rec.output.get("logits")) == 0.0:
            host.identities.insert(0, ident("logits == lm_head_output", 0.0, "held on the tiny model"))
        if head is not None and embed is not None and head_mod.weight is self.modules[embed.path].weight:
            p.traits.append("Tied embeddings")
        if layers is not None:
            self.blocks(*layers)
        for path, m in self.modules.items():
            if any(isinstance(m, c) for c in (torch.nn.Embedding,)) and path not in self.seen and \
                    rec.call(path) is not None and not path.startswith(p.rename.get("layers", "\0") + "."):
                p.todos.append(f"module {path} ({type(m).__name__}) is called but not mapped")
        if self.cfg_eval(p.config["intermediate_size"]) is None:  # no width for the Neurons layout
            for h in p.hosts.values():
                if not h.dims and {"mlp_activation", "mlp_neurons"} & set(h.values) and \
                        h.values.get("mlp_activation", Value()).missing is None:
                    h.values.pop("mlp_activation", None)
                    h.values.pop("mlp_neurons", None)
                    h.identities = [x for x in h.identities if "mlp_activation" not in x.check and "mlp_neurons" not in x.check]
                    p.todos.append(f"{h.path}: no config entry gives the MLP's width: mlp_activation and mlp_neurons "
                                   "are left out")
        for h in p.hosts.values():  # a host met on blocks of several kinds proposes its identities once
            h.identities = list({x.check: x for x in h.identities}.values())
        p.todos = list(dict.fromkeys(p.todos))
        p.config = {k: self.per_layer(v) for k, v in p.config.items()}
        for h in p.hosts.values():  # each kind's own sizes, on every host that has that kind
            for k in h.kinds.values():
                k.dims.update(p.kind_dims.get(k.name, {}))
            if any(k.dims for k in h.kinds.values()):  # a view takes the global sizes: a kind's own head width inferred
                for x in [*h.values.values(), *(y for k in h.kinds.values() for y in k.values.values())]:
                    if x.view and "head_dim" in x.view:
                        x.view = re.sub(r"\bhead_dim\b", "-1", x.view)
        defaults = _global(type(self.config)())  # (its per-layer sizes read as the global ones)
        heads, kv = self.tiny.names.get("heads", ""), self.tiny.names.get("kv_heads")
        if kv and heads and "Grouped-query attention" not in p.traits and isinstance(getattr(defaults, kv, None), int) \
                and getattr(defaults, kv) < getattr(defaults, heads):
            p.traits.append("Grouped-query attention")
        return p

    def find_layers(self) -> tuple[str, int] | None:
        n = self.params[self.tiny.names["layers"]]
        for path, m in self.modules.items():
            if isinstance(m, torch.nn.ModuleList) and len(m) == n and all(self.rec.call(f"{path}.{i}") for i in range(n)):
                return path, n
        return None

    def find_positions(self, embed: ModuleCall, first_in: torch.Tensor | None) -> ModuleCall | None:
        for c in self.rec.calls:
            if c is embed or not isinstance(self.modules[c.path], torch.nn.Embedding):
                continue
            out = tensor_of(c.output)
            tok = tensor_of(embed.output)
            if out is None or tok is None or first_in is None or out.shape[-1] != tok.shape[-1]:
                continue
            if out.shape[-2] == self.seq and holds(lambda tok=tok, out=out: tok + out, first_in) is not None:
                return c
        return None

    def find_final_norm(self, head: ModuleCall) -> ModuleCall | None:
        x = hidden_in(head)
        layers = self.p.rename.get("layers", "\0")
        def norms_giving(t: torch.Tensor | None) -> list[ModuleCall]:
            return [c for c in self.rec.calls if c.start < head.start and not c.path.startswith(layers + ".")
                    and c.path not in ("", "model") and holds(tensor_of(c.output), t) == 0.0 and NORM.search(c.cls)]
        cands = norms_giving(x)
        parent = cands[-1].path.rpartition(".")[0] if cands else ""
        wrapper = next((c for c in self.rec.calls if c.path == parent and c.start < head.start), None) if parent else None
        if wrapper is not None and not layers.startswith(parent + ".") and holds(tensor_of(wrapper.output), x) == 0.0:
            # the head reads a norm inside a prediction head of its own (ModernBERT's dense, activation, norm): the
            # final norm is the one that head reads
            inner = norms_giving(hidden_in(wrapper))
            if inner:
                self.p.todos.append(f"{parent} ({wrapper.cls}), between the final norm and the output embeddings, "
                                    "is not mapped")
                return inner[-1]
        return cands[-1] if cands else None

    # -- blocks
    def blocks(self, layers: str, n: int) -> None:
        p, rec = self.p, self.rec
        sigs: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for i in range(n):
            kids = rec.children_calls(f"{layers}.{i}")
            sig = tuple(dict.fromkeys((self.child(c.path, f"{layers}.{i}"), c.cls) for c in kids))
            sigs.setdefault(sig, []).append(i)
        tname, types = "layer_types", list(getattr(self.config, "layer_types", None) or [])
        listed_types = []
        for name in (*LAYER_TYPES, *KIND_LISTS):  # the config's lists of each block's kind
            listed = getattr(self.config, name, None)
            if isinstance(listed, (list, tuple)) and len(listed) == n and len(set(map(str, listed))) > 1:
                listed_types.append((name, [str(x) for x in listed]))
        # where the blocks differ, the list whose kinds tell them apart (ExaONE-MoE's mlp_layer_types, not its
        # sliding and full layer_types), else the first
        fits = [(t, ts) for t, ts in listed_types if len(sigs) > 1 and _partitions(ts, sigs)]
        if fits or listed_types:
            tname, types = (fits or listed_types)[0]
        dense_first = _dense_first(self.config, sigs, n) if len(sigs) > 1 and not fits else None
        layer_cls = rec.call(f"{layers}.0").cls  # type: ignore[union-attr]
        host = p.host("layers[i]", layer_cls, "the class of every block")
        kinds: list[tuple[str | None, int]] = []
        # blocks whose sizes differ by kind (a heterogeneous config's per-layer overrides) are kinds, alike or not
        sized = bool(getattr(self.config, "per_layer_attributes", None))
        if dense_first is not None:  # blocks before a dense-first count differ from those after it (GLM-MoE-DSA)
            types = ["dense" if i < dense_first[1] else "moe" for i in range(n)]
            tname = ""
        if (len(sigs) > 1 or sized) and len(types) == n and len(set(types)) > 1:
            by_type: dict[str, int] = {}
            for i, t in enumerate(types):
                by_type.setdefault(t, i)
            kinds = [(t, i) for t, i in by_type.items()]
            p.traits.append("Hybrid")
        elif len(sigs) > 1:
            p.todos.append(f"the blocks differ ({len(sigs)} kinds) but the config has no layer_types to tell them "
                           "apart: only block 0's kind is mapped")
            kinds = [(None, 0)]
        else:
            kinds = [(None, 0)]
        common: dict[str, Value] | None = None
        classes = {rec.call(f"{layers}.{i}").cls for _, i in kinds}  # type: ignore[union-attr]
        if len(classes) > 1:
            host.cls = None
            host.sure = "one class per kind of block: each kind says its own"
        for kind, i in kinds:
            kname = "" if kind is None else \
                "attention" if kind in ("full_attention", "attention") else re.sub(r"[^a-z0-9_]", "_", kind.lower())
            when = f"{tname}[i] == {kind!r}" if tname else \
                f"i {'<' if kind == 'dense' else '>='} {dense_first[0]}"  # type: ignore[index]
            p.kind = (kname, when) if kind is not None else None
            self.kind_type = kind
            try:
                values, identities = self.block(layers, i, host)
            finally:
                p.kind, self.kind_type = None, None
            if kind is None:
                host.values.update(values)
                host.identities.extend(identities)
                continue
            kk = host.kinds.setdefault(kname, Kind(kname, when))
            if len(classes) > 1:
                kk.cls = rec.call(f"{layers}.{i}").cls  # type: ignore[union-attr]
            kk.identities.extend(identities)
            kk.values.update(values)
            common = dict(values) if common is None else {k: x for k, x in common.items()
                                                          if k in values and values[k].read == x.read}
        if kinds and kinds[0][0] is not None and common is not None:
            host.values.update(common)
            for k in host.kinds.values():  # a value every kind reads alike moves to the host
                k.values = {n: x for n, x in k.values.items() if n not in common}
            # an identity every kind has moves to the host
            shared = [x for x in next(iter(host.kinds.values())).identities
                      if all(any(y.check == x.check for y in k.identities) for k in host.kinds.values())]
            for x in shared:
                host.identities.append(x)
                for k in host.kinds.values():
                    k.identities = [y for y in k.identities if y.check != x.check]
        p.merge_kinds()

    def block(self, layers: str, i: int, host: Host) -> tuple[dict[str, Value], list[Identity]]:
        rec, p = self.rec, self.p
        bpath = f"{layers}.{i}"
        call = rec.call(bpath)
        assert call is not None
        kids = rec.children_calls(bpath)
        self.seen.add(bpath)
        x = hidden_in(call)
        out = tensor_of(call.output)
        values: dict[str, Value] = {}
        identities: list[Identity] = []
        values["layer_input"] = Value("input", sure="sure: the block's first argument")
        values["layer_output"] = Value("output" if isinstance(call.output, torch.Tensor) else "output[0]",
                                       sure="sure: the block returns " + ("a tensor" if isinstance(call.output, torch.Tensor)
                                                                          else "a tuple, the stream first"))
        mixers: list[tuple[ModuleCall, str]] = []
        for c in kids:
            kind = self.mixer_kind(c)
            if kind:
                mixers.append((c, kind))
        mixer_paths = {c.path for c, _ in mixers}
        mlps = [c for c in kids if c.path not in mixer_paths and MLP.search(self.role(c.cls)) and not NORM.search(c.cls)]
        norms = [c for c in kids if NORM.search(c.cls)]
        if not mixers and not mlps:  # a state-space block (Mamba): a norm, then a mixer whose output is added
            done = self.ssm_block(bpath, kids, norms, x, out, values, identities)
            if done:
                return values, identities
        if not mixers:
            p.todos.append(f"no mixer found in {bpath} ({call.cls}): its children "
                           + ", ".join(f"{self.child(c.path, bpath)} ({c.cls})" for c in kids))
        mixer_out = None
        for c, kind in mixers[:1]:
            std = "linear_attn" if kind == "linear_attention" else "self_attn"
            name = self.name_in(bpath, self.child(c.path, bpath), std, "layers[i]")
            mixer_out = tensor_of(c.output)
            if kind == "attention":
                self.attention(c, f"layers[i].{name}")
            elif kind == "attention_inline":
                self.inline_attention(c, f"layers[i].{name}")
            else:
                self.delta_net(c, f"layers[i].{name}")
            mixer_ref = f"{name}.attention_output"
            pre = next((nm for nm in norms if holds(tensor_of(nm.output), hidden_in(c)) == 0.0), None)
            if pre is not None:
                nname = self.name_in(bpath, self.child(pre.path, bpath), "input_layernorm", "layers[i]")
                values["attention_norm_output"] = Value(f"{nname}.output", sure="sure: its output is what the mixer is called with")
                self.seen.add(pre.path)
                if "RMS" in pre.cls and "RMSNorm" not in p.traits:
                    p.traits.append("RMSNorm")
                if isinstance(self.modules[pre.path], torch.nn.LayerNorm) and "LayerNorm" not in p.traits:
                    p.traits.append("LayerNorm")
        for extra, _ in mixers[1:]:
            p.todos.append(f"a second mixer in {bpath}: {self.child(extra.path, bpath)} ({extra.cls}) is not mapped")
        mlp_out = None
        if mlps:
            m = mlps[0]
            name = self.name_in(bpath, self.child(m.path, bpath), "mlp", "layers[i]")
            mlp_out = tensor_of(m.output)
            self.mlp(m, f"layers[i].{name}")
            values["mlp_input"] = Value(f"{name}.input", sure="sure: the MLP's first argument")
            pre = next((nm for nm in norms if holds(tensor_of(nm.output), hidden_in(m)) == 0.0
                        and nm.path not in self.seen), None)
            if pre is not None:
                nname = self.name_in(bpath, self.child(pre.path, bpath), "post_attention_layernorm", "layers[i]")
                self.seen.add(pre.path)
                values["mlp_norm_output"] = Value(f"{nname}.output", sure="sure: its output is what the MLP is called with")
                identities.append(ident("mlp_norm_output == mlp_input", 0.0, "held on the tiny model"))
                mid = hidden_in(pre)
                if mid is not None and x is not None and mixer_out is not None and holds(mid, x) is None:
                    values["layer_mid"] = Value(f"{nname}.input", sure="likely: what the MLP's norm reads, after the mixer's add")
                    e = holds(lambda: x + mixer_out, mid, 1e-5)
                    if e is not None:
                        identities.append(ident(f"layer_input + {mixer_ref} == layer_mid", e, "held on the tiny model"))
            for extra in mlps[1:]:
                p.todos.append(f"a second MLP in {bpath}: {self.child(extra.path, bpath)} ({extra.cls}) is not mapped")
        elif mixers:
            p.todos.append(f"no MLP found in {bpath} ({call.cls})")
        if mixers and mlps and x is not None and out is not None and mixer_out is not None and mlp_out is not None:
            mlp_name = values["mlp_input"].read.split(".")[0]  # type: ignore[union-attr]
            e = holds(lambda: x + mixer_out + mlp_out, out, 1e-5)
            if e is not None:
                identities.insert(0, ident(f"layer_input + {mixer_ref} + {mlp_name}.mlp_output == layer_output", e,
                                           "held on the tiny model"))
            else:  # norms of the mixer's and the MLP's outputs added to the stream (Gemma 2, OLMo 2)
                post = [nm for nm in norms if nm.path not in self.seen]
                a = next((nm for nm in post if holds(hidden_in(nm), mixer_out) == 0.0), None)
                b = next((nm for nm in post if holds(hidden_in(nm), mlp_out) == 0.0), None)
                if a is not None and b is not None:
                    e = holds(lambda: x + tensor_of(a.output) + tensor_of(b.output), out, 1e-5)  # type: ignore[operator]
                    if e is not None:
                        an, bn = self.child(a.path, bpath), self.child(b.path, bpath)
                        identities.insert(0, ident(f"layer_input + {an}.output + {bn}.output == layer_output", e,
                                                   f"held on the tiny model: {an} and {bn} norm what the stream receives"))
                        self.seen.update((a.path, b.path))
        for c in kids:
            if isinstance(self.modules[c.path], torch.nn.Dropout):
                continue  # the identity in eval mode
            if c.path not in self.seen and c.path not in mixer_paths and c.path not in {m.path for m in mlps}:
                p.todos.append(f"{self.child(c.path, bpath)} ({c.cls}) in {bpath} is not mapped")
        return values, identities

    def ssm_block(self, bpath: str, kids: list[ModuleCall], norms: list[ModuleCall], x: torch.Tensor | None,
                  out: torch.Tensor | None, values: dict[str, Value], identities: list[Identity]) -> bool:
        """A block of a norm and one mixer that is neither attention nor an MLP (a Mamba mixer): its
        output added to the block's input is the block's output. Only the mixer's output is mapped."""
        p = self.p
        if x is None or out is None:
            return False
        mixer = next((c for c in kids if not NORM.search(c.cls) and SSM.search(self.role(c.cls)) and tensor_of(c.output) is not None
                      and tensor_of(c.output).shape == x.shape), None)  # type: ignore[union-attr]
        if mixer is None:
            return False
        mixer_out = tensor_of(mixer.output)
        e = holds(lambda: x + mixer_out, out, 1e-5)  # type: ignore[operator]
        if e is None:
            return False
        name = self.name_in(bpath, self.child(mixer.path, bpath), "mixer", "layers[i]")
        host = p.host(f"layers[i].{name}", mixer.cls, "the block's state-space mixer (its output is added to the stream)")
        host.values["mixer_output"] = Value("output" if isinstance(mixer.output, torch.Tensor) else "output[0]",
                                            sure="sure: what the mixer returns, added to the block's input")
        self.seen.update({bpath, mixer.path, *(k.path for k in self.rec.children_calls(mixer.path))})
        p.todos.append(f"{mixer.path} ({mixer.cls}): a state-space mixer: only its output is mapped (its scan's "
                       "inputs, gates and states are not)")
        identities.append(ident(f"layer_input + {name}.mixer_output == layer_output", e, "held on the tiny model"))
        pre = next((nm for nm in norms if holds(tensor_of(nm.output), hidden_in(mixer)) == 0.0), None)
        if pre is not None:
            values["mixer_norm_output"] = Value(f"{self.child(pre.path, bpath)}.output",
                                                sure="sure: its output is what the mixer is called with")
            identities.append(ident(f"mixer_norm_output == {name}.input", 0.0, "held on the tiny model"))
            self.seen.add(pre.path)
        return True

    def mixer_kind(self, c: ModuleCall) -> str | None:
        for f in self.rec.fns_in(c.path):
            if self.attention_fn(f):
                return "attention"
            if self.delta_fn(f):
                return "linear_attention"
        if re.search(r"attention|attn", self.role(c.cls), re.I) and tensor_of(c.output) is not None:
            return "attention_inline"  # attention computed in the module's own forward: only its output is sure
        return None

    @staticmethod
    def attention_fn(f: FnCall) -> bool:
        return f.params[:4] == ("module", "query", "key", "value")

    @staticmethod
    def delta_fn(f: FnCall) -> bool:
        return "g" in f.kwargs and "beta" in f.kwargs

    # -- attention
    def attention(self, c: ModuleCall, hpath: str) -> None:
        p, rec = self.p, self.rec
        host = p.host(hpath, c.cls, "the module that calls the attention function")
        self.seen.add(c.path)
        f = next(f for f in rec.fns_in(c.path) if self.attention_fn(f))
        fi = rec.fns.index(f)
        v = host.values

        def arg(k: int) -> Any:
            return f.args[k] if len(f.args) > k else f.kwargs.get(f.params[k])
        q, k_, val = arg(1), arg(2), arg(3)
        out = tensor_of(f.output)
        H = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
        v["attention_queries"] = Value("call:attention.args[1]", sure="sure: the attention function's query")
        v["attention_keys"] = Value("call:attention.args[2]", sure="sure: its key")
        v["attention_values"] = Value("call:attention.args[3]", sure="sure: its value")
        ops = rec.ops_in(c.path, fi, own=False)
        soft = [o for o in ops if o.name == "softmax"]
        scores = probs = None
        keys_len = k_.shape[-2] if isinstance(k_, torch.Tensor) and k_.dim() == 4 else None
        if soft and keys_len is not None and tensor_of(soft[0].args) is not None and \
                tensor_of(soft[0].args).shape[-1] != keys_len:  # type: ignore[union-attr]
            p.todos.append(f"{c.path} ({c.cls}): the softmax runs over {tensor_of(soft[0].args).shape[-1]} columns "  # type: ignore[union-attr]
                           f"for {keys_len} keys (attention sinks or another extra column): no pattern values")
            soft = []
        if soft:
            s = soft[0]
            k = [o for o in ops if o.name == "softmax"].index(s)
            at = f"#{k}" if k else ""
            v["attention_scores"] = Value(f"call:attention > op:softmax{at}.input[0]", needs="eager",
                                          sure="sure: the softmax's input in the eager attention function")
            scores = tensor_of(s.args)
            drop = [o for o in ops if o.name == "dropout" and o.at > s.at]
            if drop:
                v["attention_probabilities"] = Value("call:attention > op:dropout.output", needs="eager",
                                                     sure="sure: the dropout after the softmax (identity in eval)")
                probs = tensor_of(drop[0].output)
            else:
                v["attention_probabilities"] = Value(f"call:attention > op:softmax{at}.output", needs="eager",
                                                     sure="likely: the softmax's output (no dropout follows it)")
                probs = tensor_of(s.output)
        elif not any("softmax runs over" in t for t in p.todos):
            p.todos.append(f"{c.path} ({c.cls}): no softmax in its attention function: no pattern values")
        if out is not None and out.dim() == 4 and H is not None and out.shape[2] == H:
            v["attention_head_outputs"] = Value("call:attention.output[0]", sure="sure: the attention function's output")
        oproj = self.out_proj(c)
        if oproj is not None:
            oname = self.name_in(c.path, self.child(oproj.path, c.path), "o_proj", hpath)
            self.seen.add(oproj.path)
            v["attention_premix"] = Value(f"{oname}.input", view="unflatten(-1, [num_heads, head_dim])",
                                          sure="sure: the output projection's input, split per head")
            pin = hidden_in(oproj)
            if out is not None and pin is not None and out.dim() == 4 and pin.shape[-1] == out.shape[2] * out.shape[3] \
                    and holds(lambda: pin.unflatten(-1, out.shape[2:]), out) == 0.0:
                host.identities.append(ident("attention_premix == attention_head_outputs", 0.0, "held on the tiny model"))
            elif pin is not None and out is not None:
                p.todos.append(f"{c.path}: the output projection's input is not the heads' output side by side "
                               "(a gate or another step between them): check attention_premix")
        v["attention_output"] = Value("output[0]" if isinstance(c.output, (tuple, list)) else "output",
                                      sure="sure: what the module returns" + (", first" if isinstance(c.output, (tuple, list)) else ""))
        if probs is not None:
            e = holds(probs.sum(-1), torch.ones_like(probs.sum(-1)), 1e-5)
            if e is not None:
                host.identities.append(ident("sum(attention_probabilities, -1) == 1", 1e-5, "held on the tiny model"))
            if probs.shape[-1] == probs.shape[-2] and probs.shape[-1] > 1:
                upper = torch.triu(torch.ones(probs.shape[-2:], dtype=torch.bool), 1)
                if bool((probs[..., upper] == 0).all()):
                    host.identities.append(ident("masked(attention_probabilities) == 0", 0.0,
                                                 "held on the tiny model (causal)"))
            if scores is not None and holds(torch.softmax(scores.float(), -1).to(scores.dtype), probs, 1e-6) is not None:
                host.identities.append(ident("softmax(attention_scores, -1) == attention_probabilities", 1e-6,
                                             "held on the tiny model"))
        q_dim = q.shape[-1] if isinstance(q, torch.Tensor) else None
        kv = k_.shape[1] if isinstance(k_, torch.Tensor) and k_.dim() == 4 else None
        if H is not None and kv is not None and kv < H and "Grouped-query attention" not in p.traits:
            p.traits.append("Grouped-query attention")
        if any(n.endswith("rotary_emb") for n in self.modules) and "Rotary positions" not in p.traits:
            p.traits.append("Rotary positions")
        self.fit_sizes(H, q_dim, kv, val, c.path)
        for kid in rec.children_calls(c.path):
            self.seen.add(kid.path)

    def inline_attention(self, c: ModuleCall, hpath: str) -> None:
        """An attention module that calls no attention function: its output is its boundary; its
        queries, keys, values and pattern live inside its own forward, unmapped."""
        host = self.p.host(hpath, c.cls, "likely: an attention module by its class name")
        self.seen.add(c.path)
        host.values["attention_output"] = Value("output[0]" if isinstance(c.output, (tuple, list)) else "output",
                                                sure="sure: what the module returns")
        self.p.todos.append(f"{c.path} ({c.cls}) computes its attention in its own forward (no attention function "
                            "call): its queries, keys, values, pattern and head outputs are not mapped")
        for kid in self.rec.children_calls(c.path):
            self.seen.add(kid.path)

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

    # -- the delta rule (gated DeltaNet)
    def delta_net(self, c: ModuleCall, hpath: str) -> None:
        p, rec = self.p, self.rec
        host = p.host(hpath, c.cls, "the module that calls the delta-rule kernel")
        host.stream = "linear_attention"
        self.seen.add(c.path)
        f = next(f for f in rec.fns_in(c.path) if self.delta_fn(f))
        ns = inspect.unwrap(type(self.modules[c.path]).forward).__globals__
        names = [f.name]
        route = None
        sibling = f.name.replace("chunk", "recurrent")
        if sibling != f.name and callable(ns.get(sibling)):
            names.append(sibling)
            sig = inspect.signature(ns[sibling]).parameters
            if "initial_state" in sig and "output_final_state" in sig:
                route = {"torch": sibling, "seq_dim": 1, "state_arg": "initial_state", "state_output": 1,
                         "final_state_flag": "output_final_state"}
        p.functions["delta_rule"] = Function(names, "the kernel this call runs (a prompt's chunked one or a "
                                                    "decode step's recurrent one)", route)
        v = host.values
        for i, n in enumerate(("attention_queries", "attention_keys", "attention_values")):
            v[n] = Value(f"fn:delta_rule.args[{i}]", sure="sure: the kernel's query, key and value")
        v["decays"] = Value("fn:delta_rule.kwargs.g", sure="sure: the kernel's g")
        v["betas"] = Value("fn:delta_rule.kwargs.beta", sure="sure: the kernel's beta")
        if "initial_state" in f.kwargs:
            v["state_input"] = Value("fn:delta_rule.kwargs.initial_state", edit="later", copy=True,
                                     sure="likely: the cache's buffer, which a decode step overwrites")
        if route is not None:
            v["state"] = Value("fn:delta_rule.step.output[1]", needs="torch_kernels", sure="likely: routed token by token")
            v["states"] = Value("fn:delta_rule.steps.output[1]", needs="torch_kernels", edit="none",
                                sure="likely: routed token by token")
        v["attention_head_outputs"] = Value("fn:delta_rule.output[0]", sure="sure: the kernel's output")
        if isinstance(f.output, tuple) and len(f.output) > 1:
            v["state_output"] = Value("fn:delta_rule.output[1]", edit="later", sure="likely: the kernel's final state")
        v["attention_output"] = Value("output" if isinstance(c.output, torch.Tensor) else "output[0]", sure="sure")
        g, beta = f.kwargs.get("g"), f.kwargs.get("beta")
        if isinstance(g, torch.Tensor) and bool((g <= 0).all()):
            host.identities.append(ident("decays <= 0", 0.0, "held on the tiny model"))
        if isinstance(beta, torch.Tensor) and bool((beta > 0).all()) and bool((beta < 1).all()):
            host.identities.append(ident("betas > 0", 0.0, "held on the tiny model"))
            host.identities.append(ident("betas < 1", 0.0, "held on the tiny model"))
        q, val = f.args[0], f.args[2]
        # (a config that names the delta rule's heads and widths once, for keys and values alike: linear_num_heads)
        cfgs = {"heads": (val.shape[2], ("value_heads", "linear_num_heads")),
                "key_heads": (q.shape[2], ("key_heads", "linear_num_heads")),
                "key_dim": (q.shape[3], ("key_head_dim", "linear_head_dim")),
                "value_dim": (val.shape[3], ("value_head_dim", "linear_head_dim"))}
        for key, (size, hints) in cfgs.items():
            attr = self.cfg_attr(size, hints)
            if attr is None:
                p.todos.append(f"{c.path}: no config attribute gives {key} ({size})")
            else:
                p.config[key] = attr
        for kid in rec.children_calls(c.path):
            self.seen.add(kid.path)

    # -- MLPs and mixtures
    def mlp(self, c: ModuleCall, hpath: str) -> None:
        mod = self.modules[c.path]
        experts = next((n for n, m in mod.named_children() if _routing_params(m) is not None), None)
        if experts is not None:
            self.moe(c, hpath, experts)
        else:
            self.dense(c, hpath)

    def dense(self, c: ModuleCall, hpath: str, flat: bool = False, host: Host | None = None) -> None:
        p, rec = self.p, self.rec
        host = host or p.host(hpath, c.cls, "the block's MLP")
        self.seen.add(c.path)
        v = host.values
        view = "unflatten(0, [batch, seq])" if flat else None
        kids = rec.children_calls(c.path)
        out = tensor_of(c.output)
        down = next((k for k in reversed(kids) if holds(tensor_of(k.output), out) == 0.0
                     and not isinstance(self.modules[k.path], torch.nn.Dropout)), None)
        # (an activation module shared by every block, called once per block, cannot be read per block: its op is)
        act = next((k for k in kids if ACT_CLASSES.search(k.cls) and not isinstance(self.modules[k.path], torch.nn.Linear)
                    and sum(x.path == k.path for x in rec.calls) == 1), None)
        act_ref = None
        if act is not None:
            aname = self.name_in(c.path, self.child(act.path, c.path), "act_fn", hpath)
            act_ref = f"{aname}.output"
            act_t = tensor_of(act.output)
            self.seen.add(act.path)
        else:
            op = next((o for o in rec.ops_in(c.path) if o.name in ACT_OPS), None)
            if op is not None:
                occ = [o for o in rec.ops_in(c.path) if o.name == op.name].index(op)
                act_ref = f"op:{op.name}{f'#{occ}' if occ else ''}.output"
                act_t = tensor_of(op.output)
        if act_ref is not None:
            v["mlp_activation"] = Value(act_ref, view=view, sure="likely: the activation's output")
        else:
            p.todos.append(f"{c.path} ({c.cls}): no activation module or op found: mlp_activation is not mapped")
        if down is not None:
            dname = self.name_in(c.path, self.child(down.path, c.path), "down_proj", hpath)
            self.seen.add(down.path)
            width = hidden_in(down)
            if not flat and hpath == "layers[i].mlp" and width is not None:
                t = self.tiny.names
                self.fit("intermediate_size", int(width.shape[-1]),
                         [t.get("intermediate", "intermediate_size"), f"4 * {t['hidden']}", "ffn_hidden_size", "n_inner"],
                         c.path)
            v["mlp_neurons"] = Value(f"{dname}.input", view=view, sure="sure: the last projection's input")
            neurons = hidden_in(down)
            if act_ref is not None and neurons is not None:
                tok = "tokens(mlp_neurons) == tokens(mlp_activation)" if flat else "mlp_neurons == mlp_activation"
                if holds(act_t, neurons) == 0.0:
                    host.identities.append(ident(tok, 0.0, "held on the tiny model: an ungated MLP"))
                    up = next((k for k in kids if k.path not in (down.path, act.path if act else "")
                               and isinstance(self.modules[k.path], torch.nn.Module) and k.start < down.start), None)
                    if up is not None:
                        self.name_in(c.path, self.child(up.path, c.path), "up_proj", hpath)
                        self.seen.add(up.path)
                else:
                    for k in kids:
                        if k.path == down.path or (act is not None and k.path == act.path):
                            continue
                        ko = tensor_of(k.output)
                        if holds(lambda ko=ko: act_t * ko if ko is not None and act_t is not None and ko.shape == act_t.shape else None,
                                 neurons) == 0.0:
                            uname = self.name_in(c.path, self.child(k.path, c.path), "up_proj", hpath)
                            self.seen.add(k.path)
                            host.identities.append(ident(f"{tok} * {uname}.output", 0.0,
                                                         "held on the tiny model: a gated MLP"))
                            if "Gated MLP" not in p.traits and not flat:
                                p.traits.append("Gated MLP")
                            break
        else:
            p.todos.append(f"{c.path} ({c.cls}): no projection returns the MLP's output: mlp_neurons is not mapped")
        v["mlp_output"] = Value("output" if isinstance(c.output, torch.Tensor) else "output[0]", view=view, sure="sure")
        for k in kids:
            if k.path not in self.seen:
                self.seen.add(k.path)
                if not isinstance(self.modules[k.path], (torch.nn.Linear, torch.nn.Dropout)):
                    p.todos.append(f"{k.path} ({k.cls}) inside the MLP is not mapped")

    def moe(self, c: ModuleCall, hpath: str, experts_name: str) -> None:
        p, rec = self.p, self.rec
        host = p.host(hpath, c.cls, "the block's mixture of experts")
        self.seen.add(c.path)
        p.traits.append("Mixture of experts")
        v = host.values
        bpath = c.path
        kids = rec.children_calls(bpath)
        ex = next(k for k in kids if self.child(k.path, bpath) == experts_name)
        if hasattr(self.modules[ex.path], "_is_expert_parallel"):  # behind transformers' experts interface (its
            # use_experts_implementation sets this); DBRX's experts loop over the experts in their own forward
            p.experts = ["eager", "batched_mm", "grouped_mm"]
        self.name_in(bpath, experts_name, "experts", hpath)
        self.seen.add(ex.path)
        ex_in = ex.kwargs if ex.kwargs else {}
        sig = list(inspect.signature(self.modules[ex.path].forward).parameters)
        args = {**{n: a for n, a in zip(sig, ex.args)}, **ex_in}
        idx_name, w_name = _routing_params(self.modules[ex.path]) or ("top_k_index", "top_k_weights")
        idx, w = args.get(idx_name), args.get(w_name)

        def view_of(t: Any, dims: int = 2) -> str | None:
            """The view back to [batch, seq, ...] of a tensor over the flattened tokens."""
            t = tensor_of(t)
            flat_tokens = t is not None and t.dim() == dims and t.shape[0] == self.batch * self.seq
            return "unflatten(0, [batch, seq])" if flat_tokens else None
        v["mlp_activation"] = Value(missing="no activation of one width per token: each token runs through top_k "
                                            "experts (and any shared expert has its own)", sure="sure")
        v["mlp_neurons"] = Value(missing="no down projection input of one width per token: each routed expert has "
                                         "its own, inside the experts interface", sure="sure")
        ne = self.params.get("num_experts") or next((self.params[k] for k in ("num_local_experts", "n_routed_experts")
                                                      if k in self.params), None)
        router = next((k for k in kids if k.start < ex.start and tensor_of(k.output) is not None
                       and tensor_of(k.output).shape[-1] == ne), None)  # type: ignore[union-attr]
        logits = None
        if router is not None:
            rname = self.name_in(bpath, self.child(router.path, bpath), "router", hpath)
            self.seen.add(router.path)
            if isinstance(self.modules[router.path], torch.nn.Linear):
                logits = tensor_of(router.output)
                first = "output" if isinstance(router.output, torch.Tensor) else "output[0]"  # a Linear that returns more
                # one that routes inside its own forward has used the logits before they are returned: not editable there
                v["router_logits"] = Value(f"{rname}.{first}", view=view_of(logits), edit=None if first == "output" else "none",
                                           sure="sure: the router's linear" + ("" if first == "output" else
                                                                              ", which routes in its own forward"))
            else:
                lin = next((o for o in rec.ops_in(router.path) if o.name == "linear"), None)
                if lin is not None:
                    logits = tensor_of(lin.output)
                    v["router_logits"] = Value(f"{rname} > op:linear.output", view=view_of(logits),
                                               sure="likely: the linear inside the router's forward")
        else:
            p.todos.append(f"{bpath}: no child gives one logit per expert before the experts run: router_logits")
        v["expert_weights"] = Value(f"experts.input.{w_name}", view=view_of(w), sure="sure: the experts' argument")
        v["expert_indices"] = Value(f"experts.input.{idx_name}", view=view_of(idx), sure="sure: the experts' argument")
        routed = tensor_of(ex.output)
        slots = None
        for occ, o in enumerate(x for x in rec.ops_in(ex.path) if x.name == "view"):
            t = tensor_of(o.output)
            if t is not None and t.dim() == 3 and routed is not None and holds(t.sum(1), routed, 1e-5) is not None:
                slots = (occ, t)
        if slots is not None:
            occ = slots[0]
            v["expert_outputs"] = Value(f"experts > call:experts > op:view{f'#{occ}' if occ else ''}.output",
                                        view=view_of(slots[1], 3),
                                        needs="experts_mm", sure="likely: the per-slot view the experts sum")
            host.identities.append(ident("sum(expert_outputs, 2) == routed_output", 1e-6, "held on the tiny model"))
        v["routed_output"] = Value("experts.output", view=view_of(routed), sure="sure: the experts' output")
        out = tensor_of(c.output)
        # (the entries of the config's own sub-configs too, by their path: DBRX's ffn_config.moe_top_k)
        flat = {**self.params, **{f"{s}.{k}": x for s, d in self.params.items() if isinstance(d, dict)
                                  for k, x in d.items()}}

        def named(names: tuple[str, ...]) -> str | None:
            return next((k for n in names for k in flat if k.rsplit(".", 1)[-1] == n), None)
        n_attr = named(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))
        k_attr = named(("num_experts_per_tok", "moe_topk", "moe_top_k")) or next(
            (k for k in ("num_experts_per_tok", "moe_topk", "top_k") if k in self.params
             or isinstance(self.config.to_dict().get(k), int)), None)  # (or the config's own default)
        top_k = next((flat[k] for k in (k_attr, "num_experts_per_tok", "moe_topk") if k and flat.get(k)), None) or \
            getattr(self.config, "num_experts_per_tok", None)
        for key, attr in (("num_experts", n_attr), ("top_k", k_attr),
                          ("norm_topk_prob", "norm_topk_prob" if hasattr(self.config, "norm_topk_prob") else None),
                          ("moe_intermediate_size", "moe_intermediate_size" if "moe_intermediate_size" in self.params else None)):
            if attr:
                p.config[key] = attr
        shared = next((k for k in kids if k.path not in (ex.path, router.path if router else "")
                       and MLP.search(self.role(k.cls))), None)
        if shared is not None:
            sname = self.name_in(bpath, self.child(shared.path, bpath), "shared_experts", hpath)
            sh = p.host(f"{hpath}.{sname}", shared.cls, "the shared expert, a dense MLP")
            self.dense(shared, f"{hpath}.{sname}", flat=view_of(hidden_in(shared)) is not None, host=sh)
            width = self.neurons_width(shared)
            size = self.size_expr(width, ("shared_expert_intermediate_size", "shared_intermediate_size"))
            if size is not None and width != self.params.get(self.tiny.names.get("intermediate", "")):
                sh.dims["intermediate_size"] = "shared_expert_intermediate_size"
                p.config["shared_expert_intermediate_size"] = size
            elif size is None:
                p.todos.append(f"{shared.path}: its MLP is {width} wide and no config entry gives that width")
            so = tensor_of(shared.output)
            gate = next((k for k in kids if isinstance(self.modules[k.path], torch.nn.Linear)
                         and tensor_of(k.output) is not None and tensor_of(k.output).shape[-1] == 1), None)  # type: ignore[union-attr]
            muls = [o for o in rec.ops_in(bpath) if o.name == "mul"]
            for occ, o in enumerate(muls):
                t = tensor_of(o.output)
                if gate is not None and so is not None and holds(lambda: torch.sigmoid(tensor_of(gate.output)) * so, t) == 0.0:  # type: ignore[arg-type]
                    v["shared_expert_output"] = Value(f"op:mul{f'#{occ}' if occ else ''}.output", view=view_of(t),
                                                      sure="likely: the shared expert times its sigmoid gate")
                    gname = self.child(gate.path, bpath)
                    self.seen.add(gate.path)
                    host.identities.append(ident(f"sigmoid({gname}.output) * {sname}.output == tokens(shared_expert_output)",
                                                 0.0, "held on the tiny model"))
                    if routed is not None and out is not None and holds(lambda t=t: (routed + t).reshape(out.shape), out) == 0.0:  # type: ignore[operator]
                        host.identities.insert(0, ident("routed_output + shared_expert_output == mlp_output", 0.0,
                                                        "held on the tiny model"))
                    break
            else:
                if so is not None and routed is not None and out is not None and \
                        holds(lambda: routed.reshape(out.shape) + so.reshape(out.shape), out) is not None:
                    v["shared_expert_output"] = Value(f"{sname}.output", view=view_of(so),
                                                      sure="likely: the shared expert's output, added ungated")
                    e = holds(lambda: routed.reshape(out.shape) + so.reshape(out.shape), out)
                    host.identities.insert(0, ident("routed_output + shared_expert_output == mlp_output", e,
                                                    "held on the tiny model"))
                else:
                    p.todos.append(f"{bpath}: the shared expert {sname} ({shared.cls}) reaches the output by a way the "
                                   "drafter does not know (a gate, a scale): shared_expert_output is not mapped")
        elif routed is not None and out is not None and holds(lambda: routed.reshape(out.shape), out) == 0.0:
            pass
        v["mlp_output"] = Value("output" if isinstance(c.output, torch.Tensor) else "output[0]", sure="sure")
        if logits is not None and isinstance(w, torch.Tensor) and isinstance(idx, torch.Tensor) and top_k:
            probs = torch.softmax(logits.float(), -1)
            top = probs.topk(top_k, -1)
            norm = bool(getattr(self.config, "norm_topk_prob", False))
            vals = top.values / top.values.sum(-1, keepdim=True) if norm else top.values
            if holds(vals.to(w.dtype), w, 1e-6) is not None:
                nt = "norm_topk_prob" if "norm_topk_prob" in p.config else ("True" if norm else "False")
                host.identities.insert(1, ident(f"expert_weights == topk_weights(softmax(router_logits, -1), top_k, {nt})",
                                                0.0, "held on the tiny model"))
            if torch.equal(top.indices, idx):
                host.identities.insert(2, ident("expert_indices == topk_indices(softmax(router_logits, -1), top_k)", 0.0,
                                                "held on the tiny model"))
        for k in kids:
            self.seen.add(k.path)


def _routing_params(m: torch.nn.Module) -> tuple[str, str] | None:
    """(indices, weights): the parameters of an experts module's forward that take the routing."""
    try:
        params = list(inspect.signature(m.forward).parameters)
    except (TypeError, ValueError):
        return None
    idx = next((p for p in params if re.search(r"ind(ex|ices)", p)), None)
    w = next((p for p in params if "weight" in p), None)
    return (idx, w) if idx and w else None


def _title(model_class: str) -> str:
    """The product name the causal-LM class carries: MistralForCausalLM -> Mistral."""
    return re.sub(r"(ForCausalLM|LMHeadModel|ForConditionalGeneration)$", "", model_class) or model_class


def match(rec: Recording, tiny: Tiny, params: dict[str, Any]) -> Proposal:
    return Matcher(rec, tiny, params).run()


__all__ = ["Matcher", "match", "Op"]
