"""A model as a researcher has it: a PEFT model (LoRA …) or one compiled by ``torch.compile``.

* A ``peft`` model (``get_peft_model(model, LoraConfig(...))``, a ``PeftModel`` loaded from an
  adapter): :func:`unwrap` gives the transformers model inside it (``peft_model.base_model.model``),
  which the family is picked from and the standard names resolve on. Its adapted layers are PEFT's
  (``q_proj`` is a ``lora.Linear`` around the original Linear), so a value read at one includes the
  adapter's contribution, and so does every value downstream of it. The forward runs through the
  PeftModel itself, so what is served is what ``peft_model(**inputs)`` computes, with the adapters as
  they are set then (``with peft_model.disable_adapter():`` around the trace: without them; after
  ``merge_adapter()``: merged). ``model.native`` is the transformers model, ``model.peft`` the PeftModel.
  A prompt-learning adapter (prefix or prompt tuning) changes the inputs rather than layers: refused.
* A compiled model is refused in one line, before any compile runs: a ``torch.compile(model)``
  (an ``OptimizedModule``) and a model compiled in place (``model.compile()``), at ``wrap`` and again
  at each trace (a model compiled in place after it was wrapped). The hooks a trace installs are
  Python calls on module instances, which a compiled graph would trace into or skip; wrap the
  uncompiled model instead (``compiled._orig_mod``).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` PeftModel (without importing peft)."""
    return any(c.__name__ == "PeftModel" and c.__module__.startswith("peft") for c in type(model).__mro__)


def unwrap(model: Any) -> tuple[torch.nn.Module, Any]:
    """(the transformers model to wrap, the PeftModel around it or None); a compiled model or a
    prompt-learning adapter raises InputError (nothing runs)."""
    refuse_compiled(model, "nnatlas.wrap")
    if not is_peft(model):
        if isinstance(model, torch.nn.Module):
            refuse_compiled_inside(model, "nnatlas.wrap")
        return model, None
    configs = getattr(model, "peft_config", {}) or {}
    prompt = [name for name, cfg in configs.items() if getattr(cfg, "is_prompt_learning", False)]
    if prompt:
        kind = getattr(configs[prompt[0]], "peft_type", "prompt learning")
        raise InputError(f"nnatlas.wrap: the adapter {prompt[0]!r} is {getattr(kind, 'value', kind)}, which adds "
                         "virtual tokens to the inputs rather than changing layers; wrap peft_model.base_model and "
                         "pass the prompt's embeddings, or use a layer adapter (LoRA …)")
    inner = getattr(getattr(model, "base_model", None), "model", None)
    if not isinstance(inner, torch.nn.Module):
        raise InputError(f"nnatlas.wrap: found no transformers model inside this {type(model).__name__} "
                         "(expected peft_model.base_model.model)")
    refuse_compiled_inside(model, "nnatlas.wrap")
    return inner, model


def refuse_compiled_inside(model: torch.nn.Module, where: str) -> None:
    """InputError when a module inside ``model`` is compiled in place (``model.layers[0].compile()``)."""
    for name, module in model.named_modules():
        if module.__dict__.get("_compiled_call_impl") is not None:
            raise InputError(f"{where}: the module {name or 'model'} is compiled in place ({name or 'model'}.compile()), "
                             "which nnatlas cannot read inside; wrap a model none of whose modules is compiled")


def refuse_compiled(module: Any, where: str) -> None:
    """InputError when ``module`` is compiled: an OptimizedModule, or compiled in place (``module.compile()``)."""
    orig = getattr(module, "_orig_mod", None)
    if isinstance(orig, torch.nn.Module) and type(module).__name__ == "OptimizedModule":
        raise InputError(f"{where}: this model is compiled by torch.compile, which nnatlas cannot read inside; "
                         "wrap the uncompiled model, compiled._orig_mod (the same weights)")
    if isinstance(module, torch.nn.Module) and module.__dict__.get("_compiled_call_impl") is not None:
        raise InputError(f"{where}: this model is compiled in place (model.compile()), which nnatlas cannot read "
                         "inside; wrap a model that is not compiled (load it again, or compile a copy)")
