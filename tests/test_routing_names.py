"""A trace routes transformers' attention and experts interfaces without renaming the implementation.

The router takes the place of the registry entry under the implementation's own name for the
trace's duration; no config is touched, so model code that compares ``config._attn_implementation``
or ``_experts_implementation`` takes the same branch inside a trace as outside, and the registry
after a trace is the registry before (names, order and functions).
"""

from __future__ import annotations

from types import FrameType, SimpleNamespace
from typing import Any

import pytest
import torch
from transformers.integrations.moe import ExpertsInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

import nnatlas
from nnatlas import testing as T
from nnatlas.trace import sites


def _registries() -> tuple[tuple[tuple[Any, Any], ...], ...]:
    return tuple(tuple(reg._global_mapping.items()) for reg in (AttentionInterface, AttentionMaskInterface, ExpertsInterface))


def _inputs(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return T.draw_inputs(int(model.vocab_size), 2, 6, [0, 2], seed=3)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
def test_attention_name_inside_a_trace_is_the_name_outside(impl: str) -> None:
    before = _registries()
    seen: list[tuple[str, str]] = []
    with T.uncompiled_flex_attention():
        model = T.build("llama", attn_implementation=impl)
        inputs = _inputs(model)
        with torch.no_grad():
            native = model.native(**inputs).logits
        attn = model.native.model.layers[0].self_attn

        def look(x: torch.Tensor) -> torch.Tensor:
            seen.append((attn.config._attn_implementation, AttentionInterface._global_mapping[impl].__name__))
            return x

        with torch.no_grad(), model.trace(inputs):
            model.layers[0].self_attn.attention_head_outputs = look  # type: ignore[attr-defined]
            logits = model.logits.save()
    assert seen == [(impl, "nnatlas_attention_router")]  # the name unchanged, the call routed
    assert torch.equal(logits, native)
    assert model.config._attn_implementation == impl
    assert _registries() == before  # "eager" (not registered by transformers) removed again
    assert sites.registered_names() == set()


@pytest.mark.parametrize("experts", ["eager", "batched_mm", "grouped_mm"])
def test_experts_name_inside_a_trace_is_the_name_outside(experts: str) -> None:
    before = _registries()
    model = T.build("qwen3_next", experts=experts)
    inputs = _inputs(model)
    with torch.no_grad():
        native = model.native(**inputs).logits
    module = model.native.model.layers[0].mlp.experts
    seen: list[str] = []

    def look(x: torch.Tensor) -> torch.Tensor:
        seen.append(module.config._experts_implementation)
        return x

    with torch.no_grad(), model.trace(inputs):
        mlp = model.layers[0].mlp  # type: ignore[attr-defined]
        if experts == "eager":  # (no call site to read under eager: the experts' own forward)
            mlp.routed_output = look
        else:
            mlp.expert_outputs = look
            during = mlp.routed_output.save()
        logits = model.logits.save()
    assert seen == [experts]
    assert torch.equal(logits, native)
    if experts != "eager":
        assert during.shape[:2] == inputs["input_ids"].shape
    assert module.config._experts_implementation == experts
    assert _registries() == before
    assert sites.registered_names() == set()


def test_gpt2_takes_its_eager_branch_inside_a_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt2 with reorder_and_upcast_attn runs its own upcast attention when the config names "eager"
    (``using_eager``), without calling the attention interface; a trace does not change that, so a
    read of the interface call is not reached (it was, before: the trace renamed the implementation)."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    params = {**T.first_params("gpt2"), "reorder_and_upcast_attn": True}
    model = T.build("gpt2", params)
    inputs = _inputs(model)
    calls: list[int] = []
    upcast = GPT2Attention._upcast_and_reordered_attn

    def counted(self: GPT2Attention, *args: Any, **kwargs: Any) -> Any:
        calls.append(id(self))
        return upcast(self, *args, **kwargs)

    monkeypatch.setattr(GPT2Attention, "_upcast_and_reordered_attn", counted)
    with torch.no_grad():
        model.native(**inputs)
    outside = list(calls)
    assert len(outside) == len(model.layers)
    calls.clear()
    with pytest.raises(nnatlas.NotReached, match="attention_head_outputs"), torch.no_grad(), model.trace(inputs):
        model.layers[0].self_attn.attention_head_outputs.save()  # type: ignore[attr-defined]
    assert calls == outside
    assert sites.registered_names() == set()


# ---- the router itself, on a tiny module that compares the name --------------------------------

def tiny_eager_attention_forward(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v, None


class NameComparing(torch.nn.Module):
    """Takes another branch under "sdpa" (as Gemma 4 and falcon do), then calls the interface."""

    def __init__(self, impl: str):
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation=impl)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, str]:
        branch = "sdpa" if self.config._attn_implementation == "sdpa" else "other"
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, tiny_eager_attention_forward)
        return fn(self, x, x, x, None)[0], branch


