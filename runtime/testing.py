"""Tiny random models and inputs for the generated tests, the notes' examples and the benchmarks.

Everything is built locally: configs drawn from a family's ``tiny`` ranges, random weights,
and a word-level tokenizer made in memory, so nothing is downloaded.
"""

from __future__ import annotations

import importlib
import operator
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .model import AtlasModel, wrap

# Tiny models gain nothing from threads, and a batched LAPACK call (the delta rule's
# solve_triangular) runs ~400x slower with two threads on a loaded two-core machine.
torch.set_num_threads(1)

WORDS = ("the eiffel tower is in city of paris france a an and to on at with from by for as it this that "
         "was were be been being have has had do does did not no yes one two three four five six seven "
         "eight nine ten red blue green big small old new first last next good bad hot cold up down").split()


def tiny_tokenizer(vocab_size: int, extra_specials: tuple[str, ...] = (), names: Mapping[str, str] | None = None) -> Any:
    """A word-level tokenizer over ``vocab_size`` ids (unknown words map to [UNK]), built in memory.
    ``extra_specials`` (image tokens ...) take the ids after [PAD] [UNK] [BOS] [EOS], in order;
    ``names`` makes some of them tokenizer attributes (``boi_token`` and ``boi_token_id`` ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", *extra_specials]
    words = (specials + WORDS)[:vocab_size]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if extra_specials:
        tok.add_special_tokens(list(extra_specials))
    named = {"extra_special_tokens": dict(names)} if names else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]", **named)
    # a minimal chat template (the turns' text, then a generation prompt), so the notes' templated
    # examples run; it stands for a checkpoint's template, whose text the notes describe
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}{{ 'yes' if enable_thinking is defined and enable_thinking "
                          "else 'no' }}{% endif %}")
    return fast


def adapter_module(family: str) -> ModuleType:
    return importlib.import_module(f"nnatlas.families.{family}")


def _set_dotted(d: dict[str, Any], name: str, value: Any) -> None:
    *parents, last = name.split(".")
    for p in parents:
        d = d.setdefault(p, {})
    d[last] = value


def _nested_copy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _nested_copy(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [_nested_copy(v) for v in x]
    return x


def draw_params(family: str, choose: Callable[[str, list[Any]], Any]) -> dict[str, Any]:
    """Config parameters for a tiny model; ``choose(name, options)`` picks each drawn entry.
    A dotted name (``vision_config.depth``) sets an entry of a nested config."""
    return draw_from(adapter_module(family).TINY, choose)


def draw_from(tiny: Mapping[str, Any], choose: Callable[[str, list[Any]], Any]) -> dict[str, Any]:
    """:func:`draw_params` from an adapter's ``TINY`` mapping."""
    params: dict[str, Any] = _nested_copy(dict(tiny["config"]))
    scope: dict[str, Any] = _nested_copy(params)
    for name, options, compute in tiny["draw"]:
        value = choose(name, list(options)) if options is not None else compute(scope)
        value = _nested_copy(value)
        _set_dotted(scope, name, value)
        if not name.startswith("_"):
            _set_dotted(params, name, value)
    return params


def _first(name: str, options: list[Any]) -> Any:
    return options[-1] if name in ("num_hidden_layers", "n_layer") else options[0]


def first_params(family: str) -> dict[str, Any]:
    """The smallest-index choice of every drawn entry, with a few blocks: a fixed tiny config."""
    return draw_params(family, _first)


def first_params_from(tiny: Mapping[str, Any], variant: str | None = None) -> dict[str, Any]:
    """:func:`first_params` (of the ``variant`` load when given) from an adapter's ``TINY`` mapping."""
    params = draw_from(tiny, _first)
    if variant is None:
        return params
    return variant_from(tiny[variant], params, lambda name, options: options[0])


def tiny_of(family: str, variant: str | None = None) -> dict[str, Any]:
    """The family's ``tiny`` section, or its second load (``variant="image_text"``: the wrapper)."""
    tiny = adapter_module(family).TINY
    if variant is None:
        return tiny  # type: ignore[no-any-return]
    it = tiny.get(variant)
    if not it:
        raise ValueError(f"{family} has no tiny.{variant} load")
    return {**tiny, **it}  # type: ignore[no-any-return]


def variant_params(family: str, text_params: dict[str, Any], choose: Callable[[str, list[Any]], Any],
                   variant: str) -> dict[str, Any]:
    """The wrapper's config: the drawn text config under text_config, the load's config and draws."""
    return variant_from(adapter_module(family).TINY[variant], text_params, choose)


def variant_from(it: Mapping[str, Any], text_params: dict[str, Any], choose: Callable[[str, list[Any]], Any]
                 ) -> dict[str, Any]:
    params: dict[str, Any] = _nested_copy(dict(it["config"]))
    params["text_config"] = _nested_copy(text_params)
    for name, options, compute in it["draw"]:
        value = choose(name, list(options)) if options is not None else compute(params)
        _set_dotted(params, name, _nested_copy(value))
    return params


def first_variant_params(family: str, variant: str) -> dict[str, Any]:
    return variant_params(family, first_params(family), lambda name, options: options[0], variant)


def build(family: str, params: Mapping[str, Any] | None = None, attn_implementation: str = "eager",
          seed: int = 0, dtype: torch.dtype = torch.float32, experts: str | None = None, processor: bool = True,
          variant: str | None = None) -> AtlasModel:
    """A tiny random model of ``family``, wrapped, with an in-memory tokenizer (and, for a family
    whose ``tiny.processor`` says how, a local processor; ``processor=False`` is the text-only load).
    ``variant="image_text"``: the family's multimodal wrapper load (``tiny.image_text``).
    ``experts``: the experts implementation (``set_experts_implementation``) of a mixture of experts."""
    import transformers

    tiny = tiny_of(family, variant)
    if params is None:
        params = first_variant_params(family, variant) if variant else first_params(family)
    params = _nested_copy(dict(params))
    config = getattr(transformers, tiny["config_class"])(**params)
    config._attn_implementation = attn_implementation
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    hf = getattr(transformers, tiny["model_class"])(config).to(dtype).eval()
    with torch.no_grad():  # a weight matrix the init leaves all zero (Gemma 3's mm_input_projection_weight,
        for name, param in hf.named_parameters():  # which a checkpoint fills) is drawn, so every value reaches
            if param.dim() >= 2 and name.endswith("weight") and not param.any():  # the logits (biases stay)
                param.normal_(0.0, 0.02)
    if experts is not None:
        hf.set_experts_implementation(experts)
    vocab = int(getattr(config.get_text_config(), "vocab_size", 64))
    spec = tiny.get("processor")
    if spec:
        from .processing import tiny_processor

        proc = tiny_processor(spec, vocab)
        if processor:
            return wrap(hf, processor=proc)
        return wrap(hf, tokenizer=proc.tokenizer)
    return wrap(hf, tokenizer=tiny_tokenizer(vocab))


