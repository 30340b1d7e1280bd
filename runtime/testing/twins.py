"""Checkpoint twins: tiny random models laid out as a family's recorded checkpoints (the spec's ``checkpoints:``),
their sizes shrunk by :mod:`nnatlas.testing.shrink`'s one rule, and the checks the generated tests run on them (the
oracle against transformers and every identity, perturbed as the drawn cases are)."""

from __future__ import annotations

from typing import Any

from ..model import AtlasModel
from .cases import Case, _fixed_inputs
from .identities import identities_checked
from .oracle import check_oracle
from .shrink import LAYERS, ShrinkError, build_check, shrink
from .tiny import _nested_copy, adapter_module, first_params, shared_build, tiny_of
from .values import each_host, host_specs


def checkpoints(family: str) -> tuple[str, ...]:
    """The names of the family's recorded checkpoints, in the spec's order."""
    return tuple(getattr(adapter_module(family), "CHECKPOINTS", {}) or {})


def recorded(family: str, checkpoint: str | None = None) -> tuple[str, dict[str, Any]]:
    """(name, config entries) of a recorded checkpoint of ``family`` (the first when ``checkpoint`` is None)."""
    found = dict(getattr(adapter_module(family), "CHECKPOINTS", {}) or {})
    if not found:
        raise ValueError(f"{family}: the spec records no checkpoint (checkpoints:), so it has no twin")
    name = checkpoint if checkpoint is not None else next(iter(found))
    if name not in found:
        raise ValueError(f"{family}: no recorded checkpoint {name!r} (recorded: {', '.join(found)})")
    return name, {k: _nested_copy(v) for k, v in found[name]}


_PARAMS: dict[tuple[str, str], dict[str, Any]] = {}


def twin_params(family: str, checkpoint: str | None = None) -> dict[str, Any]:
    """The tiny config of the checkpoint's twin (:func:`nnatlas.testing.shrink.shrink` of its recorded config, for
    the family's tiny config class); raises :class:`ShrinkError` naming the option when it does not build."""
    import transformers

    name, config = recorded(family, checkpoint)
    key = (family, name)
    if key not in _PARAMS:
        tiny = tiny_of(family)
        config_class = getattr(transformers, tiny["config_class"])
        subs = dict(getattr(config_class, "sub_configs", None) or {})
        text = config.pop("text_config", None) if isinstance(config.get("text_config"), dict) else None
        try:
            if text is not None and "text_config" not in subs:  # a wrapper's checkpoint, the text model's class
                config = {k: v for k, v in config.items() if not k.endswith("_config")}
                params = shrink(config_class, {**config, **text})
            elif text is not None:  # the wrapper's class: its text model shrunk, the rest the family's tiny one
                # (the vision tower and the token ids its tiny processor places)
                from transformers.models.auto.configuration_auto import CONFIG_MAPPING

                params = first_params(family)
                tiny_text = params.get("text_config", {})
                text_class = subs["text_config"]
                if text_class.__name__ == "AutoConfig":
                    text_class = CONFIG_MAPPING[text.get("model_type", tiny_text.get("model_type"))]
                # (as wide as the tiny vision tower's output, its vocabulary holding the tiny processor's tokens)
                keep = {k: tiny_text[k] for k in ("hidden_size", "vocab_size") if k in tiny_text}
                if "hidden_size" in keep:
                    keep["head_dim"] = keep["hidden_size"] // 4
                params["text_config"] = shrink(text_class, text, keep)
                params.update({k: v for k, v in config.items() if isinstance(v, (bool, float, str))})
            else:
                params = shrink(config_class, config)
            # a value the spec pins under tiny.layouts, with its reason, holds on its twins too; a pinned per-block
            # list is the tiny stack's, so a twin (its checkpoint's own layout, cut) keeps its own list
            params.update({k: _nested_copy(r["pin"]) for k, r in (tiny.get("layouts") or {}).items()
                           if "pin" in r and not isinstance(r["pin"], (list, tuple))})
            build_check(config_class, getattr(transformers, tiny["model_class"]), params)
        except ShrinkError as e:
            raise ShrinkError(f"{family}: the twin of {name} cannot be built: {e}") from None
        _PARAMS[key] = params
    return _nested_copy(_PARAMS[key])  # type: ignore[no-any-return]


