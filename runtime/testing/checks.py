"""The checks each family's generated tests run: shapes, identities, edits, read-only and missing values,
support(), the notes' examples, the image-text load."""

from __future__ import annotations

import contextlib
import functools
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import nnatlas

from ..errors import NnatlasError, NotReached, Unavailable
from ..inputs.validate import accepted_kwargs
from ..model import AtlasModel
from ..trace.patterns import RECOMPUTED
from ..tree.hosts import Value
from .flex import runs_on_cpu as flex_runs_on_cpu
from .flex import uncompiled_flex_attention
from .layouts import draw_layout
from .tiny import (
    accepted_attention,
    adapter_module,
    attention_loads,
    build,
    draw_inputs,
    draw_params,
    image_prompt_inputs,
    perturbed_params,
    shared_build,
    tiny_of,
    tiny_processor,
    variant_params,
)
from .values import (
    _blocks_with,
    assert_identity,
    dims_of,
    each_host,
    expected_shape,
    host_specs,
    resolve_term,
    tensor_term,
)


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


PROMPT = "the eiffel tower is in the city of"
PERTURB_ODDS = 8  # a drawn case is perturbed unless a draw from range(PERTURB_ODDS) is 0 (the first example's)


class Case:
    """One drawn tiny config and its inputs."""

    def __init__(self, family: str, params: dict[str, Any], inputs: dict[str, torch.Tensor], seed: int,
                 variant: str | None = None, perturbed: bool = False):
        self.family, self.params, self.inputs, self.seed, self.variant = family, params, inputs, seed, variant
        self.perturbed = perturbed
        self._repr: str | None = None

    def model(self, attn_implementation: str = "eager", experts: str | None = None) -> AtlasModel:
        return shared_build(self.family, self.params, attn_implementation, seed=self.seed, experts=experts,
                            variant=self.variant, perturbed=self.perturbed)

    def __repr__(self) -> str:  # made once: every identity's message names the case
        if self._repr is None:
            self._repr = self._describe()
        return self._repr

    def _describe(self) -> str:
        shape = tuple(self.inputs["input_ids"].shape)
        mask = self.inputs.get("attention_mask")
        if mask is None:  # (a forward that takes no attention mask: padding ids are tokens)
            mask = torch.ones_like(self.inputs["input_ids"])
        pads = (mask == 0).sum(-1).tolist()
        side = "right" if bool((mask[:, -1] == 0).any()) else "left"
        grid = self.inputs.get("image_grid_thw")
        images = f", image grids {grid.tolist()}" if grid is not None else ""
        perturbed = ", at the config's defaults"
        if self.perturbed:
            drawn = perturbed_params(self.family, self.params, self.seed, self.variant)
            factors = {k: v for k, v in drawn.items() if v != self.params.get(k)}
            perturbed = f", perturbed (nnatlas.testing.perturb: factors {factors}, constant weights drawn)"
        return (f"Case({self.family}, {self.params}, inputs {shape}, {side} padding {pads}{images}, seed {self.seed}"
                f"{perturbed})")


def draw_case(family: str, choose: Callable[[str, list[Any]], Any], data: Any, variant: str | None = None) -> Case:
    from hypothesis import strategies as st

    tiny = tiny_of(family, variant)
    params = draw_params(family, choose)
    if variant is not None:
        params = variant_params(family, params, choose, variant)
    batch = data.draw(st.integers(*tiny["batch"]), label="batch")
    seq = data.draw(st.integers(*tiny["seq"]), label="seq")
    pads = [data.draw(st.integers(0, max(seq - 1, 0)), label="pad") for _ in range(batch)]
    side = data.draw(st.sampled_from(["left", "right"]), label="padding side")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    # the first (simplest) example is the plain tiny model at the config's defaults; every other is
    # perturbed with odds 7 in 8 (factors off their defaults, constant weights drawn): the perturbed
    # draw takes the place of a default one, the examples are as many
    perturbed = data.draw(st.integers(0, PERTURB_ODDS - 1), label="perturbed") != 0
    if perturbed and variant is None:  # its structural options drawn too (nnatlas.testing.layouts)
        import transformers

        params = draw_layout(getattr(transformers, tiny["config_class"]), params,
                             lambda label, options: data.draw(st.sampled_from(options), label=label),
                             tiny.get("layouts"), family)
    images = tiny.get("images")
    if images:
        count = data.draw(st.sampled_from(list(images["count"])), label="images")
        sizes = [tuple(data.draw(st.sampled_from(list(images["sizes"])), label="size")) for _ in range(count)]
        vocab = int(params.get("text_config", {}).get("vocab_size", params.get("vocab_size", 64)))
        proc = tiny_processor(tiny["processor"], vocab)
        return Case(family, params, image_prompt_inputs(proc, seq, sizes, seed), seed, variant,  # type: ignore[arg-type]
                    perturbed)
    vocab = int(params.get("vocab_size", 64))
    return Case(family, params, draw_inputs(vocab, batch, seq, pads, seed, side), seed, perturbed=perturbed)


