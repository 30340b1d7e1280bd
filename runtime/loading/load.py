"""``nnatlas.wrap`` / ``nnatlas.load``: a transformers model wrapped as its family's generated class (typed per
family by ``nnatlas.families.<family>.wrap`` / ``load``), and ``route_kernels``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

from .. import registry as _families
from ..errors import InputError, NnatlasError, Unavailable
from ..inputs.processing import load_processor
from ..model import AtlasModel
from ..parallel import tensor_parallel
from ..spec import Family, pattern_of
from ..trace.sites import _KERNEL_ROUTES
from ..tree import fit
from ..tree.given import unwrap
from . import user_specs, version_status


@contextlib.contextmanager
def route_kernels(family: str | AtlasModel, kernels: str = "torch") -> Iterator[None]:
    """Route a family's recurrent kernels (Qwen3.5's gated delta rule …) through their pure-torch
    step, one token at a time, in every trace opened inside the block (this thread or task only).

        with nnatlas.route_kernels(model.family, "torch"):
            with model.trace(prompt):
                states = model.layers[0].linear_attn.states.save()

    Nothing global is touched: the routing lives in a ContextVar reset when the block ends.
    """
    name = family.family if isinstance(family, AtlasModel) else family
    if kernels != "torch":
        raise NnatlasError(f"route_kernels routes to 'torch' only, not {kernels!r}")
    fam = _families.get(name)
    if not any(g.route for g in fam.functions.values()):
        raise NnatlasError(f"{name} has no kernel to route: route_kernels is for families with a recurrent kernel")
    current = dict(_KERNEL_ROUTES.get() or {})
    current[name] = kernels
    token = _KERNEL_ROUTES.set(current)
    try:
        yield
    finally:
        _KERNEL_ROUTES.reset(token)


def wrap(model: torch.nn.Module, tokenizer: Any = None, processor: Any = None,
         family: str | Family | None = None, spec: str | os.PathLike[str] | None = None,
         check: bool | None = None, draft: bool = False) -> AtlasModel:
    """Wrap an already-built transformers model with its family's adapter: an instance of the family's
    generated class (``nnatlas.families.<family>.Model``; ``<family>.wrap`` says so to a type checker).

    The family is picked from the config's model_type (then NNATLAS_SPECS, a folder of your own spec files, for a type
    no shipped family covers); ``family=`` forces one, ``spec=`` names your own spec file (compiled here, see
    :mod:`nnatlas.loading.user_specs`). The family, picked, forced by name or a spec, is checked against the model's
    module tree before this returns (a shipped family too: a checkpoint laid out as no spec describes, a dense block
    where the spec reads a mixture, is refused, not served wrong): every mismatch, one NnatlasError (``check=False``
    skips it; ~5 ms on a 61-block DeepSeek-V3; a :class:`Family` object, such as the compiler's tools pass, is taken
    as given unless ``check=True``).

    A ``peft`` model (LoRA …) is wrapped through the transformers model inside it, and its forward runs
    through the PeftModel (``model.peft``); a compiled model is refused (see :mod:`nnatlas.tree.given`)."""
    if isinstance(model, AtlasModel):
        return model
    if spec is not None and family is not None:
        raise NnatlasError("give family= or spec=, not both")
    hf, peft = unwrap(model)
    if spec is not None:
        fam: Family | None = user_specs.family_for(spec)
    elif family is not None:
        fam = family if isinstance(family, Family) else _families.get(family)
        check = not isinstance(family, Family) if check is None else check
    else:
        fam = _families.find(hf)
        if fam is None:  # no shipped family (nor a user's compiled before): NNATLAS_SPECS, checked as a spec= is
            fam = user_specs.from_env(hf) or (user_specs.drafted(hf, fits=lambda f: mismatches(_new(
                _families.model_class(f) or AtlasModel, f, hf, tokenizer, processor, peft))) if draft else None)
            if fam is None:
                raise _families.no_family(hf)
        elif check is None:  # picked by its own model type: checked as any family is (the generated tests hold the
            check = True  # layouts they build; a checkpoint may be laid out otherwise)
    assert fam is not None
    version_status.check(fam.name, shipped=not _families.origin(fam))  # the status matrix, under this transformers
    if tensor_parallel.is_sharded(hf):  # sharded by transformers' tensor parallel: a family it cannot run says so now
        tensor_parallel.refuse_unshardable(fam.name)
    made = _new(_families.model_class(fam) or AtlasModel, fam, hf, tokenizer, processor, peft)
    if check is not False:
        found = mismatches(made)
        if found and draft and spec is None and family is None and _families.origin(fam).startswith("drafted"):
            # a draft made on another layout of this type (dense blocks first where the first had none): drafted
            # again from this model's own config, then checked as any draft is
            fam = user_specs.drafted(hf)
            made = _new(_families.model_class(fam) or AtlasModel, fam, hf, tokenizer, processor, peft)
            found = mismatches(made)
            if found:  # (drafted on this model's own layout and verified, yet its tree still differs)
                raise user_specs.unfit_draft(hf, fam, found)
        if found:
            kind = _families.model_types(hf.config)[0]
            if spec is not None:
                hint = ""
            elif family is None and not _families.origin(fam):  # the shipped spec, picked by the model type
                hint = (f"\n(the shipped spec does not describe this model's layout: `nnatlas draft {kind} --config "
                        "FOLDER --out FILE` drafts one from its config.json, which spec=FILE loads; check=False serves "
                        "it unchecked)")
            else:
                hint = ("\n(nnatlas.wrap(model) without family= picks the family from the model type; "
                        f"`nnatlas draft {kind} --out FILE` drafts a spec for it, which spec=FILE loads)")
            raise NnatlasError(f"{type(hf).__name__} does not fit family {fam.name}'s spec ({fam.spec_file or 'in memory'}): "
                               f"{len(found)} mismatch{'es' if len(found) != 1 else ''}:\n  " + "\n  ".join(found) + hint)
    return made


def mismatches(model: AtlasModel) -> list[str]:
    """Every way ``model``'s module tree differs from its family's spec (the walk of :func:`nnatlas.tree.fit.misfits`:
    a config entry the config cannot answer, a renamed child or a host path with no module, a host of another class
    than the spec names, a child module, climb or method a value is read at that is not there, a layer count other
    than the config's). One line per problem, with the blocks it occurs on."""
    where: dict[str, list[str]] = {}  # problem, with [i] for the block -> the blocks (or labels) it occurs on
    for m in fit.misfits(model):
        where.setdefault(_words(m), []).append(m.label)
    out = []
    for problem, labels in where.items():
        blocks = [lab for lab in labels if lab != "model"]
        on = f" (on {_blocks(blocks)})" if len(blocks) > 1 or (blocks and "[" in blocks[0]) else ""
        out.append(problem + on)
    return out


def _words(m: fit.Misfit) -> str:
    """A misfit as one line of a wrap's mismatch list (the label's block index said as [i])."""
    if m.kind == "config":
        return f"config entry {m.path}: {m.found}"
    if m.kind == "rename":
        assert m.gap is not None
        return (f"{m.path} (the spec's name for {' or '.join(m.natives)}): {m.gap.at} ({m.gap.cls}) has no child module "
                f"'{m.gap.part}'" + fit.children_words(m.gap.native, none=""))
    if m.kind == "missing":
        return f"{m.path}: no module '{m.label.rpartition('.')[2]}' here"
    if m.kind == "class":
        return f"{m.path}: the spec names class {' or '.join(m.accepted)}, the module is {m.found}"
    if m.kind == "layers":
        return f"layers: the config says {m.accepted[0]} layers (num_layers), the model has {m.found} blocks"
    head = f"{m.path}.{m.value} ('{m.text}')"
    if m.kind == "climb":
        return f"{head}: climbs above the model"
    assert m.gap is not None
    if m.kind == "method":
        return f"{head}: {m.gap.cls} has no method '{m.gap.part}'"
    at = m.gap.at.replace(m.label, m.path) if m.gap.at.startswith(m.label) else pattern_of(m.gap.at)
    leaves = (f" ('{m.gap.part}' is a child of {m.sibling[0]} ({m.sibling[1]}): a read outside its host starts with ^.)"
              if m.sibling else "")
    return (f"{head}: {at} ({m.gap.cls}) has no child module '{m.gap.part}'"
            + fit.children_words(m.gap.native, none=" (it has no child modules)") + leaves)


def _blocks(labels: list[str]) -> str:
    idx = [fit.index_of(lab) for lab in labels]
    if all(i is not None for i in idx) and len(idx) > 1:
        more = f", ... ({len(idx)} blocks)" if len(idx) > 8 else ""
        return f"blocks {', '.join(str(i) for i in idx[:8])}{more}"
    return ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")


M = TypeVar("M", bound=AtlasModel)


def _new(cls: type[M], family: Family, model: torch.nn.Module, tokenizer: Any, processor: Any, peft: Any = None) -> M:
    if tokenizer is None and processor is not None:
        tokenizer = getattr(processor, "tokenizer", None)
    made = cls(model, family, tokenizer=tokenizer, processor=processor)
    if peft is not None:
        object.__setattr__(made, "_peft", peft)
    return made


class Wrapper(Generic[M]):
    """``nnatlas.families.<family>.wrap``: :func:`wrap` as that family, typed with its generated class."""

    def __init__(self, cls: type[M], family: Family):
        self.cls, self.family = cls, family

    def __call__(self, model: torch.nn.Module, tokenizer: Any = None, processor: Any = None) -> M:
        if isinstance(model, self.cls):
            return model
        if isinstance(model, AtlasModel):
            raise NnatlasError(f"this model is already wrapped as {model.family}; wrap its .native as "
                               f"{self.family.name}")
        hf, peft = unwrap(model)
        return _new(self.cls, self.family, hf, tokenizer, processor, peft)


class Loader(Generic[M]):
    """``nnatlas.families.<family>.load``: :func:`load` as that family, typed with its generated class."""

    def __init__(self, cls: type[M], family: Family):
        self.cls, self.family = cls, family

    def __call__(self, name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True,
                 **kwargs: Any) -> M:
        hf, tok, processor = _from_pretrained(name_or_path, task, tokenizer, kwargs)
        return _new(self.cls, self.family, hf, tok, processor)


def _check_path(name: Any) -> None:
    """A name that can only be a local path (absolute, ./ ../ ~, a trailing slash, or more than one
    slash: a hub id is ``name`` or ``namespace/name``) must exist, else say so (transformers would
    say the repo id is malformed, or try the hub)."""
    import os

    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"nnatlas.load: expected a local directory or a hub id ('namespace/name'), got {name!r}")
    path_like = (os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\")) or name.endswith(("/", os.sep))
                 or name.count("/") > 1 or name in (".", ".."))
    if path_like and not os.path.exists(os.path.expanduser(name)):
        raise InputError(f"nnatlas.load: the path {name} does not exist (expected a local model directory, or a "
                         "hub id such as 'namespace/name')")


