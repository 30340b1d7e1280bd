"""Names researchers bring from elsewhere, and the standard names that hold the same tensors.

- TransformerLens hook names: ``blocks.3.hook_resid_post`` → ``layers[3].layer_output``,
  ``blocks.0.attn.hook_pattern`` → ``layers[0].self_attn.attention_probabilities``;
- SAE hook points, named after TransformerLens: ``resid_post`` → ``layers[i].layer_output``;
- nnsight and transformers module paths: ``model.model.layers[0].self_attn.output``,
  ``model.layers.0.mlp.down_proj`` → the standard host that holds that module.

The family pages print the same tables ("coming from"): :data:`TRANSFORMER_LENS` and :data:`SAE_POINTS`
are read by the compiler from here. ``model.value(name)`` resolves any of these on purpose, and an
unknown name's :class:`~nnatlas.UnknownName` suggests the standard name a foreign one stands for.
"""

from __future__ import annotations

import re
from typing import Any

# TransformerLens hook names → the standard value that holds the same tensor (host path, value, what differs).
# ``{softmax}`` / ``{attn}``: the block's attention host (``self_attn``, ``attn`` ...), whichever serves the value.
TRANSFORMER_LENS: tuple[tuple[str, str, str, str], ...] = (
    ("hook_embed", "model", "token_embeddings", ""),
    ("blocks.{i}.hook_resid_pre", "layers[i]", "layer_input", ""),
    ("blocks.{i}.ln1.hook_normalized", "layers[i]", "attention_norm_output", "TransformerLens folds the norm's gain into W_Q/W_K/W_V by default; this is the native norm's output, gain applied"),
    ("blocks.{i}.attn.hook_rot_q", "layers[i].{softmax}", "attention_queries", "after the rotary, [batch heads seq head_dim] (TransformerLens: [batch seq heads head_dim])"),
    ("blocks.{i}.attn.hook_q", "layers[i].{softmax}", "attention_queries", "TransformerLens's hook_q is before the rotary; attention_queries is after it"),
    ("blocks.{i}.attn.hook_rot_k", "layers[i].{softmax}", "attention_keys", "after the rotary, per key/value head"),
    ("blocks.{i}.attn.hook_k", "layers[i].{softmax}", "attention_keys", "TransformerLens's hook_k is before the rotary; attention_keys is after it, per key/value head"),
    ("blocks.{i}.attn.hook_v", "layers[i].{softmax}", "attention_values", "per key/value head (no repeat to the query heads)"),
    ("blocks.{i}.attn.hook_attn_scores", "layers[i].{softmax}", "attention_scores", ""),
    ("blocks.{i}.attn.hook_pattern", "layers[i].{softmax}", "attention_probabilities", ""),
    ("blocks.{i}.attn.hook_z", "layers[i].{softmax}", "attention_head_outputs", ""),
    ("blocks.{i}.hook_attn_out", "layers[i].{attn}", "attention_output", ""),
    ("blocks.{i}.hook_resid_mid", "layers[i]", "layer_mid", ""),
    ("blocks.{i}.ln2.hook_normalized", "layers[i]", "mlp_norm_output", ""),
    ("blocks.{i}.mlp.hook_pre", "layers[i].mlp", "mlp_activation", "TransformerLens's hook_pre is before the activation; mlp_activation is after it"),
    ("blocks.{i}.mlp.hook_post", "layers[i].mlp", "mlp_neurons", ""),
    ("blocks.{i}.hook_mlp_out", "layers[i].mlp", "mlp_output", ""),
    ("blocks.{i}.hook_resid_post", "layers[i]", "layer_output", ""),
    ("ln_final.hook_normalized", "model", "final_norm_output", ""),
    ("unembed.hook_out (the logits)", "model", "logits", ""),
)

# SAE releases name their hook point after TransformerLens (resid_pre / resid_mid / resid_post …)
SAE_POINTS: tuple[tuple[str, str, str], ...] = (
    ("resid_pre", "layers[i]", "layer_input"),
    ("resid_mid", "layers[i]", "layer_mid"),
    ("resid_post", "layers[i]", "layer_output"),
    ("attn_out", "layers[i].{attn}", "attention_output"),
    ("mlp_out", "layers[i].mlp", "mlp_output"),
    ("hook_z", "layers[i].{softmax}", "attention_head_outputs"),
)

# TransformerLens's containers → the standard ones
CONTAINERS = {"blocks": "layers", "ln_final": "norm", "embed": "embed_tokens", "unembed": "lm_head"}
BOUNDARY_WORDS = ("output", "input", "inputs")


def _tl_patterns() -> list[tuple[re.Pattern[str], str, str]]:
    out = []
    for tl, host, value, _ in TRANSFORMER_LENS:
        name = tl.split(" ", 1)[0]
        out.append((re.compile(re.escape(name).replace(re.escape("{i}"), r"(?P<i>\d+)") + "$"), host, value))
    return out


_TL = _tl_patterns()
_INDEX = re.compile(r"\[(\d+)\]")