CPU_ATTENTION = ("eager", "sdpa")  # the attention implementations a CPU test can run


def _class_attention(cls: Any) -> tuple[str, ...]:
    """What a transformers model class accepts, from its flags (eager always)."""
    flags = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn",
             "flash_attention_2": "_supports_flash_attn", "flash_attention_3": "_supports_flash_attn"}
    return ("eager", *(impl for impl, flag in flags.items() if getattr(cls, flag, False) is True))


def attention_loads(family: str, variant: str | None = None) -> tuple[str, ...]:
    """The attention implementations the generated tests load ``family`` under: those the spec
    declares (``loads.attention``) or, when it declares none, those the tiny model class accepts;
    of them, the ones that run on CPU."""
    import transformers

    declared = adapter_module(family).FAMILY.attention
    accepted = declared if declared is not None else \
        _class_attention(getattr(transformers, tiny_of(family, variant)["model_class"]))
    return tuple(a for a in CPU_ATTENTION if a in accepted)


def check_attention_loads(family: str) -> None:
    """The declared (or read) attention implementations are exactly those the class builds under, on CPU."""
    runs = attention_loads(family)
    for impl in CPU_ATTENTION:
        try:
            build(family, attn_implementation=impl)
        except ValueError as e:
            assert impl not in runs, f"{family}: loads.attention lists {impl!r}, but the class refuses it: {e}"
        else:
            assert impl in runs, f"{family}: the class builds under {impl!r}, but the tests would not run it " \
                "(add it to loads.attention)"