def served_values(model: AtlasModel, names: Callable[[Any], list[str]] | None = None) -> Iterator[tuple[str, Any, Any, Any]]:
    """(label, host spec, value spec, handle) of every value this load serves, host by host in the family's order
    (``names``: only those a host's names list); iterated inside a trace, each handle can be saved."""
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in each_host(model, path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if names is not None and v.name not in names(host):
                        continue
                    handle = getattr(host, v.name)
                    if handle.unavailable() is None:
                        yield label, spec, v, handle


def _save_all(model: AtlasModel, inputs: Mapping[str, torch.Tensor], names: Callable[[Any], list[str]] | None = None
              ) -> dict[tuple[str, str], tuple[Any, Any, Any]]:
    saved: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
    with model.trace(dict(inputs), order="any"):
        for label, spec, v, handle in served_values(model, names):
            saved[(label, v.name)] = (v, handle.save(), spec)
    return saved


def _routable(model: AtlasModel) -> bool:
    return any(g.route for g in model._family.functions.values())


def check_shapes(case: Case, experts: str | None = None) -> None:
    """Every value this load serves has its layout's shape (a host's ``dims`` resize its layouts);
    families with a routable kernel are checked a second time under ``route_kernels(family, "torch")``,
    where the per-token values exist. ``experts``: the experts implementation of a mixture."""
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
    for term in terms:
        if term in config or tensor_term(host, term, model, block) is not None:
            continue
        handle = resolve_term(host, term, model, block)
        why = handle.unavailable() if isinstance(handle, Value) else None
        if why is not None:
            return term, why
    return None


def check_identity(case: Case, path: str, index: int, experts: str | None = None, replace: Any = None) -> None:
    """The spec's ``index``-th identity at ``path`` holds on every host of the drawn case that has it.
    ``replace``: an identity (``nnatlas.spec.Identity``) checked instead, on the same hosts: a
    mutation test's changed identity."""
    check_identities(case, path, (index,), experts, replace)


def _where(identity: Any, label: str, case: Case) -> str:
    """An identity check's place in its failure message (made only on failure: a case's repr draws its factors)."""
    return f"{identity.at + ': ' if identity.at else ''}{label} ({case!r})"


def identity_ids(groups: Any) -> list[str]:
    """The test ids of identity groups, ``(path, indices[, experts])``: ``layers[i]-0-1-2`` (``-grouped_mm``)."""
    return ["-".join([g[0], *map(str, g[1]), *map(str, g[2:])]) for g in groups]


def check_identities(case: Case, path: str, indices: tuple[int, ...], experts: str | None = None,
                     replace: Any = None) -> None:
    """Each of the identities ``indices`` at ``path`` (one block kind's: the generated tests group them so)
    holds on every host of the drawn case that has it: every host's terms read in one forward, every failure
    reported at once. A case none of them applies to (a block kind this drawn config lacks) is drawn again."""
    model = case.model("eager", experts)
    config = model.normalized_config
    checked = 0
    spec_ids = [i for s in model._family.hosts if s.path == path for i in s.identities]
    reads: list[tuple[str, Any, int | None, Any, dict[str, Any]]] = []
    for label, host in list(each_host(model, path)):
        identities = [i for s in host_specs(model, host) for i in s.identities]
        found = re.search(r"\[(\d+)\]", label)
        block = int(found.group(1)) if found else None
        for index in indices:
            if index >= len(spec_ids) or spec_ids[index] not in identities:
                continue
            identity = spec_ids[index] if replace is None else replace
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
            for term in identity.terms:  # a parameter or buffer the identity names: read outside the trace
                tensor = tensor_term(host, term, model, block) if term not in config else None
                if tensor is not None:
                    values[term] = tensor
            reads.append((label, host, block, identity, values))
    if reads:  # every host's terms in one forward (a forward per host and identity was most of these tests' time)
        with model.trace(dict(case.inputs), order="any"):
            for _, host, block, identity, values in reads:
                for term in identity.terms:
                    if term in values:
                        continue
                    if term in config:
                        values[term] = config[term]
                    else:
                        values[term] = resolve_term(host, term, model, block).save()
    failures = []
    for label, _, _, identity, values in reads:
        values.setdefault("attention_mask", case.inputs.get("attention_mask"))
        lhs, rhs = identity.check(values)
        try:
            assert_identity(identity, lhs, rhs, functools.partial(_where, identity, label, case))
        except AssertionError as e:
            failures.append(str(e))
        checked += 1
    if failures:
        raise AssertionError(f"{len(failures)} of {len(reads)} identity checks failed:\n\n" + "\n\n".join(failures))
    from hypothesis import assume

    if not checked:
        assume(False)  # a block kind this drawn config lacks: draw another (none at all fails the test)


def _first_host(model: AtlasModel, path: str, name: str | None = None, missing: bool | None = None
                ) -> tuple[str, Any]:
    """The first live host at ``path`` (with value ``name``; read, or marked missing, as ``missing`` asks:
    one value may be read on some block kinds of a path and missing on others)."""
    for label, host in each_host(model, path):
        values = [v for s in host_specs(model, host) if (v := s.value(name or "")) is not None]
        if name is None or any(missing is None or (v.read.kind == "missing") == missing for v in values):
            return label, host
    raise AssertionError(f"no live host at {path}" + (f" with {name}" if name else ""))


def check_native_class(family: str, path: str, variant: str | None = None) -> None:
    model = shared_build(family, variant=variant, perturbed=True)
    found = list(each_host(model, path))
    assert found, f"{path}: no native module found (check rename)"
    for label, host in found:
        kinds = host_specs(model, host)
        if not kinds:
            continue
        names = {type(host._module).__name__}
        # the class of the kinds that apply to this block (a path may hold one class per block kind)
        assert any(s.cls in names for s in kinds), f"{label}: native class {names}, spec says {[s.cls for s in kinds]}"


FIXED_SIZES = [(16, 16), (24, 16)]


def _fixed_inputs(model: AtlasModel, text_only: bool = False) -> dict[str, torch.Tensor]:
    """Three sequences of token ids, one unpadded, one padded on the left, one on the right (both sides in one
    batch: the mask says which positions are real; three unpadded, without a mask, where the forward takes none), or
    (a family with images) one prompt with two images of different grids."""
    if model.processor is not None and not text_only:
        return image_prompt_inputs(model.processor, 5, FIXED_SIZES, seed=1)
    vocab = int(model.normalized_config["vocab_size"])
    accepted = accepted_kwargs(model.native)
    if accepted is not None and "attention_mask" not in accepted:  # a forward that takes no mask (xLSTM): no padding
        return {"input_ids": draw_inputs(vocab, 3, 6, [0, 0, 0], seed=1)["input_ids"]}
    left, right = draw_inputs(vocab, 2, 6, [0, 2], seed=1), draw_inputs(vocab, 1, 6, [2], seed=2, side="right")
    return {k: torch.cat([left[k], right[k]]) for k in left}


def check_edit(family: str, path: str, name: str, experts: str | None = None, variant: str | None = None) -> None:
    """Writing a value back unchanged leaves logits bit-identical; zeroing it changes them (under
    ``route_kernels`` for a value that needs it; under ``experts``, the experts implementation)."""
    import contextlib

    model = shared_build(family, attn_implementation="eager", experts=experts, variant=variant, perturbed=True)
    spec = next(v for h in model._family.hosts if h.path == path for v in h.values if v.name == name)
    routed = spec.needs is not None and spec.needs.name == "torch_kernels"
    weights = {k: v.clone() for k, v in model.native.state_dict().items()}
    with nnatlas.route_kernels(family, "torch") if routed else contextlib.nullcontext():
        _check_edit(model, path, name, routed)
    # an edit changes its forward, never the model (a value that is a weight, an op's operand, included)
    changed = [k for k, v in model.native.state_dict().items() if not torch.equal(v, weights[k])]
    assert not changed, f"editing {path}.{name} changed the model's own tensors: {', '.join(changed)}"


def _check_edit(model: AtlasModel, path: str, name: str, routed: bool = False) -> None:
    inputs = _fixed_inputs(model)
    label, host = _first_host(model, path, name, missing=False)
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
    base = _plain_logits(model, inputs, routed)
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


_PLAIN: weakref.WeakKeyDictionary[AtlasModel, dict[tuple[Any, ...], torch.Tensor]] = weakref.WeakKeyDictionary()


def _plain_logits(model: AtlasModel, inputs: Mapping[str, torch.Tensor], routed: bool) -> torch.Tensor:
    """The logits of a trace with no edit, once per model, inputs and kernel routing (``routed``: inside
    route_kernels): every edit check of a family compares with them on its shared model, which no edit
    changes (check_edit asserts it)."""
    key = (routed, *((k, tuple(v.shape), v.numpy().tobytes()) for k, v in sorted(inputs.items())))
    memo = _PLAIN.setdefault(model, {})
    if key not in memo:
        with model.trace(dict(inputs)):
            memo[key] = model.logits.save()
    return memo[key]


def check_readonly(family: str, path: str, name: str, variant: str | None = None) -> None:
    model = shared_build(family, variant=variant, perturbed=True)
    _, host = _first_host(model, path, name, missing=False)
    try:
        with model.trace(dict(_fixed_inputs(model))):
            setattr(host, name, 0)
    except NnatlasError as e:
        assert "read-only" in str(e)
    else:
        raise AssertionError(f"{path}.{name} is derived, yet assigning it raised nothing")


def check_missing(family: str, path: str, name: str) -> None:
    """A value the family marks missing: support() and a trace both say why."""
    model = shared_build(family, perturbed=True)
    label, host = _first_host(model, path, name, missing=True)
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
    model = shared_build(family, attn_implementation=attn, experts=experts, variant=variant, perturbed=True)
    inputs = _fixed_inputs(model)
    rows = model.support().rows
    assert rows
    hosts = {row.host: resolve_term(model, row.host) if row.host != "model" else model for row in rows}
    available = [row for row in rows if row.status == "available"]
    try:  # every value support() calls available, read by one trace (a trace per value was most of this check)
        with model.trace(dict(inputs), order="any"):
            saved = [(row, getattr(hosts[row.host], row.value).save()) for row in available]
    except Exception:  # which value: each read alone says
        for row in available:
            with model.trace(dict(inputs)):
                getattr(hosts[row.host], row.value).save()
        raise
    for row, value in saved:
        assert getattr(value, "filled", True) is not False and (not isinstance(value, torch.Tensor) or value.numel()
                                                                or value.dim() > 1 or row.layout.startswith("scalar")), \
            f"support() says {row.host}.{row.value} is available, but the trace served {value!r}"
    for row in rows:
        if row.status == "available":
            continue
        try:
            with model.trace(dict(inputs)):
                getattr(hosts[row.host], row.value).save()
        except Unavailable as e:
            assert row.why in str(e)
        else:
            raise AssertionError(f"support() says {row.host}.{row.value} is unavailable, but the trace read it")


def run_example(family: str, source: str, where: str, load: str | None = None) -> None:
    """Run a note's example on the tiny config (on the image-text load when the note says so and the
    family has a second load for it)."""
    variant = "image_text" if load == "image-text-to-text" and adapter_module(family).TINY.get("image_text") else None
    model = build(family, attn_implementation="eager", variant=variant, perturbed=True)
    namespace = {"model": model, "prompt": PROMPT, "torch": torch, "nnatlas": nnatlas}
    if model.processor is not None:  # the pages' images: a red square and a wide one
        from PIL import Image

        namespace.update(red=Image.new("RGB", (16, 16), (255, 0, 0)), wide=Image.new("RGB", (32, 16), (0, 0, 255)))
    exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the notes' examples are code to run


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
    model = shared_build(family, processor=False, variant=variant, perturbed=True)
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
    model = shared_build(family, variant=variant, perturbed=True)
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
    model = shared_build(family, variant=variant, perturbed=True)
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
    model = shared_build(family, variant=variant, perturbed=True)
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


ORACLE_ATOL = 0.0  # float32, the same computation: bit-identical


# Model classes whose output_hidden_states starts after the first block (measured, transformers
# 5.24): the Mamba models and RWKV append the stream after each block, so hs[i] is block i's output for
# i < L and hs[L] the final norm's output; the embeddings are not in it.
HIDDEN_STATES_AFTER_BLOCKS = frozenset({"MambaForCausalLM", "FalconMambaForCausalLM", "Mamba2ForCausalLM",
                                        "RwkvForCausalLM"})


PATTERN_VALUES = ("attention_scores", "attention_probabilities")


PATTERN_ERRORS: dict[tuple[str, str], float] = {}  # (family, attention load) -> largest error seen


def recomputed_pattern_loads(family: str, variant: str | None = None) -> tuple[str, ...]:
    """The loads the tests run ``family`` under (eager aside) where its pattern is recomputed: sdpa and
    flex attention for a pattern read inside eager attention (``call:attention > op:...``), sdpa for one
    read at eager's softmax in the forward with ``recompute: sdpa``; empty when it is read elsewhere."""
    fam = adapter_module(family).FAMILY
    reads = [v.read for h in fam.hosts for v in h.values if v.name in PATTERN_VALUES and v.read.kind == "op"]
    if any(r.call == "attention" for r in reads):
        # flex attention too where the class accepts it and transformers runs it on CPU (uncompiled: testing/flex.py)
        flex = ("flex_attention",) if "flex_attention" in accepted_attention(family, variant) \
            and flex_runs_on_cpu(family, fam.traits) else ()
        return tuple(a for a in attention_loads(family, variant) if a in RECOMPUTED) + flex
    # at eager's softmax in the forward, recomputed from the forward's own sdpa call (recompute: sdpa)
    marked = {r.recompute for r in reads if r.recompute}
    return tuple(a for a in attention_loads(family, variant) if a in marked)


def check_recomputed_patterns(family: str, attn: str, variant: str | None = None) -> float:
    """Under ``attn``, every block's attention_scores and attention_probabilities equal eager's (the same
    weights, inputs with and without padding) within 1e-6, reading them leaves the logits bit-identical
    to a trace that reads nothing, and an edit of them raises Unavailable naming eager. Returns the
    largest error. Flex attention runs uncompiled (:func:`uncompiled_flex_attention`)."""
    with uncompiled_flex_attention() if attn == "flex_attention" else contextlib.nullcontext():
        return _check_recomputed_patterns(family, attn, variant)


def _check_recomputed_patterns(family: str, attn: str, variant: str | None) -> float:
    eager = shared_build(family, attn_implementation="eager", variant=variant, perturbed=True)
    fused = shared_build(family, attn_implementation=attn, variant=variant, perturbed=True)
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


GRADIENT_COUNTS: dict[str, tuple[int, int]] = {}  # family -> (values compared, values the backward reached)


GRAD_BLOCK_VALUES = ("layer_input", "layer_output", "attention_output", "mlp_output")


# Known gaps of the gradient oracle, pinned (a fix makes the test fail: then remove the entry).
GRADIENT_GAPS: dict[str, str] = {}