def load(name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True,
         spec: str | os.PathLike[str] | None = None, draft: bool = False, **kwargs: Any) -> AtlasModel:
    """``from_pretrained`` with the family picked from the config, then :func:`wrap`.

    ``task="text-generation"`` loads the causal-LM class (``AutoModelForCausalLM``); a multimodal
    checkpoint that transformers has no causal-LM class for (Qwen3-VL) loads its wrapper
    (``...ForConditionalGeneration``) without a processor, so its vision values are Unavailable.
    ``task="image-text-to-text"`` loads the wrapper (``AutoModelForImageTextToText``) with its
    processor (built without torchvision when torchvision is missing: images only, no videos).
    Keyword arguments (``dtype``, ``attn_implementation``, ``device_map`` …) go to ``from_pretrained``.
    ``nnatlas.families.<family>.load`` does the same as one family, typed with its generated class.
    ``spec="my_family.yaml"``: your own spec file, compiled (and its problems said) before the weights load, then the
    model is checked against it (see :func:`wrap`); without it, a model type no shipped family covers is looked up in
    the folder NNATLAS_SPECS names, then drafted when ``draft=True`` (see :func:`wrap`).
    """
    if spec is not None:
        user_specs.family_for(spec)  # its problems before the weights load (compiled once: wrap finds it compiled)
    if kwargs.get("tp_plan") is not None or kwargs.get("distributed_config") is not None:
        _check_shardable(name_or_path)
    hf, tok, processor = _from_pretrained(name_or_path, task, tokenizer, kwargs)
    return wrap(hf, tokenizer=tok, processor=processor, spec=spec, draft=draft)


