"""The MLPs of a block, matched on the recording: a dense MLP (its projections, activation and width) and a
mixture of experts (its router, experts, shared expert and how the routing weights are read)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from .match_base import MatchBase
from .measure import ACT_CLASSES, ACT_OPS, MLP, hidden_in, holds, ident, tensor_of
from .proposal import Host, Value
from .recorder import ModuleCall


class MlpMatch(MatchBase):
    """The MLPs of a block: dense and mixture of experts."""

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
