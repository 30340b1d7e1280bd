"""Tiny random models and inputs for the generated tests, the notes' examples and the benchmarks.

Everything is built locally: configs drawn from a family's ``tiny`` ranges, random weights,
and a word-level tokenizer made in memory, so nothing is downloaded.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import torch

from .model import AtlasModel, wrap

# Tiny models gain nothing from threads, and a batched LAPACK call (the delta rule's
# solve_triangular) runs ~400x slower with two threads on a loaded two-core machine.
torch.set_num_threads(1)

WORDS = ("the eiffel tower is in city of paris france a an and to on at with from by for as it this that "
         "was were be been being have has had do does did not no yes one two three four five six seven "
         "eight nine ten red blue green big small old new first last next good bad hot cold up down").split()


def tiny_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``vocab_size`` ids (unknown words map to [UNK]), built in memory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    words = (specials + WORDS)[:vocab_size]
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]",
                                   eos_token="[EOS]")
    # a minimal chat template (the turns' text, then a generation prompt), so the notes' templated
    # examples run; it stands for a checkpoint's template, whose text the notes describe
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}{{ 'yes' if enable_thinking is defined and enable_thinking "
                          "else 'no' }}{% endif %}")
    return fast


def adapter_module(family: str) -> ModuleType:
    return importlib.import_module(f"nnatlas.families.{family}")


def draw_params(family: str, choose: Callable[[str, list[Any]], Any]) -> dict[str, Any]:
    """Config parameters for a tiny model; ``choose(name, options)`` picks each drawn entry."""
    tiny = adapter_module(family).TINY
    params: dict[str, Any] = dict(tiny["config"])
    scope: dict[str, Any] = dict(params)
    for name, options, compute in tiny["draw"]:
        value = choose(name, list(options)) if options is not None else compute(scope)
        scope[name] = value
        if not name.startswith("_"):
            params[name] = value
    return params


def first_params(family: str) -> dict[str, Any]:
    """The smallest-index choice of every drawn entry, with a few blocks: a fixed tiny config."""
    def choose(name: str, options: list[Any]) -> Any:
        return options[-1] if name in ("num_hidden_layers", "n_layer") else options[0]
    return draw_params(family, choose)


def build(family: str, params: Mapping[str, Any] | None = None, attn_implementation: str = "eager",
          seed: int = 0, dtype: torch.dtype = torch.float32, experts: str | None = None) -> AtlasModel:
    """A tiny random model of ``family``, wrapped, with an in-memory tokenizer.

    ``experts``: the experts implementation (``set_experts_implementation``) of a mixture of experts.
    """
    import transformers

    tiny = adapter_module(family).TINY
    params = dict(params if params is not None else first_params(family))
    config = getattr(transformers, tiny["config_class"])(**params)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    hf = getattr(transformers, tiny["model_class"])(config).to(dtype).eval()
    if experts is not None:
        hf.set_experts_implementation(experts)
    vocab = int(getattr(config.get_text_config(), "vocab_size", 64))
    return wrap(hf, tokenizer=tiny_tokenizer(vocab))


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
    if path == "model":
        yield "model", model
        return
    head, _, rest = path.partition("[i]")
    node: Any = model
    for part in head.split("."):
        node = getattr(node, part)
    if "[i]" not in path:
        yield path, node
        return
    for i in range(len(node)):
        host = node[i]
        ok = True
        for part in [p for p in rest.split(".") if p]:
            child = host._child(part)
            if child is None:
                ok = False
                break
            host = child
        if ok:
            yield path.replace("[i]", f"[{i}]"), host


def resolve_term(host: Any, term: str) -> Any:
    """``self_attn.attention_output`` / ``layers[0].layer_input`` / ``o_proj.input`` from a host."""
    node = host
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

    def __init__(self, family: str, params: dict[str, Any], inputs: dict[str, torch.Tensor], seed: int):
        self.family, self.params, self.inputs, self.seed = family, params, inputs, seed

    def model(self, attn_implementation: str = "eager", experts: str | None = None) -> AtlasModel:
        return build(self.family, self.params, attn_implementation, seed=self.seed, experts=experts)

    def __repr__(self) -> str:
        shape = tuple(self.inputs["input_ids"].shape)
        pads = (self.inputs["attention_mask"] == 0).sum(-1).tolist()
        return f"Case({self.family}, {self.params}, inputs {shape}, left padding {pads}, seed {self.seed})"


def draw_case(family: str, choose: Callable[[str, list[Any]], Any], data: Any) -> Case:
    from hypothesis import strategies as st

    tiny = adapter_module(family).TINY
    params = draw_params(family, choose)
    batch = data.draw(st.integers(*tiny["batch"]), label="batch")
    seq = data.draw(st.integers(*tiny["seq"]), label="seq")
    pads = [data.draw(st.integers(0, max(seq - 1, 0)), label="pad") for _ in range(batch)]
    seed = data.draw(st.integers(0, 2**16), label="seed")
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
        assert tuple(value.shape) == want, f"{label}.{name}: shape {tuple(value.shape)}, layout {spec.layout.text} = {want}"


def _unavailable_term(host: Any, terms: tuple[str, ...], config: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The first term of an identity this load cannot serve, and why (the value says which load it needs)."""
    from .envoy import Value

    for term in terms:
        if term in config:
            continue
        handle = resolve_term(host, term)
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
        missing = _unavailable_term(host, identity.terms, config)
        if missing is not None:
            # this load cannot serve a term: reading it must say so, naming the load that serves it
            term, why = missing
            try:
                with model.trace(dict(case.inputs)):
                    resolve_term(host, term).save()
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
                    values[term] = resolve_term(host, term).save()
        values.setdefault("attention_mask", case.inputs["attention_mask"])
        lhs, rhs = identity.check(values)
        assert_identity(identity, lhs, rhs, f"{label} ({case!r})")
        checked += 1
    from hypothesis import assume

    assume(checked > 0)  # a block kind this drawn config lacks: draw another (none at all fails the test)