def twin(family: str, checkpoint: str | None = None, perturbed: bool = True, seed: int = 0,
         attn_implementation: str = "eager", experts: str | None = None) -> AtlasModel:
    """A wrapped tiny model laid out as the recorded ``checkpoint`` of ``family`` (the first when None): every
    non-size option of its config kept, its sizes shrunk by one rule (:mod:`nnatlas.testing.shrink`); ``perturbed``:
    its factors and constant weights drawn from ``seed`` as the generated tests draw them. Shared between calls with
    the same arguments (a trace leaves the model as it found it); build your own to change it."""
    return shared_build(family, twin_params(family, checkpoint), attn_implementation, seed, experts=experts,
                        perturbed=perturbed)


def twin_case(family: str, checkpoint: str, seed: int = 0) -> Any:
    """The twin's case for the identities: the fixed inputs (three rows, unpadded, left- and right-padded; a prompt with
    two images where the load takes images), perturbed."""
    params = twin_params(family, checkpoint)
    model = shared_build(family, params, perturbed=True, seed=seed)
    return Case(family, params, _fixed_inputs(model), seed, perturbed=True)  # (with images where the load takes them)


def check_twin_builds(family: str, checkpoint: str) -> None:
    """The twin builds (a failure names the option it could not keep) and is laid out as the checkpoint: every kind
    of block of the recorded per-block lists appears on the twin."""
    params = twin_params(family, checkpoint)
    _, config = recorded(family, checkpoint)
    blocks = [v for k, v in config.items() if k in LAYERS and isinstance(v, int)]
    for k, v in config.items():
        if isinstance(v, (list, str)) and len(v) in blocks and k in params and params[k] != v \
                and isinstance(params[k], type(v)):
            lost = sorted({repr(x) for x in v} - {repr(x) for x in params[k]})
            assert not lost, f"{family}: the twin of {checkpoint} lost the block kinds {lost} of {k}"
    model = twin(family, checkpoint)
    wrong = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):  # every block's class is one its spec names
        for label, host in each_host(model, path):
            kinds = host_specs(model, host)
            if kinds and not any(s.cls == type(host._module).__name__ for s in kinds):
                wrong.append(f"{label}: native class {type(host._module).__name__}, spec says {[s.cls for s in kinds]}")
    assert not wrong, f"{family}: the twin of {checkpoint}: " + "; ".join(wrong)


def check_twin_oracle(family: str, checkpoint: str, check: str, attn: str) -> None:
    """The oracle (:func:`nnatlas.testing.check_oracle`) on the checkpoint's twin, perturbed."""
    if check == "router_logits":  # a checkpoint with no mixture block (Nemotron-H's dense 9B): no router to compare
        model = twin(family, checkpoint, attn_implementation=attn)
        if not _routers(model):
            return
    check_oracle(family, check, attn, params=twin_params(family, checkpoint), at=f" twin of {checkpoint}")


def _routers(model: AtlasModel) -> bool:
    """Whether any live block of ``model`` serves router_logits."""
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for _, host in each_host(model, path):
            if any(v.name == "router_logits" and v.read.kind != "missing" for s in host_specs(model, host)
                   for v in s.values):
                return True
    return False


def check_twin_identities(family: str, checkpoint: str, path: str, indices: tuple[int, ...],
                          experts: str | None = None) -> None:
    """Every identity ``indices`` at ``path`` on the checkpoint's twin, perturbed, on the fixed inputs. A twin with
    no host of that kind (a block kind this checkpoint lacks) has nothing to check: it passes."""
    identities_checked(twin_case(family, checkpoint), path, indices, experts)  # (0 checked: no host of that kind)


__all__ = ["ShrinkError", "check_twin_builds", "check_twin_identities", "check_twin_oracle", "checkpoints",
           "recorded", "twin", "twin_case", "twin_params"]
