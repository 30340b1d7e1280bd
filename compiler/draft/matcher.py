"""Match a recorded forward against the vocabulary: which module is the embedding, the positions, the final norm and
the head, the blocks (their kinds: by the config's list of each block's kind, two such lists together, or a
dense-first count) and the norms around each mixer; each block's mixers are matched by :mod:`.match_attention`,
its MLP or mixture by :mod:`.match_mlp`. Every proposal is checked on the recorded tensors; an identity is proposed
only when it held."""

from __future__ import annotations

import itertools
import re
from typing import Any

import torch

from .match_attention import AttentionMatch
from .match_mlp import MlpMatch
from .measure import MLP, NORM, SSM, hidden_in, holds, ident, tensor_of
from .proposal import Host, Identity, Kind, Proposal, Value
from .recorder import ModuleCall, Op, Recording
from .tell import Groups, kind_lists, partitions, two_kinds
from .tiny import DraftError, Tiny, _global


def _kind_name(kind: str) -> str:
    """A kind of block as a spec names it: ``attention`` for full attention, else the kind in lower case."""
    return "attention" if kind in ("full_attention", "attention") else re.sub(r"[^a-z0-9_]", "_", kind.lower())


MLP_ENTRY = re.compile(r"mlp|moe|sparse|expert|dense|ffn", re.I)  # config entries that lay out the MLPs


def _lays_out_mlps(name: str, kinds: list[str]) -> bool:
    """Whether a per-block list names the MLPs' kinds (mlp_layer_types; NemotronH's block types of 'moe' and 'mlp')."""
    return bool(MLP_ENTRY.search(name) or any(MLP_ENTRY.search(k) for k in kinds))


MIXER_ENTRY = re.compile(r"attn|attention|mamba|linear|full|global|local|sliding|conv", re.I)


