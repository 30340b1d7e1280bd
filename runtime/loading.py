"""``nnatlas.wrap`` / ``nnatlas.load``: a transformers model wrapped as its family's generated class (typed per
family by ``nnatlas.families.<family>.wrap`` / ``load``), and ``route_kernels``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

from . import registry as _families
from .errors import InputError, NnatlasError
from .given import unwrap
from .model import AtlasModel
from .processing import load_processor
from .sites import _KERNEL_ROUTES
from .spec import Family


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
         family: str | Family | None = None) -> AtlasModel:
    """Wrap an already-built transformers model with its family's adapter: an instance of the family's
    generated class (``nnatlas.families.<family>.Model``; ``<family>.wrap`` says so to a type checker).

    A ``peft`` model (LoRA …) is wrapped through the transformers model inside it, and its forward runs
    through the PeftModel (``model.peft``); a compiled model is refused (see :mod:`nnatlas.given`)."""
    if isinstance(model, AtlasModel):
        return model
    hf, peft = unwrap(model)
    fam = family if isinstance(family, Family) else _families.get(family) if family else _families.pick(hf)
    return _new(_families.model_class(fam) or AtlasModel, fam, hf, tokenizer, processor, peft)


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


def load(name_or_path: str, *, task: str = "text-generation", tokenizer: Any = True, **kwargs: Any) -> AtlasModel:
    """``from_pretrained`` with the family picked from the config, then :func:`wrap`.

    ``task="text-generation"`` loads the causal-LM class (``AutoModelForCausalLM``); a multimodal
    checkpoint that transformers has no causal-LM class for (Qwen3-VL) loads its wrapper
    (``...ForConditionalGeneration``) without a processor, so its vision values are Unavailable.
    ``task="image-text-to-text"`` loads the wrapper (``AutoModelForImageTextToText``) with its
    processor (built without torchvision when torchvision is missing: images only, no videos).
    Keyword arguments (``dtype``, ``attn_implementation``, ``device_map`` …) go to ``from_pretrained``.
    ``nnatlas.families.<family>.load`` does the same as one family, typed with its generated class.
    """
    hf, tok, processor = _from_pretrained(name_or_path, task, tokenizer, kwargs)
    return wrap(hf, tokenizer=tok, processor=processor)


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
