"""The oracle: nnatlas's values against what transformers returns itself, exactly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..model import AtlasModel
from .cases import _fixed_inputs
from .tiny import adapter_module, attention_loads, shared_build, tiny_of
from .values import _blocks_with

ORACLE_ATOL = 0.0  # float32, the same computation: bit-identical


# Model classes whose output_hidden_states starts after the first block (measured, transformers
# 5.24): the Mamba models and RWKV append the stream after each block, so hs[i] is block i's output for
# i < L and hs[L] the final norm's output; the embeddings are not in it.
HIDDEN_STATES_AFTER_BLOCKS = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM",
                                        "RwkvForCausalLM"})


def _oracle_names(model: Any) -> set[str]:
    """Value names the family serves under some load (not missing, not 'never')."""
    return {v.name for h in model.hosts for v in h.values
            if v.read.kind != "missing" and not (v.needs is not None and v.needs.never)}


def _accepts(cls: Any, flag: str) -> bool:
    import inspect

    return flag in inspect.signature(cls.forward).parameters


def _records_router_logits(cls: type) -> bool:
    """The flag is taken through **kwargs by a class that records router_logits with transformers'
    output capturing: the class itself (Glm4Moe, DeepseekV3), or the model it wraps, a class of the
    same modeling file and config whose name ends in Model (Llama4ForCausalLM's Llama4TextModel)."""
    import sys

    import transformers

    module = vars(sys.modules[cls.__module__]).values()
    inner = [c for c in module if isinstance(c, type) and issubclass(c, transformers.PreTrainedModel) and c is not cls
             and c.__name__.endswith("Model") and getattr(c, "config_class", None) is getattr(cls, "config_class", cls)]
    return any("router_logits" in (getattr(c, "_can_record_outputs", None) or {}) for c in (cls, *inner))


def oracle_checks(family: str) -> tuple[tuple[str, str], ...]:
    """(check, attention load) pairs the family's oracle runs on its tiny load: ``hidden_states``
    and ``logits`` under every attention load the tests run; ``attentions`` under eager where the
    family serves ``attention_probabilities``; ``router_logits`` where it serves them and the class
    accepts ``output_router_logits`` (a parameter, or through the router_logits it records); ``image_hidden_states`` and ``image_logits`` on a prompt with
    images where the load takes images."""
    import transformers

    fam = adapter_module(family).FAMILY
    tiny = tiny_of(family)
    names = _oracle_names(fam)
    loads = attention_loads(family)
    out = [(check, a) for a in loads for check in ("hidden_states", "logits")]
    if "eager" in loads and "attention_probabilities" in names:
        out.append(("attentions", "eager"))
    cls = getattr(transformers, tiny["model_class"])
    if "router_logits" in names and (_accepts(cls, "output_router_logits") or _records_router_logits(cls)):
        out.append(("router_logits", loads[0]))
    if tiny.get("processor"):
        out += [(check, loads[0]) for check in ("image_hidden_states", "image_logits")]
    return tuple(out)


def _exact(ours: Any, theirs: Any, what: str) -> None:
    assert isinstance(theirs, torch.Tensor), f"{what}: transformers returned {type(theirs).__name__}"
    assert tuple(ours.shape) == tuple(theirs.shape), f"{what}: nnatlas {tuple(ours.shape)}, transformers {tuple(theirs.shape)}"
    torch.testing.assert_close(ours, theirs, atol=ORACLE_ATOL, rtol=0, msg=lambda m: f"{what}\n{m}")


def check_oracle(family: str, check: str, attn: str, params: Mapping[str, Any] | None = None, at: str = "") -> None:
    """nnatlas's values equal what transformers returns for the same tiny model and inputs (``params``: another tiny
    config of the family, a checkpoint twin's, named by ``at`` in the messages)."""
    model = shared_build(family, params, attn_implementation=attn, perturbed=True)
    native: Any = model.native
    images = check.startswith("image_")
    inputs = _fixed_inputs(model, text_only=not images)
    kind = check.removeprefix("image_")
    at = f"{family}{at} [{attn}]{' with images' if images else ''}"
    with torch.no_grad():
        if kind == "logits":
            theirs = native(**inputs).logits
            with model.trace(dict(inputs)):
                ours = model.logits.save()
            _exact(ours, theirs, f"{at}: logits, plain forward")
        elif kind == "hidden_states":
            _oracle_hidden_states(model, native, inputs, at, images)
        elif kind == "attentions":
            _oracle_blocks(model, native, inputs, at, "attention_probabilities", "output_attentions")
        elif kind == "router_logits":
            _oracle_blocks(model, native, inputs, at, "router_logits", "output_router_logits", tokens_flattened=True)
        else:
            raise ValueError(f"unknown oracle check {check!r}")


def _oracle_hidden_states(model: AtlasModel, native: Any, inputs: Mapping[str, torch.Tensor], at: str,
                          images: bool) -> None:
    n = int(model.num_layers)
    layers: Any = model.layers
    final = "final_norm_output" in _oracle_names(model._family)
    with model.trace(dict(inputs), order="any"):
        ins = [layers[i].layer_input.save() for i in range(n)]
        outs = [layers[i].layer_output.save() for i in range(n)]
        normed = model.final_norm_output.save() if final else None  # type: ignore[attr-defined]
    hs = native(**inputs, output_hidden_states=True).hidden_states
    assert hs is not None and len(hs) == n + 1, f"{at}: {len(hs or ())} hidden states for {n} blocks"
    if type(native).__name__ in HIDDEN_STATES_AFTER_BLOCKS:
        for i in range(n - 1):
            _exact(outs[i], hs[i], f"{at}: layers[{i}].layer_output vs hidden_states[{i}] (after each block)")
            _exact(ins[i + 1], hs[i], f"{at}: layers[{i + 1}].layer_input vs hidden_states[{i}] (after each block)")
        if normed is not None:
            _exact(normed, hs[n], f"{at}: final_norm_output vs hidden_states[{n}] (after the final norm)")
        return
    _exact(ins[0], hs[0], f"{at}: layers[0].layer_input vs hidden_states[0]")
    for i in range(1, n):
        _exact(outs[i - 1], hs[i], f"{at}: layers[{i - 1}].layer_output vs hidden_states[{i}]")
        if not images:  # with images, DeepStack may add to the stream between blocks
            _exact(ins[i], hs[i], f"{at}: layers[{i}].layer_input vs hidden_states[{i}]")
    if normed is not None and tuple(hs[n].shape) != tuple(normed.shape) and n and tuple(hs[n].shape) == tuple(
            outs[n - 1].shape):
        # transformers' last hidden state is the last block's output, not the final norm's (Gemma 3n carries the
        # stream as four copies, merged after the blocks): the stream against it, the final norm's output against
        # what the prediction head reads
        _exact(outs[n - 1], hs[n], f"{at}: layers[{n - 1}].layer_output vs hidden_states[{n}]")
        _exact(normed, _head_input(native, inputs), f"{at}: final_norm_output vs what the prediction head reads")
    elif normed is not None:
        _exact(normed, hs[n], f"{at}: final_norm_output vs hidden_states[{n}] (after the final norm)")


def _head_input(native: Any, inputs: Mapping[str, torch.Tensor]) -> Any:
    """What transformers' prediction head (its output embeddings) is called with, in one plain forward."""
    seen: list[Any] = []
    hook = native.get_output_embeddings().register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        native(**inputs)
    finally:
        hook.remove()
    return seen[-1] if seen else None


def _oracle_blocks(model: AtlasModel, native: Any, inputs: Mapping[str, torch.Tensor], at: str, value: str,
                   flag: str, tokens_flattened: bool = False) -> None:
    """Every block's ``value``, traced, against what transformers returns for ``flag=True`` (the output's
    field of the flag's name without ``output_``: ``attentions``, ``router_logits``), block by block;
    ``tokens_flattened``: transformers returns it with the tokens flattened (router logits), ours is
    compared in that shape."""
    hosts = _blocks_with(model, value)
    assert hosts, f"{at}: no block serves {value}"
    with model.trace(dict(inputs), order="any"):
        ours = [(i, getattr(host, value).save()) for i, host in hosts]
    field = flag.removeprefix("output_")
    theirs = getattr(native(**inputs, **{flag: True}), field)
    n = int(model.num_layers)
    if theirs is not None and len(theirs) == n and len(ours) < n and len({i for i, _ in ours}) == len(ours):
        # one per block, where only some blocks serve the value (MiniMax returns its lightning blocks' states
        # as their "attentions", which are no pattern): each served block against its own entry, and no
        # skipped entry may look like a served one (a spec that forgot the value on some blocks would)
        served = {i for i, _ in ours}
        shapes = {tuple(theirs[i].shape) for i in served}
        for j, entry in enumerate(theirs):
            assert j in served or not isinstance(entry, torch.Tensor) or tuple(entry.shape) not in shapes, \
                f"{at}: transformers returned {field}[{j}] shaped {tuple(entry.shape)} like the served blocks', " \
                f"and nnatlas serves no layers[{j}].{value}"
        theirs = tuple(theirs[i] for i, _ in ours)
    assert theirs is not None and len(theirs) == len(ours), \
        f"{at}: transformers returned {len(theirs or ())} {field}, nnatlas serves {len(ours)}"
    for (i, r), q in zip(ours, theirs):
        if tokens_flattened:
            assert r.numel() == q.numel(), f"{at}: layers[{i}] {value} {tuple(r.shape)} vs {tuple(q.shape)}"
            _exact(r.reshape(q.shape), q, f"{at}: layers[{i}] {value} vs {field} (tokens flattened)")
        else:
            _exact(r, q, f"{at}: layers[{i}] {value} vs {field}")