def _check_shardable(name_or_path: str) -> None:
    """Before tensor parallel loads anything: a config class without a TP plan, or a family transformers' tensor
    parallel fails on, says so (not a failure deep inside transformers' loading or forward)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(name_or_path)
    if tensor_parallel.plan_of_config(config) is None:
        raise Unavailable(f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): transformers "
                          "cannot shard it with tp_plan='auto'. Load it without tp_plan (device_map='auto' places "
                          "its layers across devices)")
    for model_type in _families.model_types(config):
        tensor_parallel.refuse_unshardable(model_type)


def _from_pretrained(name_or_path: str, task: str, tokenizer: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(the transformers model, its tokenizer, its processor) as :func:`load` builds them."""
    import transformers

    if task not in ("text-generation", "image-text-to-text"):
        raise NnatlasError(f"task {task!r} is not supported; use 'text-generation' or 'image-text-to-text'")
    _check_path(name_or_path)
    if task == "image-text-to-text":
        hf = transformers.AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
        hf.eval()
        processor = load_processor(name_or_path)
        return hf, getattr(processor, "tokenizer", None), processor
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except ValueError as e:  # no causal-LM class for this config: a multimodal wrapper, text only
        config = transformers.AutoConfig.from_pretrained(name_or_path)
        if getattr(config, "vision_config", None) is None:
            raise
        try:
            hf = transformers.AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
        except ValueError:
            raise e from None
    hf.eval()
    tok = None
    if tokenizer is True:
        try:
            tok = transformers.AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError, TypeError):
            tok = None
    elif tokenizer not in (None, False):
        tok = tokenizer
    return hf, tok, None