def _first_host(model: AtlasModel, path: str, name: str | None = None) -> tuple[str, Any]:
    for label, host in each_host(model, path):
        if name is None or any(s.value(name) for s in host_specs(model, host)):
            return label, host
    raise AssertionError(f"no live host at {path}" + (f" with {name}" if name else ""))


def check_native_class(family: str, path: str) -> None:
    model = build(family)
    specs = [h for h in model._family.hosts if h.path == path]
    found = list(each_host(model, path))
    assert found, f"{path}: no native module found (check rename)"
    for label, host in found:
        kinds = host_specs(model, host)
        if not kinds:
            continue
        names = {type(host._module).__name__}
        assert any(s.cls in names for s in specs), f"{label}: native class {names}, spec says {[s.cls for s in specs]}"


def _fixed_inputs(model: AtlasModel) -> dict[str, torch.Tensor]:
    vocab = int(model.normalized_config["vocab_size"])
    return draw_inputs(vocab, 2, 6, [0, 2], seed=1)


def check_edit(family: str, path: str, name: str, experts: str | None = None) -> None:
    """Writing a value back unchanged leaves logits bit-identical; zeroing it changes them (under
    ``route_kernels`` for a value that needs it; under ``experts``, the experts implementation)."""
    import contextlib

    import nnatlas

    model = build(family, attn_implementation="eager", experts=experts)
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


def check_readonly(family: str, path: str, name: str) -> None:
    from .errors import NnatlasError

    model = build(family)
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


def check_support(family: str, attn: str, experts: str | None = None) -> None:
    """support() says available exactly for what a trace can read under this load."""
    from .errors import Unavailable

    model = build(family, attn_implementation=attn, experts=experts)
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


def run_example(family: str, source: str, where: str) -> None:
    import nnatlas

    model = build(family, attn_implementation="eager")
    namespace = {"model": model, "prompt": PROMPT, "torch": torch, "nnatlas": nnatlas}
    exec(compile(source, where, "exec"), namespace)  # noqa: S102 - the notes' examples are code to run
