"""Tiny random models and inputs: configs drawn from a family's ``tiny`` ranges, random weights, a
word-level tokenizer and a processor made in memory, so nothing is downloaded."""

from __future__ import annotations

import importlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch

from ..inputs.processing import image_processor_class, images_only, vision_marks
from ..loading.load import wrap
from ..model import AtlasModel
from ..registry import all_families
from .perturb import config_factors, perturb_params, perturb_tensors

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


SHARED_MODELS = 8  # the shared builds kept (the newest): a test module's cases and its fixed model


_shared: OrderedDict[str, AtlasModel] = OrderedDict()


def shared_build(family: str, params: Mapping[str, Any] | None = None, attn_implementation: str = "eager",
                 seed: int = 0, experts: str | None = None, processor: bool = True, variant: str | None = None,
                 perturbed: bool = False) -> AtlasModel:
    """:func:`build`, once per distinct set of arguments among the last :data:`SHARED_MODELS`: the
    generated checks trace the same tiny model again and again (every identity over the same drawn cases,
    every edit on the family's fixed model), and a trace leaves its model as it found it (no hook, no
    patched global: tests/test_hooks.py). Never for code that changes a model (a note's example, a
    gradient's backward into the parameters, PEFT): those build their own."""
    # (the adapter the registry holds now is part of the key: a test may put a changed one in its place)
    adapter = id(all_families().get(family))
    key = json.dumps([family, adapter, params, attn_implementation, seed, experts, processor, variant, perturbed],
                     sort_keys=True, default=repr)
    model = _shared.get(key)
    if model is None:
        model = build(family, params, attn_implementation, seed, experts=experts, processor=processor,
                      variant=variant, perturbed=perturbed)
        _shared[key] = model
        while len(_shared) > SHARED_MODELS:
            _shared.popitem(last=False)
    else:
        _shared.move_to_end(key)
    return model


def build(family: str, params: Mapping[str, Any] | None = None, attn_implementation: str = "eager",
          seed: int = 0, dtype: torch.dtype = torch.float32, experts: str | None = None, processor: bool = True,
          variant: str | None = None, perturbed: bool = False) -> AtlasModel:
    """A tiny random model of ``family``, wrapped, with an in-memory tokenizer (and, for a family
    whose ``tiny.processor`` says how, a local processor; ``processor=False`` is the text-only load).
    ``variant="image_text"``: the family's multimodal wrapper load (``tiny.image_text``).
    ``experts``: the experts implementation (``set_experts_implementation``) of a mixture of experts.
    ``perturbed``: the config's scalar factors drawn away from their defaults and every constant
    parameter or buffer drawn at random (:mod:`nnatlas.testing.perturb`), from ``seed``. The generated
    tests and the oracle ask for it; the default (False) is the plain tiny model at the config's
    defaults, which hand-written tests and the bench build as a fixed fixture."""
    import transformers

    tiny = tiny_of(family, variant)
    if params is None:
        params = first_variant_params(family, variant) if variant else first_params(family)
    params = _nested_copy(dict(params))
    if perturbed:
        params = perturbed_params(family, params, seed, variant)
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
    if perturbed:
        perturb_tensors(hf, seed)
    if experts is not None:
        hf.set_experts_implementation(experts)
    vocab = int(getattr(config.get_text_config(), "vocab_size", 64))
    spec = tiny.get("processor")
    # wrapped as ``family``, not as whatever its model type picks: a user's family that extends a shipped one
    # (same model type) is tested as itself (its tree is its spec's: no check)
    if spec:
        proc = tiny_processor(spec, vocab)
        if processor:
            return wrap(hf, processor=proc, family=family, check=False)
        return wrap(hf, tokenizer=proc.tokenizer, family=family, check=False)
    return wrap(hf, tokenizer=tiny_tokenizer(vocab), family=family, check=False)


def perturbed_params(family: str, params: Mapping[str, Any], seed: int, variant: str | None = None
                     ) -> dict[str, Any]:
    """``params`` with every scalar factor of the config drawn away from its value (the family's
    ``tiny.factors`` narrow or pin some): of the config itself, of a wrapper's text_config, and of its
    vision_config (today's vision configs carry none by the rule; their tensors are redrawn with the rest)."""
    import transformers

    tiny = tiny_of(family, variant)
    rules = dict(adapter_module(family).TINY.get("factors") or {})
    out = _nested_copy(dict(params))
    config = getattr(transformers, tiny["config_class"])(**_nested_copy(out))
    found = config_factors(config)
    vision = getattr(config, "vision_config", None)
    unknown = sorted(set(rules) - set(found) - set(config_factors(config.get_text_config()))
                     - set(config_factors(vision) if vision is not None else ()))
    if unknown:
        raise ValueError(f"{family}: tiny.factors names {', '.join(unknown)}, which is no scalar factor of "
                         f"{type(config).__name__} (its factors: {', '.join(sorted(found)) or 'none'})")
    return perturb_params(config, out, seed, rules)


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
    accepted = accepted_attention(family, variant)
    return tuple(a for a in CPU_ATTENTION if a in accepted)


def accepted_attention(family: str, variant: str | None = None) -> tuple[str, ...]:
    """The attention implementations ``family``'s tiny class accepts: those the spec declares
    (``loads.attention``) or, when it declares none, those the class's flags say."""
    import transformers

    declared = adapter_module(family).FAMILY.attention
    if declared is not None:
        return tuple(declared)
    return _class_attention(getattr(transformers, tiny_of(family, variant)["model_class"]))


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
    start, end = vision_marks(processor)
    text = "".join(f"{start}{processor.image_token}{end}" for _ in sizes) + " " + " ".join(WORDS[i] for i in picks)
    out = processor(text=text, images=tiny_images(sizes, seed), return_tensors="pt")
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def draw_inputs(vocab_size: int, batch: int, seq: int, pads: list[int], seed: int = 0,
                side: str = "left") -> dict[str, torch.Tensor]:
    """Token ids and a padding mask: row ``b`` has ``pads[b]`` padding positions (id 0), first (``side="left"``,
    as a batch for generation is padded) or last (``"right"``, as a tokenizer pads by default); every row keeps
    at least one real token."""
    if side not in ("left", "right"):
        raise ValueError(f"side: 'left' or 'right', not {side!r}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, max(vocab_size, 5), (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b, p in enumerate(pads):
        n = min(p, seq - 1)
        cut = slice(0, n) if side == "left" else slice(seq - n, seq)
        mask[b, cut] = 0
        ids[b, cut] = 0
    return {"input_ids": ids, "attention_mask": mask}


def tiny_processor(spec: dict[str, Any], vocab_size: int) -> Any:
    """The processor a family's ``tiny.processor`` describes, over the in-memory tiny tokenizer."""
    import transformers

    tok = tiny_tokenizer(vocab_size, extra_specials=tuple(spec["tokens"]), names=dict(spec.get("token_names", {})))
    ip_cls = image_processor_class(spec["image_processor"])
    image_processor = ip_cls(**dict(spec["image_processor_config"]))
    cls = getattr(transformers, spec["class"])
    return images_only(cls)(image_processor=image_processor, tokenizer=tok, **dict(spec.get("config", {})))