def _host_of(model: Any, pattern: str, value: str, index: int | None) -> str | None:
    """``pattern`` with its block index and attention placeholder filled: the host path that serves ``value``
    on block ``index`` (``layers[i].{softmax}`` → ``layers[3].self_attn``), or None."""
    if "{" not in pattern:
        path = pattern
    else:
        base = pattern.split(".{", 1)[0]
        candidates = [h.path for h in model._family.hosts if h.path.startswith(base + ".")
                      and h.path.count(".") == base.count(".") + 1 and any(v.name == value for v in h.values)]
        if not candidates:
            return None
        if index is not None:
            live = [p for p in candidates if any(v.name == value for s in model.specs_at(p, index) for v in s.values)]
            candidates = live or candidates
        path = candidates[0]
    return path.replace("[i]", f"[{index}]") if index is not None else path


def transformer_lens(model: Any, name: str) -> str | None:
    """The standard path of a TransformerLens hook name (``blocks.3.hook_resid_post`` → ``layers[3].layer_output``)."""
    for pattern, host, value in _TL:
        m = pattern.match(name)
        if m is None:
            continue
        index = int(m.group("i")) if "i" in pattern.groupindex else None
        path = _host_of(model, host, value, index)
        if path is not None:
            return value if path == "model" else f"{path}.{value}"
    return None


def module_path(model: Any, name: str) -> str | None:
    """The standard path of an nnsight or transformers module path (``model.model.layers[0].self_attn.output``,
    ``model.layers.0.mlp.down_proj``): the deepest standard host holding that module, then the native rest."""
    parts = [p for p in _INDEX.sub(r".\1", name).split(".") if p]
    boundary = parts.pop() if parts and parts[-1] in BOUNDARY_WORDS else None
    hosts = {id(host._module): label for label, host in _every_host(model)}
    for start in (0, 1) if parts[:1] == ["model"] else (0,):  # nnsight's root envoy is called model
        node: Any = model._module
        label: str = "model"
        rest: list[str] = []
        for part in parts[start:]:
            child = getattr(node, "_modules", {}).get(part)
            if child is None:
                break
            node = child
            if id(node) in hosts:
                label, rest = hosts[id(node)], []
            else:
                rest.append(part)
        else:
            if not parts[start:]:
                continue
            path = ".".join([label, *rest]) if label != "model" else ".".join(rest) or "model"
            return f"{path}.{boundary}" if boundary else path
    return None


def _every_host(model: Any) -> list[tuple[str, Any]]:
    """Every live host and host list of the model, with its standard label (``layers``, ``layers[2].mlp``)."""
    out: list[tuple[str, Any]] = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in model.live_hosts(path):
            out.append((label, host))
            parent = getattr(host, "_parent", None)
            if "[" in label and parent is not None:  # the list that holds a block: layers
                head = label.rsplit("[", 1)[0]
                lst = model
                for part in head.split("."):
                    lst = lst._child(part) if lst is not None and hasattr(lst, "_child") else None
                if lst is not None:
                    out.append((head, lst))
    return out


def sae_point(name: str) -> str | None:
    """``resid_post`` → ``layer_output (model.layers[i].layer_output)``: what an SAE hook point stands for."""
    return next((f"{value} (model.{pattern}.{value})" for p, pattern, value in SAE_POINTS if p == name), None)


def hint(host: Any, name: str) -> str | None:
    """What an unknown attribute ``name`` on ``host`` stands for, when it is a name from elsewhere: a
    TransformerLens container or hook (``blocks``, ``hook_resid_post``), an SAE hook point (``resid_post``)."""
    model = host._model
    index = _block_index(host._label)
    if name in CONTAINERS:
        return f"'{name}' is TransformerLens's name; nnatlas calls it {CONTAINERS[name]} (model.{CONTAINERS[name]})"
    for point, pattern, value in SAE_POINTS:
        where = _host_of(model, pattern, value, index) if name == point else None
        if where is not None:
            return f"'{name}' (an SAE hook point) is {value}: model.{where}.{value}"
    if name in ("attn", "ln1", "ln2") and index is not None:  # TransformerLens's parts of a block
        value = {"attn": "attention_output", "ln1": "attention_norm_output", "ln2": "mlp_norm_output"}[name]
        pattern = "layers[i].{attn}" if name == "attn" else "layers[i]"
        where = _host_of(model, pattern, value, index)
        if where is not None:
            return (f"'{name}' is TransformerLens's name; here it is model.{where}" if name == "attn" else
                    f"'{name}' is TransformerLens's name; its output is model.{where}.{value}")
    hooks = [row for row in TRANSFORMER_LENS if row[0].split(" ", 1)[0].rsplit(".", 1)[-1] == name]
    if len(hooks) == 1:  # a hook's own name, when only one hook has it (not hook_normalized)
        _, pattern, value, _ = hooks[0]
        where = _host_of(model, pattern, value, index)
        if where is not None:
            full = f"model.{value}" if where == "model" else f"model.{where}.{value}"
            return f"'{name}' is TransformerLens's hook for {value}: {full}"
    return None


def _block_index(label: str) -> int | None:
    m = _INDEX.search(label or "")
    return int(m.group(1)) if m else None


def walk(model: Any, path: str) -> Any:
    """The host, host list or value handle at a standard path (``layers[3].self_attn.attention_output``)."""
    node = model
    for part in path.split("."):
        head, *indices = part.split("[")
        if head != "model" or node is not model:
            node = getattr(node, head)
        for i in indices:
            node = node[int(i.rstrip("]"))]
    return node

