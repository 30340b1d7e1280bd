"""The attention and linear-attention (delta rule) mixers of a block, matched on the recording: the interface
call, the projections and their sizes, the norms on queries and keys, the kernel of a gated DeltaNet."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from .match_base import MatchBase
from .measure import hidden_in, holds, ident, tensor_of
from .proposal import Function, Value
from .recorder import FnCall, ModuleCall


class AttentionMatch(MatchBase):
    """The mixers of a block: softmax attention (a module or inline) and the delta rule."""

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