def tiny_images(sizes: list[tuple[int, int]], seed: int = 0) -> list[Any]:
    """RGB images of the given (width, height), random pixels, made in memory."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in sizes]


def image_prompt_inputs(processor: Any, words: int, sizes: list[tuple[int, int]], seed: int = 0
                        ) -> dict[str, torch.Tensor]:
    """A processor's inputs for ``words`` words after one image placeholder per image."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (max(words, 1),), generator=gen).tolist()
    from .processing import vision_marks

    start, end = vision_marks(processor)
    text = "".join(f"{start}{processor.image_token}{end}" for _ in sizes) + " " + " ".join(WORDS[i] for i in picks)
    out = processor(text=text, images=tiny_images(sizes, seed), return_tensors="pt")
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def draw_inputs(vocab_size: int, batch: int, seq: int, pads: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids and a left-padding mask: row ``b`` has ``pads[b]`` padding positions first."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, max(vocab_size, 5), (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, : min(p, seq - 1)] = 0
        ids[b, : min(p, seq - 1)] = 0
    return {"input_ids": ids, "attention_mask": mask}


def each_host(model: AtlasModel, path: str) -> Iterator[tuple[str, Any]]:
    """Every live host at a spec path (``layers[i].self_attn`` → one per block that has it)."""
    return model.live_hosts(path)


def standard_values(model: AtlasModel, derived: bool = True, needs_images: bool = True) -> list[Any]:
    """Every value handle of every live host that this load serves, in spec order; without the
    derived ones (``derived=False``) or those computed only on a call with images."""
    handles = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for _label, host in model.live_hosts(path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if (not derived and v.read.kind == "derived") or (not needs_images and v.reached is not None):
                        continue
                    handle = getattr(host, v.name)
                    if handle.unavailable() is None:
                        handles.append(handle)
    return handles


class Allocations(TorchDispatchMode):
    """Bytes of the new storages aten ops produce while active (an output that shares its storage
    with an input, a view or ``detach``, counts nothing); the allocator reusing freed memory
    does not hide an allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        fresh: set[int] = set()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in inputs and ptr not in fresh:
                    fresh.add(ptr)
                    self.bytes += storage.nbytes()
        return out


def resolve_term(host: Any, term: str, model: Any = None, index: int | None = None) -> Any:
    """``self_attn.attention_output`` / ``layers[0].layer_input`` / ``o_proj.input`` from a host;
    ``model.layers[i+1].layer_input`` from the root, ``i`` being the host's block index."""
    import re

    node = host
    if term.startswith("model.") and model is not None:
        node, term = model, term[len("model."):]
    if index is not None:
        term = re.sub(r"\[i([+-]\d+)?\]", lambda m: f"[{index + int(m.group(1) or 0)}]", term)
    for part in term.split("."):
        name, _, idx = part.partition("[")
        node = getattr(node, name)
        if idx:
            node = node[int(idx.rstrip("]"))]
    return node


def host_specs(model: AtlasModel, host: Any) -> list[Any]:
    return host._specs() if host is not model else model._specs_for("model", None)


def dims_of(model: AtlasModel, inputs: Mapping[str, torch.Tensor]) -> dict[str, int]:
    batch, seq = inputs["input_ids"].shape
    dims = {k: v for k, v in model.normalized_config.items() if isinstance(v, int)}
    dims.update(batch=int(batch), seq=int(seq), query=int(seq), key=int(seq), one=1)
    grid = inputs.get("image_grid_thw")
    if grid is not None:
        patches = int(grid.prod(-1).sum())
        merge = int(dims.get("vision_spatial_merge_size", 1))
        dims.update(images=1, patches=patches, image_tokens=patches // (merge * merge))
    elif inputs.get("pixel_values") is not None:  # a fixed-size encoder: one row per image
        token_id = int(getattr(model.config, "image_token_id", -1))
        image = torch.eq(torch.as_tensor(inputs["input_ids"]), token_id)
        dims.update(tiles=int(inputs["pixel_values"].shape[0]), image_tokens=int(image.sum()))
    return dims


def expected_shape(layout: Any, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(dims[d] for d in layout.dims)


COMPARE: dict[str, Callable[[Any, Any], Any]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt,
                                                 ">=": operator.ge, "!=": operator.ne}


def assert_identity(identity: Any, lhs: Any, rhs: Any, where: str) -> None:
    if identity.op == "==":
        if not isinstance(lhs, torch.Tensor) and not isinstance(rhs, torch.Tensor):
            assert lhs == rhs, f"{where}: {identity.text}: {lhs!r} != {rhs!r}"
            return
        lhs_t = lhs if isinstance(lhs, torch.Tensor) else torch.as_tensor(lhs)
        rhs_t = rhs if isinstance(rhs, torch.Tensor) else torch.as_tensor(rhs)
        lhs_t, rhs_t = torch.broadcast_tensors(lhs_t.to(torch.float64), rhs_t.to(torch.float64))
        torch.testing.assert_close(lhs_t, rhs_t, atol=identity.atol, rtol=identity.rtol,
                                   msg=lambda m: f"{where}: {identity.text}\n{m}")
    else:
        ok = COMPARE[identity.op](lhs, rhs)
        assert bool(torch.as_tensor(ok).all()), f"{where}: {identity.text} does not hold"


# ---- the checks the generated tests call ---------------------------------------------------

PROMPT = "the eiffel tower is in the city of"


class Case:
    """One drawn tiny config and its inputs."""

    def __init__(self, family: str, params: dict[str, Any], inputs: dict[str, torch.Tensor], seed: int,
                 variant: str | None = None):
        self.family, self.params, self.inputs, self.seed, self.variant = family, params, inputs, seed, variant

    def model(self, attn_implementation: str = "eager", experts: str | None = None) -> AtlasModel:
        return build(self.family, self.params, attn_implementation, seed=self.seed, experts=experts,
                     variant=self.variant)

    def __repr__(self) -> str:
        shape = tuple(self.inputs["input_ids"].shape)
        pads = (self.inputs["attention_mask"] == 0).sum(-1).tolist()
        grid = self.inputs.get("image_grid_thw")
        images = f", image grids {grid.tolist()}" if grid is not None else ""
        return f"Case({self.family}, {self.params}, inputs {shape}, left padding {pads}{images}, seed {self.seed})"


def draw_case(family: str, choose: Callable[[str, list[Any]], Any], data: Any, variant: str | None = None) -> Case:
    from hypothesis import strategies as st

    tiny = tiny_of(family, variant)
    params = draw_params(family, choose)
    if variant is not None:
        params = variant_params(family, params, choose, variant)
    batch = data.draw(st.integers(*tiny["batch"]), label="batch")
    seq = data.draw(st.integers(*tiny["seq"]), label="seq")
    pads = [data.draw(st.integers(0, max(seq - 1, 0)), label="pad") for _ in range(batch)]
    seed = data.draw(st.integers(0, 2**16), label="seed")
    images = tiny.get("images")
    if images:
        from .processing import tiny_processor

        count = data.draw(st.sampled_from(list(images["count"])), label="images")
        sizes = [tuple(data.draw(st.sampled_from(list(images["sizes"])), label="size")) for _ in range(count)]
        vocab = int(params.get("text_config", {}).get("vocab_size", params.get("vocab_size", 64)))
        proc = tiny_processor(tiny["processor"], vocab)
        return Case(family, params, image_prompt_inputs(proc, seq, sizes, seed), seed, variant)  # type: ignore[arg-type]
    vocab = int(params.get("vocab_size", 64))
    return Case(family, params, draw_inputs(vocab, batch, seq, pads, seed), seed)


def _save_all(model: AtlasModel, inputs: Mapping[str, torch.Tensor], names: Callable[[Any], list[str]] | None = None
              ) -> dict[tuple[str, str], tuple[Any, Any, Any]]:
    saved: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
    family = model._family
    with model.trace(dict(inputs), order="any"):
        for path in dict.fromkeys(h.path for h in family.hosts):
            for label, host in each_host(model, path):
                for spec in host_specs(model, host):
                    for v in spec.values:
                        if names is not None and v.name not in names(host):
                            continue
                        handle = getattr(host, v.name)
                        if handle.unavailable() is None:
                            saved[(label, v.name)] = (v, handle.save(), spec)
    return saved


def _routable(model: AtlasModel) -> bool:
    return any(g.route for g in model._family.functions.values())


def check_shapes(case: Case, experts: str | None = None) -> None:
    """Every value this load serves has its layout's shape (a host's ``dims`` resize its layouts);
    families with a routable kernel are checked a second time under ``route_kernels(family, "torch")``,
    where the per-token values exist. ``experts``: the experts implementation of a mixture."""
    import nnatlas

    model = case.model("eager", experts)
    _check_shapes(model, case)
    if _routable(model):
        with nnatlas.route_kernels(model.family, "torch"):
            _check_shapes(model, case)


def _check_shapes(model: AtlasModel, case: Case) -> None:
    saved = _save_all(model, case.inputs)
    assert saved, "no value was saved"
    base = dims_of(model, case.inputs)
    for (label, name), (spec, value, host_spec) in saved.items():
        dims = {**base, **{d: base[e] for d, e in host_spec.dims}}
        if spec.layout.dtype == "object":
            continue
        if spec.layout.optional and getattr(value, "value", value) is None:
            continue
        value = getattr(value, "value", value)
        want = expected_shape(spec.layout, dims)
        at = f"{spec.at}: " if spec.at else ""
        assert tuple(value.shape) == want, f"{at}{label}.{name}: shape {tuple(value.shape)}, layout {spec.layout.text} = {want}"


def _unavailable_term(host: Any, terms: tuple[str, ...], config: Mapping[str, Any], model: Any,
                      block: int | None) -> tuple[str, Any] | None:
    """The first term of an identity this load cannot serve, and why (the value says which load it needs)."""
    from .envoy import Value

    for term in terms:
        if term in config:
            continue
        handle = resolve_term(host, term, model, block)
        why = handle.unavailable() if isinstance(handle, Value) else None
        if why is not None:
            return term, why
    return None


def check_identity(case: Case, path: str, index: int, experts: str | None = None) -> None:
    from .errors import Unavailable

    model = case.model("eager", experts)
    config = model.normalized_config
    checked = 0
    for label, host in list(each_host(model, path)):
        identities = [i for s in host_specs(model, host) for i in s.identities]
        spec_ids = [i for s in model._family.hosts if s.path == path for i in s.identities]
        if index >= len(spec_ids) or spec_ids[index] not in identities:
            continue
        identity = spec_ids[index]
        found = re.search(r"\[(\d+)\]", label)
        block = int(found.group(1)) if found else None
        missing = _unavailable_term(host, identity.terms, config, model, block)
        if missing is not None:
            # this load cannot serve a term: reading it must say so, naming the load that serves it
            term, why = missing
            try:
                with model.trace(dict(case.inputs)):
                    resolve_term(host, term, model, block).save()
            except Unavailable as e:
                assert str(e) == str(why)
            else:
                raise AssertionError(f"{label}.{term}: unavailable() says {why}, yet the trace read it")
            checked += 1  # checked: the value says which load it needs
            continue
        values: dict[str, Any] = {}
        with model.trace(dict(case.inputs), order="any"):
            for term in identity.terms:
                if term in config:
                    values[term] = config[term]
                else:
                    values[term] = resolve_term(host, term, model, block).save()
        values.setdefault("attention_mask", case.inputs["attention_mask"])
        lhs, rhs = identity.check(values)
        assert_identity(identity, lhs, rhs, f"{identity.at + ': ' if identity.at else ''}{label} ({case!r})")
        checked += 1
    from hypothesis import assume

    assume(checked > 0)  # a block kind this drawn config lacks: draw another (none at all fails the test)


def _first_host(model: AtlasModel, path: str, name: str | None = None) -> tuple[str, Any]:
    for label, host in each_host(model, path):
        if name is None or any(s.value(name) for s in host_specs(model, host)):
            return label, host
    raise AssertionError(f"no live host at {path}" + (f" with {name}" if name else ""))


def check_native_class(family: str, path: str, variant: str | None = None) -> None:
    model = build(family, variant=variant)
    specs = [h for h in model._family.hosts if h.path == path]
    found = list(each_host(model, path))
    assert found, f"{path}: no native module found (check rename)"
    for label, host in found:
        kinds = host_specs(model, host)
        if not kinds:
            continue
        names = {type(host._module).__name__}
        assert any(s.cls in names for s in specs), f"{label}: native class {names}, spec says {[s.cls for s in specs]}"


FIXED_SIZES = [(16, 16), (24, 16)]


def _fixed_inputs(model: AtlasModel, text_only: bool = False) -> dict[str, torch.Tensor]:
    """Two sequences of token ids, or (a family with images) one prompt with two images of different grids."""
    if model.processor is not None and not text_only:
        return image_prompt_inputs(model.processor, 5, FIXED_SIZES, seed=1)
    vocab = int(model.normalized_config["vocab_size"])
    return draw_inputs(vocab, 2, 6, [0, 2], seed=1)


def check_edit(family: str, path: str, name: str, experts: str | None = None, variant: str | None = None) -> None:
    """Writing a value back unchanged leaves logits bit-identical; zeroing it changes them (under
    ``route_kernels`` for a value that needs it; under ``experts``, the experts implementation)."""
    import contextlib

    import nnatlas

    model = build(family, attn_implementation="eager", experts=experts, variant=variant)
    spec = next(v for h in model._family.hosts if h.path == path for v in h.values if v.name == name)
    routed = spec.needs is not None and spec.needs.name == "torch_kernels"
    with nnatlas.route_kernels(family, "torch") if routed else contextlib.nullcontext():
        _check_edit(model, path, name)


def _check_edit(model: AtlasModel, path: str, name: str) -> None:
    from .errors import Unavailable

    inputs = _fixed_inputs(model)
    label, host = _first_host(model, path, name)
    why = getattr(host, name).unavailable()
    if why is not None:
        # the value names the load it needs; under this one, reading or editing it says so
        for body in (lambda: getattr(host, name).save(), lambda: setattr(host, name, 0)):
            try:
                with model.trace(dict(inputs)):
                    body()
            except Unavailable as e:
                assert str(e) == str(why)
            else:
                raise AssertionError(f"{label}.{name}: unavailable() says {why}, yet the trace served it")
        return
    with model.trace(dict(inputs)):
        base = model.logits.save()
    with model.trace(dict(inputs)):
        setattr(host, name, getattr(host, name))
        same = model.logits.save()
    assert torch.equal(base, same), f"{label}.{name}: writing the value back changed the logits"
    with model.trace(dict(inputs)):
        getattr(host, name)[:] = 0
        zeroed = model.logits.save()
    assert not torch.equal(base, zeroed), f"{label}.{name}: zeroing the value did not change the logits"
    with model.trace(dict(inputs)):
        setattr(host, name, lambda x: x * 0)
        fn_zeroed = model.logits.save()
    torch.testing.assert_close(fn_zeroed, zeroed, atol=0, rtol=0)


def check_readonly(family: str, path: str, name: str, variant: str | None = None) -> None:
    from .errors import NnatlasError

    model = build(family, variant=variant)
    _, host = _first_host(model, path, name)
    try:
        with model.trace(dict(_fixed_inputs(model))):
            setattr(host, name, 0)
    except NnatlasError as e:
        assert "read-only" in str(e)
    else:
        raise AssertionError(f"{path}.{name} is derived, yet assigning it raised nothing")


def check_missing(family: str, path: str, name: str) -> None:
    """A value the family marks missing: support() and a trace both say why."""
    from .errors import Unavailable

    model = build(family)
    label, host = _first_host(model, path, name)
    spec = next(s.value(name) for s in host_specs(model, host) if s.value(name) is not None)
    reason = spec.read.words
    rows = [r for r in model.support().rows if r.value == name and r.host == label]
    assert rows and rows[0].status == "missing" and rows[0].why == reason, f"support() on {label}.{name}: {rows}"
    try:
        with model.trace(dict(_fixed_inputs(model))):
            getattr(host, name).save()
    except Unavailable as e:
        assert reason in str(e), str(e)
    else:
        raise AssertionError(f"{label}.{name} is marked missing, yet the trace read it")


def check_support(family: str, attn: str, experts: str | None = None, variant: str | None = None) -> None:
    """support() says available exactly for what a trace can read under this load."""
    from .errors import Unavailable

    model = build(family, attn_implementation=attn, experts=experts, variant=variant)
    inputs = _fixed_inputs(model)
    rows = model.support().rows
    assert rows
    for row in rows:
        host = resolve_term(model, row.host) if row.host != "model" else model
        if row.status == "available":
            with model.trace(dict(inputs)):
                saved = getattr(host, row.value).save()
            assert getattr(saved, "filled", True) is not False and (not isinstance(saved, torch.Tensor) or saved.numel()
                                                                     or saved.dim() > 1 or row.layout.startswith("scalar"))
        else:
            try:
                with model.trace(dict(inputs)):
                    getattr(host, row.value).save()
            except Unavailable as e:
                assert row.why in str(e)
            else:
                raise AssertionError(f"support() says {row.host}.{row.value} is unavailable, but the trace read it")


def run_example(family: str, source: str, where: str, load: str | None = None) -> None:
    """Run a note's example on the tiny config (on the image-text load when the note says so and the
    family has a second load for it)."""
    import nnatlas

    variant = "image_text" if load == "image-text-to-text" and adapter_module(family).TINY.get("image_text") else None
    model = build(family, attn_implementation="eager", variant=variant)
    namespace = {"model": model, "prompt": PROMPT, "torch": torch, "nnatlas": nnatlas}
    if model.processor is not None:  # the pages' images: a red square and a wide one
        from PIL import Image

        namespace.update(red=Image.new("RGB", (16, 16), (255, 0, 0)), wide=Image.new("RGB", (32, 16), (0, 0, 255)))
    exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the notes' examples are code to run


# ---- image-text families -------------------------------------------------------------------

def _vision_specs(model: AtlasModel) -> list[tuple[str, Any, Any]]:
    """(label, host, value spec) of every value that needs the image-text load or a call with images."""
    out = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in each_host(model, path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if (v.needs is not None and v.needs.name == "processor") or v.reached is not None:
                        out.append((label, host, v))
    return out


def check_text_only_load(family: str, variant: str | None = None) -> None:
    """Without a processor every vision value (and DeepStack's) raises Unavailable, naming the load."""
    from .errors import Unavailable

    model = build(family, processor=False, variant=variant)
    assert model.processor is None
    found = [x for x in _vision_specs(model) if x[2].needs is not None and x[2].needs.name == "processor"]
    assert found, "no value needs the image-text load"
    inputs = _fixed_inputs(model, text_only=True)
    for label, host, v in found:
        try:
            with model.trace(dict(inputs)):
                getattr(host, v.name).save()
        except Unavailable as e:
            assert "image-text-to-text" in str(e), f"{label}.{v.name}: {e}"
        else:
            raise AssertionError(f"{label}.{v.name} was served by a text-only load")
    with model.trace(dict(inputs)):  # the text values are all there
        out = model.layers[0].layer_output.save()
    assert out.shape[:2] == inputs["input_ids"].shape


def check_text_prompt(family: str, variant: str | None = None) -> None:
    """On a prompt without images, a value computed only with images raises NotReached before the
    forward (not a hang, not a wrong tensor), also when later values were asked for after it."""
    from .errors import NotReached

    model = build(family, variant=variant)
    inputs = _fixed_inputs(model, text_only=True)
    found = [x for x in _vision_specs(model) if x[2].reached is not None]
    assert found, "no value is computed only with images"
    for label, host, v in found:
        if v.needs is not None and v.needs.name != "processor":
            continue
        if v.read.kind == "derived":  # computed from the inputs: on a text prompt, nothing is an image
            with model.trace(dict(inputs)):
                derived = getattr(host, v.name).save()
            assert not bool(torch.as_tensor(derived).any()), f"{label}.{v.name} marks something on a text prompt"
            continue
        try:
            with model.trace(dict(inputs)):
                getattr(host, v.name).save()
                model.layers[-1].layer_output.save()
        except NotReached as e:
            assert "images" in str(e) and v.name in str(e), f"{label}.{v.name}: {e}"
        else:
            raise AssertionError(f"{label}.{v.name} was served on a prompt without images")


def check_image_input_errors(family: str, variant: str | None = None) -> None:
    """Raw image tensors: a missing mm_token_type_ids (where the model takes them) or an image-token
    count that does not match the images is a clear error before the forward."""
    from .errors import NnatlasError

    model = build(family, variant=variant)
    inputs = _fixed_inputs(model)
    calls = []
    handle = model.native.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        keep = torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool)
        image = inputs["input_ids"][0] == model.config.image_token_id
        keep[int(image.nonzero()[0])] = False  # one image token fewer
        fewer = {k: (v[:, keep] if k in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids") else v)
                 for k, v in inputs.items()}
        cases: list[tuple[dict[str, torch.Tensor], str]] = [(fewer, "image tokens")]
        if "mm_token_type_ids" in inputs:
            bad = dict(inputs)
            bad.pop("mm_token_type_ids")
            cases.insert(0, (bad, "mm_token_type_ids"))
        for broken, words in cases:
            try:
                with model.trace(broken):
                    model.logits.save()
            except NnatlasError as e:
                assert words in str(e), str(e)
            else:
                raise AssertionError(f"inputs without the right {words} ran")
        assert not calls, "the forward ran before the error"
    finally:
        handle.remove()
    with model.trace(dict(inputs)):
        logits = model.logits.save()
    assert logits.shape[1] == inputs["input_ids"].shape[1]


def check_processor_round_trip(family: str, tmp: Any, variant: str | None = None) -> None:
    """save_pretrained / from_pretrained in a directory: nnatlas.load(path, task="image-text-to-text")
    brings back the wrapper with its processor (no torchvision needed), and the same logits; the
    default load (text-generation) of the same directory takes text only, with the same text values."""
    import nnatlas

    model = build(family, variant=variant)
    native: Any = model.native
    native.save_pretrained(tmp)
    processor: Any = model.processor
    processor.save_pretrained(tmp)
    loaded = nnatlas.load(str(tmp), task="image-text-to-text", attn_implementation="eager")
    assert loaded.family == family and loaded.processor is not None
    inputs = _fixed_inputs(model)
    again = _fixed_inputs(loaded)
    assert all(torch.equal(inputs[k], again[k]) for k in inputs), "the loaded processor makes other inputs"
    with model.trace(dict(inputs)):
        a = model.logits.save()
    with loaded.trace(dict(again)):
        b = loaded.logits.save()
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    text_only = nnatlas.load(str(tmp), attn_implementation="eager")
    assert text_only.family == family and text_only.processor is None
    ids = _fixed_inputs(model, text_only=True)
    with model.trace(dict(ids)):
        wrapped = model.layers[-1].layer_output.save()
        wrapped_logits = model.logits.save()
    with text_only.trace(dict(ids)):
        alone = text_only.layers[-1].layer_output.save()
        alone_logits = text_only.logits.save()
    torch.testing.assert_close(alone, wrapped)
    torch.testing.assert_close(alone_logits, wrapped_logits)


# ---- the oracle: transformers' own outputs on the same tiny model ---------------------------
#
# A trace reads values inside one forward; transformers returns some of the same tensors itself
# (output_hidden_states, output_attentions, output_router_logits, the logits). The same tiny model
# and the same inputs, run once plainly and once traced, must agree: exactly in float32, for
# transformers computes the same thing on the same path either way (its output-capturing hooks
# only record). With output_hidden_states, hs[0] is the first block's input, hs[i] the output of
# block i - 1 (and the input of block i) for 1 <= i < L, and hs[L] the final norm's output
# (transformers replaces the last block's output by last_hidden_state).

ORACLE_ATOL = 0.0  # float32, the same computation: bit-identical

# Model classes whose output_hidden_states starts after the first block (measured, transformers
# 5.24): the Mamba models append the stream after each block, so hs[i] is block i's output for
# i < L and hs[L] the final norm's output; the embeddings are not in it.
HIDDEN_STATES_AFTER_BLOCKS = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM"})


def _oracle_names(model: Any) -> set[str]:
    """Value names the family serves under some load (not missing, not 'never')."""
    return {v.name for h in model.hosts for v in h.values
            if v.read.kind != "missing" and not (v.needs is not None and v.needs.never)}


def _accepts(cls: Any, flag: str) -> bool:
    import inspect

    return flag in inspect.signature(cls.forward).parameters


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
    # the flag is a parameter of the forward, or taken through **kwargs by a class that records
    # router_logits with transformers' output capturing (Glm4Moe, DeepseekV3)
    records = "router_logits" in (getattr(cls, "_can_record_outputs", None) or {})
    if "router_logits" in names and (_accepts(cls, "output_router_logits") or records):
        out.append(("router_logits", loads[0]))
    if tiny.get("processor"):
        out += [(check, loads[0]) for check in ("image_hidden_states", "image_logits")]
    return tuple(out)


def _exact(ours: Any, theirs: Any, what: str) -> None:
    assert isinstance(theirs, torch.Tensor), f"{what}: transformers returned {type(theirs).__name__}"
    assert tuple(ours.shape) == tuple(theirs.shape), f"{what}: nnatlas {tuple(ours.shape)}, transformers {tuple(theirs.shape)}"
    torch.testing.assert_close(ours, theirs, atol=ORACLE_ATOL, rtol=0, msg=lambda m: f"{what}\n{m}")


def _block_index(label: str) -> int:
    found = re.match(r"layers\[(\d+)\]", label)
    assert found, label
    return int(found.group(1))


def _blocks_with(model: AtlasModel, name: str) -> list[tuple[int, Any]]:
    """(block index, host) of every live host under layers[i] that serves ``name`` on this load, in block order."""
    found: dict[tuple[int, str], Any] = {}
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        if not path.startswith("layers[i]"):
            continue
        for label, host in each_host(model, path):
            if any(s.value(name) for s in host_specs(model, host)) and getattr(host, name).unavailable() is None:
                found[(_block_index(label), label)] = host
    return [(k[0], host) for k, host in sorted(found.items())]


def check_oracle(family: str, check: str, attn: str) -> None:
    """nnatlas's values equal what transformers returns for the same tiny model and inputs."""
    model = build(family, attn_implementation=attn)
    native: Any = model.native
    images = check.startswith("image_")
    inputs = _fixed_inputs(model, text_only=not images)
    kind = check.removeprefix("image_")
    at = f"{family} [{attn}]{' with images' if images else ''}"
    with torch.no_grad():
        if kind == "logits":
            theirs = native(**inputs).logits
            with model.trace(dict(inputs)):
                ours = model.logits.save()
            _exact(ours, theirs, f"{at}: logits, plain forward")
        elif kind == "hidden_states":
            _oracle_hidden_states(model, native, inputs, at, images)
        elif kind == "attentions":
            _oracle_attentions(model, native, inputs, at)
        elif kind == "router_logits":
            _oracle_router_logits(model, native, inputs, at)
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
    if normed is not None:
        _exact(normed, hs[n], f"{at}: final_norm_output vs hidden_states[{n}] (after the final norm)")


def _oracle_attentions(model: AtlasModel, native: Any, inputs: Mapping[str, torch.Tensor], at: str) -> None:
    hosts = _blocks_with(model, "attention_probabilities")
    assert hosts, f"{at}: no block serves attention_probabilities"
    with model.trace(dict(inputs), order="any"):
        ours = [(i, host.attention_probabilities.save()) for i, host in hosts]
    theirs = native(**inputs, output_attentions=True).attentions
    assert theirs is not None and len(theirs) == len(ours), \
        f"{at}: transformers returned {len(theirs or ())} attention patterns, nnatlas serves {len(ours)}"
    for (i, p), q in zip(ours, theirs):
        _exact(p, q, f"{at}: layers[{i}] attention_probabilities vs attentions")


# ---- attention patterns recomputed under sdpa and flex attention (runtime/patterns.py) --------

PATTERN_VALUES = ("attention_scores", "attention_probabilities")
PATTERN_ERRORS: dict[tuple[str, str], float] = {}  # (family, attention load) -> largest error seen


def recomputed_pattern_loads(family: str, variant: str | None = None) -> tuple[str, ...]:
    """The loads the tests run ``family`` under (eager aside) where its pattern, read inside eager
    attention (``call:attention > op:...``), is recomputed; empty when it is read elsewhere (or missing)."""
    from .patterns import RECOMPUTED

    fam = adapter_module(family).FAMILY
    inside = any(v.name in PATTERN_VALUES and v.read.kind == "op" and v.read.call == "attention"
                 for h in fam.hosts for v in h.values)
    return tuple(a for a in attention_loads(family, variant) if inside and a in RECOMPUTED)


def check_recomputed_patterns(family: str, attn: str, variant: str | None = None) -> float:
    """Under ``attn``, every block's attention_scores and attention_probabilities equal eager's (the same
    weights, inputs with and without padding) within 1e-6, reading them leaves the logits bit-identical
    to a trace that reads nothing, and an edit of them raises Unavailable naming eager. Returns the
    largest error."""
    from .errors import Unavailable

    eager = build(family, attn_implementation="eager", variant=variant)
    fused = build(family, attn_implementation=attn, variant=variant)
    vocab = int(eager.normalized_config["vocab_size"])
    layers: Any = fused.layers
    worst = 0.0
    for inputs in (_fixed_inputs(eager, text_only=True), draw_inputs(vocab, 1, 5, [0], seed=2)):
        # every block of the eager model gets the fused run's block input: the two attentions then see
        # the same queries and keys (upstream, sdpa and eager differ in the last bits)
        with torch.no_grad(), fused.trace(dict(inputs), order="any"):
            ours = [(i, name, getattr(host, name).save()) for name in PATTERN_VALUES
                    for i, host in _blocks_with(fused, name)]
            ins = [layers[i].layer_input.save() for i in range(len(layers))]
            logits = fused.logits.save()
        with torch.no_grad(), eager.trace(dict(inputs), order="any"):
            for i in range(len(layers)):
                eager.layers[i].layer_input = ins[i]
            theirs = [(i, name, getattr(host, name).save()) for name in PATTERN_VALUES
                      for i, host in _blocks_with(eager, name)]
        assert ours and len(ours) == len(theirs), f"{family} [{attn}]: {len(ours)} patterns served, eager {len(theirs)}"
        for (i, name, a), (_, _, b) in zip(ours, theirs, strict=True):
            what = f"{family} [{attn}]: layers[{i}] {name}, recomputed vs eager"
            assert a.shape == b.shape, f"{what}: {tuple(a.shape)} vs {tuple(b.shape)}"
            hidden = b <= torch.finfo(b.dtype).min / 2  # masked scores: finfo.min on both sides (sums of it differ)
            assert torch.equal(hidden, a <= torch.finfo(a.dtype).min / 2), f"{what}: the masks differ"
            err = float((a - b).abs().masked_fill(hidden, 0).max()) if a.numel() else 0.0
            assert err <= 1e-6, f"{what}: off by {err:.3g}"
            worst = max(worst, err)
        with torch.no_grad(), fused.trace(dict(inputs)):
            plain = fused.logits.save()
        assert torch.equal(logits, plain), f"{family} [{attn}]: reading the pattern changed the logits"
    host = _blocks_with(fused, "attention_probabilities")[0][1]
    for name in PATTERN_VALUES:
        if not any(sp.value(name) for sp in host_specs(fused, host)):
            continue
        try:
            with fused.trace(dict(inputs)):
                setattr(host, name, getattr(host, name) * 1)
        except Unavailable as e:
            assert "eager" in str(e) and attn in str(e), f"{family} [{attn}]: {e}"
        else:
            raise AssertionError(f"{family} [{attn}]: an edit of {name} under {attn} did not raise Unavailable")
    PATTERN_ERRORS[(family, attn)] = worst
    return worst


def _oracle_router_logits(model: AtlasModel, native: Any, inputs: Mapping[str, torch.Tensor], at: str) -> None:
    hosts = _blocks_with(model, "router_logits")
    assert hosts, f"{at}: no block serves router_logits"
    with model.trace(dict(inputs), order="any"):
        ours = [(i, host.router_logits.save()) for i, host in hosts]
    theirs = native(**inputs, output_router_logits=True).router_logits
    assert theirs is not None and len(theirs) == len(ours), \
        f"{at}: transformers returned {len(theirs or ())} router logits, nnatlas serves {len(ours)}"
    for (i, r), q in zip(ours, theirs):
        assert r.numel() == q.numel(), f"{at}: layers[{i}] router_logits {tuple(r.shape)} vs {tuple(q.shape)}"
        _exact(r.reshape(q.shape), q, f"{at}: layers[{i}] router_logits vs router_logits (tokens flattened)")


# ---- gradients (trace(grad=True)) ----------------------------------------------------------

GRADIENT_COUNTS: dict[str, tuple[int, int]] = {}  # family -> (values compared, values the backward reached)
GRAD_BLOCK_VALUES = ("layer_input", "layer_output", "attention_output", "mlp_output")


def _scalar(logits: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A scalar of the logits that every position and token reaches: a fixed random projection."""
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed), dtype=logits.dtype)
    return (logits * weights).sum()


def _grad_seen_as(base_grad: torch.Tensor, base: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The gradient of a tensor ``base`` read at the elements of ``value``, a view of its storage."""
    from .trace import Geometry, grad_through_base

    return grad_through_base(base_grad, Geometry(base), Geometry(value))


def _close(ours: torch.Tensor | None, theirs: torch.Tensor | None, like: torch.Tensor, what: str) -> float:
    a = torch.zeros_like(like) if ours is None else ours
    b = torch.zeros_like(like) if theirs is None else theirs
    assert a.shape == b.shape, f"{what}: gradient of shape {list(a.shape)}, expected {list(b.shape)}"
    err = float((a - b).abs().max()) if a.numel() else 0.0
    scale = float(b.abs().max()) if b.numel() else 0.0
    assert err <= 1e-5 * max(1.0, scale), f"{what}: gradient off by {err:.3g} (largest {scale:.3g})"
    return err


# Known gaps of the gradient oracle, pinned (a fix makes the test fail: then remove the entry).
GRADIENT_GAPS: dict[str, str] = {}


def check_gradients(family: str, variant: str | None = None) -> float:
    """The gradient oracle (``_check_gradients``); on a family of GRADIENT_GAPS, it must fail there."""
    gap = GRADIENT_GAPS.get(family)
    if gap is None:
        return _check_gradients(family, variant)
    import pytest

    with pytest.raises(AssertionError, match=re.escape(f"{family}: {gap}")):
        _check_gradients(family, variant)
    return float("nan")


def _check_gradients(family: str, variant: str | None = None) -> float:
    """The gradient oracle: after ``trace(grad=True)`` and a backward from the saved logits, the
    ``.grad`` of every saved value equals ``torch.autograd.grad`` of the same scalar with respect
    to the tensor whose storage holds it (the same graph; total derivative), and the block values
    equal the gradients of a separate plain forward read with plain torch forward hooks. Returns
    the largest error seen."""
    model = build(family, attn_implementation="eager", variant=variant)
    inputs = _fixed_inputs(model)
    saved: dict[str, torch.Tensor] = {}
    copies: set[str] = set()  # served as snapshots (copy: true): no tensor of the forward's graph holds them
    with model.trace(dict(inputs), order="any", grad=True):
        for handle in standard_values(model):
            spec = handle._spec
            if spec is not None and spec.layout.dtype in ("long", "bool", "object"):
                continue
            value = handle.save()
            if isinstance(value, torch.Tensor):
                saved[handle.label] = value
                if handle._spec is not None and getattr(handle._spec, "copy", False):
                    copies.add(handle.label)
        logits = model.logits.save()
    assert logits.grad_fn is not None, f"{family}: trace(grad=True) saved logits without autograd history"
    loss = _scalar(logits)
    float_saved = {k: v for k, v in saved.items() if v.requires_grad}
    assert any(k.endswith("layer_output") for k in float_saved), f"{family}: no saved layer_output requires grad"
    bases = {k: v._base if v._base is not None else v for k, v in float_saved.items()}
    loss.backward(retain_graph=True)
    with warnings.catch_warnings():  # (.grad of a non-leaf that the backward did not reach warns)
        warnings.simplefilter("ignore")
        ours = {k: v.grad for k, v in float_saved.items()}  # (torch.autograd.grad runs the hooks too: read first)
    reached = sum(g is not None for g in ours.values())
    assert reached >= len(float_saved) // 2, f"{family}: the backward reached {reached} of {len(float_saved)} values"
    theirs = torch.autograd.grad(loss, list(bases.values()), allow_unused=True)
    worst = 0.0
    for (label, v), base, g in zip(float_saved.items(), bases.values(), theirs):
        if label in copies:  # its .grad is the native tensor's: the plain forward's hooks check it below
            continue
        expected = None if g is None else _grad_seen_as(g, base, v)
        worst = max(worst, _close(ours[label], expected, v, f"{family}: {label} (autograd in the same graph)"))
    for label, v in float_saved.items():
        v.grad = ours[label]
    worst = max(worst, _plain_block_gradients(model, inputs, saved, family))
    GRADIENT_COUNTS[family] = (len(float_saved), reached)
    return worst


def _plain_block_gradients(model: AtlasModel, inputs: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
                           family: str) -> float:
    """The block values' gradients from a plain forward of the native model with plain torch hooks."""
    natives: dict[str, torch.Tensor] = {}
    handles = []
    for label, value in saved.items():
        name = label.rsplit(".", 1)[-1]
        if name not in GRAD_BLOCK_VALUES or not value.requires_grad:
            continue
        host_label = label.rsplit(".", 1)[0]
        host = next(h for lab, h in each_host(model, _path_of(host_label)) if lab == host_label)
        target = model._target(getattr(host, name))
        if target.view or target.extra or target.site[0] not in ("pre", "post"):
            continue

        def keep(mod: Any, args: Any, kwargs: Any, out: Any = None, t: Any = target, label: str = label) -> None:
            natives[label] = t.native(out if t.side == "output" else (args, kwargs))
        if target.side == "output":
            handles.append(target.module.register_forward_hook(
                lambda m, a, k, o, keep=keep: keep(m, a, k, o), with_kwargs=True))
        else:
            handles.append(target.module.register_forward_pre_hook(
                lambda m, a, k, keep=keep: keep(m, a, k), with_kwargs=True))
    try:
        out = model.native(**inputs)
    finally:
        for h in handles:
            h.remove()
    assert natives, f"{family}: no block value read by a module hook"
    grads = torch.autograd.grad(_scalar(out.logits), list(natives.values()), allow_unused=True)
    worst = 0.0
    for (label, native), g in zip(natives.items(), grads):
        worst = max(worst, _close(saved[label].grad, g, native, f"{family}: {label} (plain forward hooks)"))
    return worst


def _path_of(label: str) -> str:
    """``layers[3].self_attn`` -> ``layers[i].self_attn``: the spec path of a host label."""
    return re.sub(r"\[\d+\]", "[i]", label)