class Matcher(AttentionMatch, MlpMatch):
    """The whole model (embedding, positions, final norm, head) and its blocks, each block's mixers and MLP matched
    by the parts it inherits."""

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
            for k in h.kinds.values():
                k.identities = list({x.check: x for x in k.identities}.values())
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
        sigs: Groups = {}
        for i in range(n):
            kids = rec.children_calls(f"{layers}.{i}")
            sig = tuple(dict.fromkeys((self.child(c.path, f"{layers}.{i}"), c.cls) for c in kids))
            sigs.setdefault(sig, []).append(i)
        tname, types = "layer_types", list(getattr(self.config, "layer_types", None) or [])
        listed_types = kind_lists(self.config, n)  # the config's lists of each block's kind
        # where the blocks differ, the list whose kinds tell them apart (ExaONE-MoE's mlp_layer_types, not its
        # sliding and full layer_types), else the first
        # (where only the MLPs differ, a list of the MLPs' kinds: Llama 4's layer_types of chunked and full attention
        # blocks may fall on its mixture blocks on a tiny stack, and not on the checkpoint's)
        mlps_only = len(sigs) > 1 and len(self.split_sigs(layers, n)[0]) == 1
        fits = [(t, ts) for t, ts in listed_types if len(sigs) > 1 and partitions(ts, sigs)
                and (not mlps_only or _lays_out_mlps(t, ts))]
        if fits or listed_types:
            tname, types = (fits or listed_types)[0]
        layer_cls = rec.call(f"{layers}.0").cls  # type: ignore[union-attr]
        host = p.host("layers[i]", layer_cls, "the class of every block")
        # each block's kind: (kind name, its when, the list's value) on layers[i], and where the MLPs differ apart
        # from the mixers (Jamba: attention or Mamba by layers_block_type, a mixture every other block by
        # expert_layer_period), its MLP's own kind (name, when) on the MLP host
        split = self.split_kinds(layers, n, sigs, listed_types) if len(sigs) > 1 and not fits else None
        pair = None  # else two lists together, each block's kind a conjunction of both
        if split is None and not fits and len(sigs) > 1:
            pair = next(((a, b) for (a, ta), (b, tb) in itertools.combinations(listed_types, 2)
                         if partitions([f"{x}\0{y}" for x, y in zip(ta, tb)], sigs)), None)
        kinds: list[tuple[tuple[str, str, str] | None, int, tuple[str, str] | None]] = []
        # blocks whose sizes differ by kind (a heterogeneous config's per-layer overrides) are kinds, alike or not
        sized = bool(getattr(self.config, "per_layer_attributes", None))
        if split is not None:
            seen_pairs: dict[tuple[Any, Any], int] = {}
            for i, (bk, mk) in enumerate(split):
                seen_pairs.setdefault((bk, mk), i)
            kinds = [(bk, i, mk) for (bk, mk), i in seen_pairs.items()]
            if any(bk is not None for bk, _, _ in kinds):
                p.traits.append("Hybrid")
        elif pair is not None:
            lists = dict(listed_types)
            by_pair: dict[tuple[str, str], int] = {}
            for i, xy in enumerate(zip(lists[pair[0]], lists[pair[1]])):
                by_pair.setdefault(xy, i)
            kinds = [(("_".join(map(_kind_name, xy)), f"{pair[0]}[i] == {xy[0]!r} and {pair[1]}[i] == {xy[1]!r}", xy[0]),
                      i, None) for xy, i in by_pair.items()]
            p.traits.append("Hybrid")
        elif (len(sigs) > 1 or sized) and len(types) == n and len(set(types)) > 1:
            by_type: dict[str, int] = {}
            for i, t in enumerate(types):
                by_type.setdefault(t, i)
            kinds = [((_kind_name(t), f"{tname}[i] == {t!r}", t), i, None) for t, i in by_type.items()]
            p.traits.append("Hybrid")
        elif len(sigs) > 1:
            p.todos.append(f"the blocks differ ({len(sigs)} kinds) but the config has no layer_types, dense-first "
                           "count, index list or period to tell them apart: only block 0's kind is mapped")
            kinds = [(None, 0, None)]
        else:
            kinds = [(None, 0, None)]
        common: dict[str, Value] | None = None
        classes = {rec.call(f"{layers}.{i}").cls for _, i, _ in kinds}  # type: ignore[union-attr]
        if len(classes) > 1:
            host.cls = None
            host.sure = "one class per kind of block: each kind says its own"
        for kind, i, mlp_kind in kinds:
            kname, when = kind[:2] if kind is not None else ("", "")
            p.kind = (kname, when) if kind is not None else None
            self.kind_type, self.mlp_kind = (kind[2] if kind is not None else None), mlp_kind
            try:
                values, identities = self.block(layers, i, host)
            finally:
                p.kind, self.kind_type, self.mlp_kind = None, None, None
            if kind is None:
                host.values.update(values)
                host.identities.extend(identities)
                continue
            kk = host.kinds.setdefault(kname, Kind(kname, when))
            if len(classes) > 1:
                kk.cls = rec.call(f"{layers}.{i}").cls  # type: ignore[union-attr]
            kk.identities.extend(x for x in identities if all(y.check != x.check for y in kk.identities))
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

    def split_sigs(self, layers: str, n: int) -> tuple[Groups, Groups, dict[Any, str]]:
        """The blocks by their mixers' signature (the block's class and its children but the MLP) and by their MLP's
        (its name and class), and a path of each MLP signature's module."""
        rec = self.rec
        mixer_of: Groups = {}
        mlp_of: Groups = {}
        mlp_at: dict[Any, str] = {}
        for i in range(n):
            bpath = f"{layers}.{i}"
            kids = rec.children_calls(bpath)
            m = next((c for c in kids if MLP.search(self.role(c.cls)) and not NORM.search(c.cls)
                      and not self.mixer_kind(c)), None)
            mlp_sig = (self.child(m.path, bpath), m.cls) if m is not None else None
            mlp_of.setdefault(mlp_sig, []).append(i)
            mlp_at.setdefault(mlp_sig, m.path if m is not None else "")
            mixer_sig = (rec.call(bpath).cls,  # type: ignore[union-attr]
                         tuple(dict.fromkeys((self.child(c.path, bpath), c.cls) for c in kids if c is not m)))
            mixer_of.setdefault(mixer_sig, []).append(i)
        return mixer_of, mlp_of, mlp_at

    def split_kinds(self, layers: str, n: int, sigs: Groups, listed: list[tuple[str, list[str]]]
                    ) -> list[tuple[tuple[str, str, str] | None, tuple[str, str] | None]] | None:
        """Each block's kind where no one list tells the blocks apart: the mixers' kind (by a list, else a period or
        count) on layers[i], the MLPs' (by a list, a dense-first count, an index list or a period) on the MLP host
        where the mixers differ too, else on layers[i]; None where the config tells one of them apart by nothing."""
        from .match_mlp import _routing_params

        mixer_of, mlp_of, mlp_at = self.split_sigs(layers, n)

        def by_list(groups: Groups, mlp: bool) -> list[tuple[str, str, str]] | None:
            name, types = next(((t, ts) for t, ts in listed if partitions(ts, groups) and _lays_out_mlps(t, ts) == mlp),
                               ("", []))
            return [(_kind_name(t), f"{name}[i] == {t!r}", t) for t in types] if name else None

        def by_entry(groups: Groups, prefer: re.Pattern[str], names: dict[Any, str]) -> list[tuple[str, str, str]] | None:
            whens = two_kinds(self.config, groups, n, prefer)
            if whens is None:
                return None
            of = {i: s for s, blocks in groups.items() for i in blocks}
            return [(names[of[i]], whens[of[i]], names[of[i]]) for i in range(n)]

        def mixer_name(sig: Any) -> str:  # the child only this kind of block has (self_attn, mamba), else its class
            others = {x for s in mixer_of if s != sig for x in s[1]}
            own = next((c for c, _ in sig[1] if (c, _) not in others), None)
            return _kind_name(own or self.role(sig[0]))

        def mlp_name(sig: Any) -> str:
            mod = self.modules.get(mlp_at[sig]) if sig is not None else None
            routed = mod is not None and any(_routing_params(x) is not None for x in mod.children())
            return "moe" if routed or re.search(r"moe|sparse|expert|mixture", self.role(sig[1]) if sig else "", re.I) \
                else "dense"

        mixers = None if len(mixer_of) == 1 else by_list(mixer_of, False) or by_entry(
            mixer_of, MIXER_ENTRY, {s: mixer_name(s) for s in mixer_of})
        names = {s: mlp_name(s) for s in mlp_of}
        mlps = None if len(mlp_of) == 1 else by_list(mlp_of, True) or (
            by_entry(mlp_of, MLP_ENTRY, names) if len(set(names.values())) == len(names) else None)
        if (len(mixer_of) > 1 and mixers is None) or (len(mlp_of) > 1 and mlps is None) or (mixers is mlps is None):
            return None
        if mixers is None:  # only the MLPs differ: the kinds are the blocks' (GLM-MoE's dense-first, Qwen2-MoE's step)
            return [(k, None) for k in mlps]  # type: ignore[union-attr]
        if mlps is None:
            return [(k, None) for k in mixers]
        taken = {k[0] for k in mixers}
        return [(a, (f"mlp_{b[0]}" if b[0] in taken else b[0], b[1])) for a, b in zip(mixers, mlps)]

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
        if not mixers and mlps:  # a state-space mixer before an MLP (Jamba's Mamba blocks)
            ssm = self.ssm_mixer(kids, x, exclude={m.path for m in mlps})
            if ssm is not None:
                mixers.append((ssm, "ssm"))
                mixer_paths.add(ssm.path)
        if not mixers:
            p.todos.append(f"no mixer found in {bpath} ({call.cls}): its children "
                           + ", ".join(f"{self.child(c.path, bpath)} ({c.cls})" for c in kids))
        mixer_out = None
        for c, kind in mixers[:1]:
            std = {"linear_attention": "linear_attn", "ssm": "mixer"}.get(kind, "self_attn")
            name = self.name_in(bpath, self.child(c.path, bpath), std, "layers[i]")
            mixer_out = tensor_of(c.output)
            mixer_ref = f"{name}.attention_output"
            if kind == "ssm":
                self.ssm_host(c, f"layers[i].{name}")
                mixer_ref = f"{name}.mixer_output"
            elif kind == "attention":
                self.attention(c, f"layers[i].{name}")
            elif kind == "attention_inline":
                self.inline_attention(c, f"layers[i].{name}")
            else:
                self.delta_net(c, f"layers[i].{name}")
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
            p.sub_kind = (f"layers[i].{name}", *self.mlp_kind) if self.mlp_kind else None
            try:  # (the MLP's hosts take the MLP's own kind where its blocks differ apart from the mixers')
                self.mlp(m, f"layers[i].{name}")
            finally:
                p.sub_kind = None
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
        if x is None or out is None:
            return False
        mixer = self.ssm_mixer(kids, x)
        if mixer is None:
            return False
        mixer_out = tensor_of(mixer.output)
        e = holds(lambda: x + mixer_out, out, 1e-5)  # type: ignore[operator]
        if e is None:
            return False
        name = self.name_in(bpath, self.child(mixer.path, bpath), "mixer", "layers[i]")
        self.ssm_host(mixer, f"layers[i].{name}")
        self.seen.add(bpath)
        identities.append(ident(f"layer_input + {name}.mixer_output == layer_output", e, "held on the tiny model"))
        pre = next((nm for nm in norms if holds(tensor_of(nm.output), hidden_in(mixer)) == 0.0), None)
        if pre is not None:
            values["mixer_norm_output"] = Value(f"{self.child(pre.path, bpath)}.output",
                                                sure="sure: its output is what the mixer is called with")
            identities.append(ident(f"mixer_norm_output == {name}.input", 0.0, "held on the tiny model"))
            self.seen.add(pre.path)
        return True

    def ssm_mixer(self, kids: list[ModuleCall], x: torch.Tensor | None,
                  exclude: frozenset[str] | set[str] = frozenset()) -> ModuleCall | None:
        """The block's state-space mixer: a child that is no norm, named as a mixer (mixer, mamba, ssm), returning
        the stream's shape (None where there is none)."""
        if x is None:
            return None
        return next((c for c in kids if c.path not in exclude and not NORM.search(c.cls) and SSM.search(self.role(c.cls))
                     and tensor_of(c.output) is not None and tensor_of(c.output).shape == x.shape), None)  # type: ignore[union-attr]

    def ssm_host(self, mixer: ModuleCall, hpath: str) -> None:
        """The mixer's host, its output mapped (a TODO says its scan's values are not)."""
        p = self.p
        host = p.host(hpath, mixer.cls, "the block's state-space mixer (its output is added to the stream)")
        host.values["mixer_output"] = Value("output" if isinstance(mixer.output, torch.Tensor) else "output[0]",
                                            sure="sure: what the mixer returns, added to the block's input")
        self.seen.update({mixer.path, *(k.path for k in self.rec.children_calls(mixer.path))})
        p.todos.append(f"{mixer.path} ({mixer.cls}): a state-space mixer: only its output is mapped (its scan's "
                       "inputs, gates and states are not)")


def match(rec: Recording, tiny: Tiny, params: dict[str, Any]) -> Proposal:
    return Matcher(rec, tiny, params).run()


__all__ = ["Matcher", "match", "Op"]