@pytest.mark.parametrize("impl", ["eager", "sdpa", "paged|sdpa"])
def test_router_serves_routed_modules_and_passes_every_other_call(impl: str) -> None:
    key = impl.removeprefix("paged|")  # what get_interface looks up
    routed, other = NameComparing(impl), NameComparing(impl)
    x = torch.randn(1, 2, 4, 3)
    want_routed, branch = routed(x)
    want_other, _ = other(x)
    before = _registries()
    originals: list[Any] = []
    names: list[tuple[str | None, str]] = []

    def handler(original: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                name: str | None, caller: FrameType) -> Any:
        originals.append(original)
        names.append((name, caller.f_code.co_name))
        out, weights = original(module, *args, **kwargs)
        return out * 2, weights

    sites.acquire("attention", impl)
    sites.acquire("attention", impl)  # a second trace shares the entry
    token = sites._ROUTES.set({("attention", id(routed)): handler})
    try:
        got_routed, got_branch = routed(x)
        got_other, _ = other(x)
        assert sites.registered_names() == {f"attention:{key}"}
    finally:
        sites._ROUTES.reset(token)
        sites.release("attention", impl)
    assert sites.registered_names() == {f"attention:{key}"}  # one user left
    sites.release("attention", impl)
    assert got_branch == branch
    # eager: the default the caller passes get_interface; sdpa: what the registry held
    assert originals == [tiny_eager_attention_forward if impl == "eager" else AttentionInterface._global_mapping[key]]
    assert names == [(key, "forward")]  # the name routed under, and the calling forward's frame
    assert torch.equal(got_routed, want_routed * 2)
    assert torch.equal(got_other, want_other)
    assert _registries() == before
    assert sites.registered_names() == set()


def test_an_unregistered_name_is_refused_inside_a_trace_as_outside() -> None:
    module = NameComparing("no_such_attention")
    x = torch.randn(1, 2, 4, 3)
    with pytest.raises(KeyError, match="no_such_attention"):
        module(x)
    before = _registries()
    sites.acquire("attention", "no_such_attention")
    try:
        assert _registries() == before  # nothing registered: no eager stands in for it
        with pytest.raises(KeyError, match="no_such_attention"):
            module(x)
    finally:
        sites.release("attention", "no_such_attention")
    assert _registries() == before
    assert sites.registered_names() == set()


def test_eager_experts_router_calls_the_class_forward() -> None:
    model = T.build("qwen3_next", experts="eager")
    experts = [m for m in model.native.modules() if type(m).__name__.endswith("Experts")]
    first, second = experts[0], experts[1]
    x = torch.randn(5, int(model.config.hidden_size))
    idx = torch.zeros(5, first.config.num_experts_per_tok, dtype=torch.long)
    weights = torch.full((5, first.config.num_experts_per_tok), 0.5)
    with torch.no_grad():
        want_first, want_second = first(x, idx, weights), second(x, idx, weights)
    before = _registries()
    originals: list[Any] = []

    def handler(original: Any, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                *_: Any) -> Any:
        originals.append(original)
        return -original(module, *args, **kwargs)

    sites.acquire("experts", "eager")
    token = sites._ROUTES.set({("experts", id(first)): handler})
    try:
        assert first.config._experts_implementation == "eager"
        with torch.no_grad():
            got_first, got_second = first(x, idx, weights), second(x, idx, weights)
    finally:
        sites._ROUTES.reset(token)
        sites.release("experts", "eager")
    assert originals == [type(first).forward.__wrapped__]
    assert torch.equal(got_first, -want_first)
    assert torch.equal(got_second, want_second)
    assert _registries() == before


def test_concurrent_traces_of_two_models_share_one_entry_and_plain_forwards_pass_through() -> None:
    """Two threads trace two sdpa models (one shared "sdpa" entry, refcounted) while a third runs
    plain forwards of a third sdpa model: each trace's edit reaches only its own model, the plain
    forwards are untouched, and the registry ends as it began."""
    import threading

    before = _registries()
    models = {"llama": T.build("llama", attn_implementation="sdpa"), "gpt2": T.build("gpt2", attn_implementation="sdpa")}
    plain = T.build("llama", attn_implementation="sdpa", seed=5)
    inputs = {name: _inputs(m) for name, m in models.items()}
    with torch.no_grad():
        want = {name: m.native(**inputs[name]).logits for name, m in models.items()}
        plain_want = plain.native(**inputs["llama"]).logits
    zeroed: dict[str, torch.Tensor] = {}
    for name, m in models.items():  # one after another: the reference
        with torch.no_grad(), m.trace(inputs[name]):
            m.layers[0].self_attn.attention_head_outputs[:] = 0  # type: ignore[attr-defined]
            zeroed[name] = m.logits.save()
        assert not torch.equal(zeroed[name], want[name])
    start = threading.Barrier(3)
    stop = threading.Event()
    errors: list[BaseException] = []
    got: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    plain_got: list[torch.Tensor] = []

    def trace(name: str) -> None:
        try:
            m = models[name]
            start.wait()
            for _ in range(5):
                with torch.no_grad(), m.trace(inputs[name]):
                    m.layers[0].self_attn.attention_head_outputs[:] = 0  # type: ignore[attr-defined]
                    got[name].append(m.logits.save())
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    def forwards() -> None:
        try:
            start.wait()
            while not stop.is_set():
                with torch.no_grad():
                    plain_got.append(plain.native(**inputs["llama"]).logits)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=trace, args=(name,)) for name in models]
    worker = threading.Thread(target=forwards)
    for t in (*threads, worker):
        t.start()
    for t in threads:
        t.join()
    stop.set()
    worker.join()
    assert not errors, errors
    for name in models:
        assert len(got[name]) == 5 and all(torch.equal(g, zeroed[name]) for g in got[name])
    assert plain_got and all(torch.equal(p, plain_want) for p in plain_got)
    assert _registries() == before
    assert sites.registered_names() == set()
