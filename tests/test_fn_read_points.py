"""The fn: read points (module-level functions a forward calls) and route_kernels, on tiny Qwen3.5 text."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import nnatlas
from nnatlas import testing as T
from nnatlas.trace import sites

FAMILY = "qwen3_5_text"


def _kernel_globals(model: nnatlas.AtlasModel) -> dict[str, object]:
    return sites.forward_globals(model.layers[0].linear_attn._module)


def test_globals_restored_after_trace_and_after_an_exception() -> None:
    model = T.build(FAMILY)
    ns = _kernel_globals(model)
    before = {n: ns[n] for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")}
    inputs = T._fixed_inputs(model)
    with model.trace(dict(inputs)):
        model.layers[0].linear_attn.decays.save()
    assert {n: ns[n] for n in before} == before and sites.patched_functions() == []
    with pytest.raises(RuntimeError, match="boom"):
        with model.trace(dict(inputs)):
            model.layers[0].linear_attn.decays[:] = lambda x: (_ for _ in ()).throw(RuntimeError("boom"))
    # the request is an edit whose function raises inside the forward
    assert {n: ns[n] for n in before} == before and sites.patched_functions() == []
    assert sites._FN_ROUTES.get() is None and sites._FN_HOST.get() is None


def test_two_models_in_two_threads_do_not_interfere() -> None:
    a, b = T.build(FAMILY, seed=0), T.build(FAMILY, seed=1)
    inputs = T._fixed_inputs(a)
    with a.trace(dict(inputs)):
        ref_a = a.layers[1].linear_attn.attention_head_outputs.save()
    with b.trace(dict(inputs)):
        ref_b = b.layers[1].linear_attn.attention_head_outputs.save()
    results: dict[str, torch.Tensor] = {}
    barrier = threading.Barrier(2)

    def run(name: str, model: nnatlas.AtlasModel) -> None:
        barrier.wait()
        for _ in range(3):
            with model.trace(dict(inputs)):
                # zero a's queries only: b must never see a's edit
                if name == "a":
                    model.layers[1].linear_attn.attention_queries[:] = 0
                out = model.layers[1].linear_attn.attention_head_outputs.save()
            results[name] = out

    threads = [threading.Thread(target=run, args=(n, m)) for n, m in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(results["b"], ref_b)
    assert results["a"].abs().max() == 0 and ref_a.abs().max() > 0
    assert sites.patched_functions() == []


def test_route_kernels_states_and_logits() -> None:
    model = T.build(FAMILY)
    inputs = T._fixed_inputs(model)
    attn = model.layers[0].linear_attn
    with model.trace(dict(inputs)):
        chunked = model.logits.save()
    with pytest.raises(nnatlas.Unavailable, match="route_kernels"):
        with model.trace(dict(inputs)):
            attn.states.save()
    with nnatlas.route_kernels(model.family, "torch"):
        with model.trace(dict(inputs)) as tracer:
            per_token = [attn.state.save() for _ in tracer.iter[0:6]]
            states = attn.states.save()
            final = attn.state_output.save()
            routed = model.logits.save()
    assert states.shape == (*inputs["input_ids"].shape, model.heads, model.key_dim, model.value_dim)
    for t, s in enumerate(per_token):
        assert torch.equal(s, states[:, t])
    assert torch.equal(states[:, -1], final)
    torch.testing.assert_close(routed, chunked, atol=1e-5, rtol=1e-5)
    assert sites.kernel_route(model.family) is None  # nothing survives the block


def test_model_kernels_setting_and_state_edit_reaches_later_tokens() -> None:
    model = T.build(FAMILY)
    inputs = T._fixed_inputs(model)
    model.kernels = "torch"
    try:
        with model.trace(dict(inputs)) as tracer:
            base = model.logits.save()
        with model.trace(dict(inputs)) as tracer:
            for _ in tracer.iter[2:3]:
                model.layers[0].linear_attn.state[:] = 0  # forget everything after token 2
            edited = model.logits.save()
    finally:
        model.kernels = None
    # row 0 has no padding (row 1's two padding queries see every key): its tokens up to 2 read the
    # state before the edit, the later ones after it
    assert torch.equal(base[0, :3], edited[0, :3])
    assert not torch.equal(base[0, 3:], edited[0, 3:])


def test_hybrid_stack_kinds() -> None:
    model = T.build(FAMILY)
    assert model.linear_attention_layers == [0, 1, 2] and model.attention_layers == [3]
    with pytest.raises(nnatlas.Unavailable, match="linear_attention block.*self_attn exists on layers\\[3\\]"):
        _ = model.layers[0].self_attn
    with pytest.raises(nnatlas.Unavailable, match="attention block.*linear_attn exists on layers\\[0\\], layers\\[1\\]"):
        _ = model.layers[3].linear_attn.state_output
    assert "qwen3_5" in sys.modules[type(model.native).__module__].__name__


def test_state_output_edit_reaches_the_next_generation_step() -> None:
    model = T.build(FAMILY)

    def run(edit: bool) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        with model.generate("the eiffel tower is", max_new_tokens=3) as tracer:
            for step in tracer.iter[0:3]:
                if edit and step == 0:
                    model.layers[0].linear_attn.state_output[:] = 0
                if step == 1:
                    state_in = model.layers[0].linear_attn.state_input.save()
                out.append(model.logits.save())
        assert state_in.value is not None and (state_in.value.abs().max() == 0) == edit
        return out

    base, edited = run(False), run(True)
    assert torch.equal(base[0], edited[0])  # the prompt's logits do not read the state it leaves
    assert not torch.equal(base[1], edited[1])
    assert sites.patched_functions() == []


def test_an_implementation_with_other_parameter_names_is_read_the_same() -> None:
    """flash-linear-attention's kernels name their parameters q, k, v: transformers' wrapper passes
    the forward's positional arguments on positionally. A stand-in global of that shape (put back
    at the end) is read and edited like the pure-torch one."""
    import functools

    model = T.build(FAMILY)
    inputs = T._fixed_inputs(model)
    ns = _kernel_globals(model)
    torch_fn = ns["torch_chunk_gated_delta_rule"]
    calls: list[int] = []

    def fla_like(q, k, v, g=None, beta=None, initial_state=None, output_final_state=False,  # type: ignore[no-untyped-def]
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        calls.append(1)
        return torch_fn(q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state,
                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    import inspect

    applicable = tuple(inspect.signature(fla_like).parameters)

    @functools.wraps(inspect.unwrap(torch_fn))  # type: ignore[arg-type]
    def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fla_like(*args, **{n: x for n, x in kwargs.items() if n in applicable})

    with model.trace(dict(inputs)):
        ref = model.layers[0].linear_attn.attention_head_outputs.save()
    ns["torch_chunk_gated_delta_rule"] = wrapped
    try:
        with model.trace(dict(inputs)):
            q = model.layers[0].linear_attn.attention_queries.save()
            out = model.layers[0].linear_attn.attention_head_outputs.save()
        with model.trace(dict(inputs)):
            model.layers[0].linear_attn.attention_values[:] = 0
            zeroed = model.layers[0].linear_attn.attention_head_outputs.save()
    finally:
        ns["torch_chunk_gated_delta_rule"] = torch_fn
    assert calls and q.shape[-1] == model.key_dim
    assert torch.equal(out, ref) and zeroed.abs().max() == 0


def test_fn_values_are_served_without_copies() -> None:
    """Saving every DeltaNet value allocates nothing beyond the forward (state_input, the one value
    served as a copy, is None on a prompt), and a saved value is the kernel's own argument."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Allocations(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs or {}))[0]
                      if isinstance(t, torch.Tensor)}
            out = func(*args, **(kwargs or {}))
            fresh: set[int] = set()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs | fresh:
                    fresh.add(t.untyped_storage().data_ptr())
                    self.bytes += t.untyped_storage().nbytes()
            return out

    model = T.build(FAMILY)
    inputs = T._fixed_inputs(model)
    names = [v.name for v in model._family.host("layers[i].linear_attn").values if v.read.kind == "fn"]
    with torch.no_grad(), Allocations() as plain:
        model.native(**inputs)
    with Allocations() as traced, model.trace(dict(inputs), order="any"):
        for i in model.linear_attention_layers:
            for name in names:
                if getattr(model.layers[i].linear_attn, name).unavailable() is None:
                    getattr(model.layers[i].linear_attn, name).save()
    assert traced.bytes == plain.bytes
