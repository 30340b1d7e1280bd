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
from ..spec import Family
from ..trace.sites import _KERNEL_ROUTES
from ..tree import introspect
from ..tree.given import unwrap
from ..tree.hosts import Host, pattern_of, step
from . import user_specs


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
    :mod:`nnatlas.loading.user_specs`). A family forced by name or a spec is checked against the model's module tree before
    this returns: every mismatch, one NnatlasError (``check=False`` skips it; a :class:`Family` object, such as the
    compiler's tools pass, is taken as given unless ``check=True``).

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
            fam = user_specs.from_env(hf) or (user_specs.drafted(hf) if draft else None)
            if fam is None:
                raise _families.no_family(hf)
        elif check is None:  # picked by its own model type: a shipped family's generated tests hold its tree; a user's
            check = bool(_families.origin(fam))  # family (a spec or a draft added in this process) is checked
    assert fam is not None
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
        if found:
            hint = "" if spec is not None else (
                "\n(nnatlas.wrap(model) without family= picks the family from the model type; "
                f"`nnatlas draft {_families.model_types(hf.config)[0]} --out FILE` drafts a spec for it, which "
                "spec=FILE loads)")
            raise NnatlasError(f"{type(hf).__name__} does not fit family {fam.name}'s spec ({fam.spec_file or 'in memory'}): "
                               f"{len(found)} mismatch{'es' if len(found) != 1 else ''}:\n  " + "\n  ".join(found) + hint)
    return made


def mismatches(model: AtlasModel) -> list[str]:
    """Every way ``model``'s module tree differs from its family's spec: a config entry the config cannot answer, a
    renamed child or a host path with no module, a host of another class than the spec names, a child module a
    value is read at that is not there, a layer count other than the config's. One line per problem, with the blocks
    it occurs on."""
    fam = model._family
    where: dict[str, list[str]] = {}  # problem, with [i] for the block -> the blocks (or labels) it occurs on

    def add(problem: str, label: str) -> None:
        where.setdefault(problem, []).append(label)

    for name in fam.config:
        try:
            model.config_value(name)
        except Unavailable:
            continue
        except Exception as e:  # noqa: BLE001 - the config of another family's model: said as its problem
            add(f"config entry {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", "model")
    # the renames into a vision encoder a text-only load does not build (qwen3_5_text's projector inside its vision)
    unbuilt = [n for std, natives in fam.rename.items() if _optional(fam, std) for n in natives]
    for std, natives in fam.rename.items():
        if _optional(fam, std) or any(n.startswith(f"{u}.") for n in natives for u in unbuilt):
            continue
        parent = std.rsplit(".", 1)[0] if "." in std else "model"
        hosts = [(label, h) for label, h in _hosts_at(model, parent) if h is not None]
        missing = [(label, h) for label, h in hosts if not any(_resolves(h, n) for n in natives)]
        # a child some blocks have (a router on the mixture blocks only) is missing only when no block has it
        if missing and len(missing) == len(hosts):
            for label, h in missing:
                add(f"{std} (the spec's name for {' or '.join(natives)}): " + _missing(h, natives[0]), label)
    paths = list(dict.fromkeys(h.path for h in fam.hosts))
    for path in paths:
        places = _hosts_at(model, path)
        anywhere = any(host is not None for _, host in places)
        for label, host in places:
            applies = model.specs_at(path, _index(label))
            if not applies:
                continue
            if host is None:
                # a host of a kind (its ``when`` holds here) must be here; a child without one that no block has
                # (a hybrid's self_attn is on some blocks) is missing only when no block has it
                if any(s.when is not None for s in applies) or not (anywhere or _optional(fam, path)):
                    add(f"{path}: no module '{label.rpartition('.')[2]}' here", label)
                continue
            names = {c.__name__ for c in type(introspect.native(host)).__mro__}
            accepted = {s.cls for s in applies} | (set(fam.classes) if path == "model" else set())
            if not names & accepted:
                add(f"{path}: the spec names class {' or '.join(sorted(accepted))}, the module is "
                    f"{type(introspect.native(host)).__name__}", label)
            for s in applies:
                for v in s.values:
                    read = v.read
                    if read.kind not in ("module", "call", "op", "method") or not read.module or read.up or \
                            read.scope_root:
                        continue
                    node: Any = host
                    for part in read.module:
                        nxt = introspect.child(node, part) if isinstance(node, Host) else None
                        std = part if introspect.label(node) == "" else f"{_pattern(node)}.{part}"
                        if nxt is None and std in fam.rename:
                            break  # a renamed child that is missing: said at its rename
                        if nxt is None:
                            add(f"{path}.{v.name} ('{read.text}'): {_at(node).replace(label, path)} has no child "
                                f"module '{part}'" + _children(introspect.native(node)), label)
                            break
                        node = nxt
    if "num_layers" in fam.config and "layers" in {p.partition("[i]")[0] for p in paths}:
        try:
            want = model.config_value("num_layers")
            have = sum(1 for _ in _hosts_at(model, "layers[i]"))
        except Exception:  # noqa: BLE001 - said above, as its config entry's problem
            want = have = None
        if isinstance(want, int) and want != have:
            add(f"layers: the config says {want} layers (num_layers), the model has {have} blocks", "model")
    out = []
    for problem, labels in where.items():
        blocks = [lab for lab in labels if lab != "model"]
        on = f" (on {_blocks(blocks)})" if len(blocks) > 1 or (blocks and "[" in blocks[0]) else ""
        out.append(problem + on)
    return out


def _optional(fam: Family, path: str) -> bool:
    """Whether every value at ``path`` and under it needs the image-text load (a vision encoder, which a text-only
    load does not build)."""
    values = [v for h in fam.hosts if h.path == path or h.path.startswith((f"{path}.", f"{path}["))
              for v in h.values]
    return any(v.needs is not None and v.needs.name == "processor" for v in values) and \
        all(v.needs is not None and (v.needs.name == "processor" or v.needs.never) for v in values)


def _pattern(node: Host) -> str:
    return pattern_of(introspect.label(node))


def _index(label: str) -> int | None:
    head = label.partition("[")[2].partition("]")[0]
    return int(head) if head.isdigit() else None


def _hosts_at(model: AtlasModel, path: str) -> list[tuple[str, Host | None]]:
    """Each place the spec path ``path`` names on this model: (its label, its host or None where the module is
    missing). Nothing under a missing parent (that parent's own problem is said once)."""
    if path == "model":
        return [("model", model)]
    head, bracket, rest = path.partition("[i]")
    node: Any = model
    for part in head.split("."):
        nxt = introspect.child(node, part) if isinstance(node, Host) else None
        if nxt is None:
            return [] if node is not model or bracket else [(path, None)]
        node = nxt
    if not bracket:
        return [(path, node)] if isinstance(node, Host) else []
    out: list[tuple[str, Host | None]] = []
    for i in range(len(node)):
        host: Any = node[i]
        label = f"{head}[{i}]"
        for part in [p for p in rest.split(".") if p]:
            nxt = step(host, part)  # a child, or an item of a list child (self_attn[1])
            label += f".{part}"
            if not isinstance(nxt, Host):
                host = None
                break
            host = nxt
        if host is None and label != path.replace("[i]", f"[{i}]", 1):
            continue  # a parent missing on this block: said at its own path
        out.append((label, host))
    return out


def _resolves(host: Host, native: str) -> bool:
    return introspect.resolve_native(introspect.native(host), native) is not None


def _missing(host: Host, dotted: str) -> str:
    """Where the native path ``dotted`` breaks off under ``host``: the module without the child, and its children."""
    node: Any = introspect.native(host)
    label = introspect.label(host) or "model"
    for part in dotted.split("."):
        nxt = node._modules.get(part)
        if nxt is None:
            return f"{label} ({type(node).__name__}) has no child module '{part}'" + _children(node, none="")
        node, label = nxt, f"{label}.{part}"
    return "found"


def _at(node: Any) -> str:
    return f"{introspect.label(node) or 'model'} ({type(introspect.native(node)).__name__})"


def _children(module: torch.nn.Module, none: str = " (it has no child modules)") -> str:
    """A module's children, as a mismatch names them (the first 12); ``none`` where it has none."""
    kids = list(module._modules)
    return f" (its children: {', '.join(kids[:12])}{', ...' if len(kids) > 12 else ''})" if kids else none


def _blocks(labels: list[str]) -> str:
    idx = [_index(lab) for lab in labels]
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
