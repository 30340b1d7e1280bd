"""op: read points through swapped torch callables (the fast path) count exactly what a
TorchFunctionMode (the reference, ``op_scopes.FORCE_OP_MODE``) counts, serve the same tensors, and
leave no swapped callable or op scope behind, also when the forward raises or traces run in
threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import nnatlas
from nnatlas import testing as T
from nnatlas.trace import op_scopes

FAMILIES = ("gpt2", "llama", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "qwen3_vl")
# the torch callables a spec'd op name reaches, as they are outside a trace
ORIGINALS = {(holder, attr): holder.__dict__.get(attr) for name in
             ("softmax", "dropout", "linear", "view", "mul", "add", "unsqueeze", "cat", "masked_scatter")
             for holder, attr in op_scopes._op_targets(name)}


def assert_nothing_swapped() -> None:
    assert op_scopes.patched_ops() == []
    assert op_scopes._OP_SCOPES.get() == ()
    for (holder, attr), fn in ORIGINALS.items():
        assert holder.__dict__.get(attr) is fn, f"{holder}.{attr}"
    assert torch._C._len_torch_function_stack() == 0


@contextmanager
def force_mode(on: bool) -> Iterator[None]:
    before = op_scopes.FORCE_OP_MODE
    op_scopes.FORCE_OP_MODE = on
    try:
        yield
    finally:
        op_scopes.FORCE_OP_MODE = before


def _loads(family: str) -> list[tuple[nnatlas.AtlasModel, dict[str, torch.Tensor]]]:
    loads = []
    for attn in ("eager", "sdpa"):
        model = T.build(family, attn_implementation=attn)
        proc = model._processor
        if proc is not None and getattr(proc, "image_processor", None) is not None:
            inputs = T.image_prompt_inputs(proc, 5, [(32, 32)])
        else:
            inputs = T.draw_inputs(int(model.normalized_config["vocab_size"]), 2, 6, [0, 2], seed=3)
        loads.append((model, inputs))
    return loads


def _op_values(model: nnatlas.AtlasModel, inputs: dict[str, torch.Tensor], mode: bool) -> dict[str, torch.Tensor]:
    handles = [h for h in T.standard_values(model) if h._read.kind == "op"]
    with force_mode(mode), model.trace(inputs, order="any"):
        saved = {h.label: h.save() for h in handles}
    return {k: v.detach().clone() for k, v in saved.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_spec_op_read_serves_what_the_mode_serves(family: str) -> None:
    checked = 0
    for model, inputs in _loads(family):
        fast = _op_values(model, inputs, mode=False)
        assert_nothing_swapped()
        reference = _op_values(model, inputs, mode=True)
        assert_nothing_swapped()
        assert fast.keys() == reference.keys()
        for label, value in fast.items():
            assert torch.equal(value, reference[label]), label
        checked += len(fast)
    assert checked > 0, f"{family}: no op value read"


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_an_op_edit_reaches_the_logits_as_under_the_mode(family: str) -> None:
    model, inputs = _loads(family)[0]
    handle = next(h for h in T.standard_values(model) if h._read.kind == "op")
    results = []
    for mode in (False, True):
        with force_mode(mode), model.trace(inputs, order="any"):
            handle[:] = 0
            logits = model.logits.save()
        results.append(logits.detach().clone())
    with model.trace(inputs):
        plain = model.logits.save()
    assert torch.equal(results[0], results[1])
    assert not torch.equal(results[0], plain)
    assert_nothing_swapped()


def test_the_saved_op_value_is_the_forwards_own_tensor() -> None:
    """Zero copy: what softmax's input[0] saves shares its storage with what the forward computed."""
    model, inputs = _loads("llama")[0]
    attn = model.layers[0].self_attn
    seen: list[torch.Tensor] = []
    original = torch.Tensor.softmax
    assert "softmax" not in torch.Tensor.__dict__  # inherited from TensorBase

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(self)
        return original(self, *args, **kwargs)

    torch.Tensor.softmax = spy  # type: ignore[method-assign]
    try:
        with model.trace(inputs):
            scores = attn.attention_scores.save()
    finally:
        del torch.Tensor.softmax
    assert seen and scores.untyped_storage().data_ptr() == seen[0].untyped_storage().data_ptr()


def test_nothing_swapped_after_a_trace_or_an_exception() -> None:
    model, inputs = _loads("qwen3_next")[0]
    moe = model.layers[0].mlp
    with model.trace(inputs):
        moe.router_logits.save()
        moe.shared_expert_output.save()
    assert_nothing_swapped()

    def boom(v: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("in the forward")

    with pytest.raises(RuntimeError, match="in the forward"):
        with model.trace(inputs):
            moe.router_logits.save()
            moe.shared_expert_output = boom  # raises inside the host's own forward, in its op scope
    assert_nothing_swapped()
    with pytest.raises(ValueError, match="in the body"):
        with model.trace(inputs):
            moe.shared_expert_output.save()
            raise ValueError("in the body")
    assert_nothing_swapped()
    with model.trace(inputs):  # and it still traces
        moe.shared_expert_output.save()
    assert_nothing_swapped()


# ---- the counting rule, on functions written to probe it ------------------------------------

def _body(x: torch.Tensor) -> torch.Tensor:
    a = F.softmax(x, -1)                 # F.softmax calls Tensor.softmax: one call
    b = x.softmax(-1) + torch.softmax(x, dim=-1)
    c = a * 2 + 2 * b                    # operators dispatch as mul and add
    d = c.mul(3).add(a)
    parts = d.split(2, dim=-1)           # Tensor.split is a Python torch function: its views are nested
    e = torch.cat([p.reshape(-1) for p in parts]).view(d.shape[0], -1)
    f = F.layer_norm(e, e.shape[-1:])    # a Python torch function calling mul/add internally? nested
    g = torch.einsum("ij,ij->ij", f, f)  # einsum is a Python torch function too
    return g.unsqueeze(0).unsqueeze(1).view(-1)


WANTED = {"softmax", "mul", "add", "view", "split", "cat", "unsqueeze", "layer_norm", "einsum", "reshape"}


def _record(run: Callable[[Callable[[str, int, str, Any], Any]], torch.Tensor]) -> tuple[list[Any], torch.Tensor]:
    log: list[Any] = []

    def serve(name: str, k: int, side: str, payload: Any) -> Any:
        log.append((name, k, side, id(payload) if side == "output" else None))
        return payload

    return log, run(serve)


def _under_mode(serve: Callable[[str, int, str, Any], Any], x: torch.Tensor) -> torch.Tensor:
    with op_scopes.OpMode(WANTED, serve):
        return _body(x)


def _under_scope(serve: Callable[[str, int, str, Any], Any], x: torch.Tensor) -> torch.Tensor:
    import sys

    names = sorted(WANTED)
    for n in names:
        assert op_scopes.acquire_op(n), n
    scope = op_scopes.OpScope(WANTED, serve, sys._getframe())
    op_scopes.push_scope(scope)
    try:
        return _body(x)
    finally:
        op_scopes.pop_scope(scope)
        for n in names:
            op_scopes.release_op(n)


@pytest.mark.skipif(not op_scopes.TENSOR_SWAPS, reason="Tensor methods are counted by the mode on this Python")
def test_swapped_callables_count_what_the_mode_counts() -> None:
    x = torch.randn(3, 4)
    mode_log, mode_out = _record(lambda serve: _under_mode(serve, x))
    fast_log, fast_out = _record(lambda serve: _under_scope(serve, x))
    strip = [e[:3] for e in mode_log]
    assert strip == [e[:3] for e in fast_log]
    assert ("softmax", 2, "output") in strip and ("softmax", 3, "input") not in strip
    assert ("split", 0, "input") in strip and ("mul", 2, "input") in strip
    assert torch.equal(mode_out, fast_out)
    assert_nothing_swapped()


def test_operators_are_found_under_the_name_a_mode_sees() -> None:
    names = op_scopes.operator_names()
    assert set(names["mul"]) >= {"__mul__", "__rmul__"}
    assert set(names["add"]) >= {"__add__", "__radd__"}
    assert "__iadd__" in names["add_"]


def test_a_name_with_nothing_to_swap_is_counted_by_the_mode() -> None:
    assert not op_scopes.acquire_op("no_such_op_anywhere")
    assert op_scopes.patched_ops() == []


# ---- threads and two models -----------------------------------------------------------------

def test_traces_in_threads_count_only_their_own_calls() -> None:
    model, inputs = _loads("llama")[0]
    other, other_inputs = _loads("gpt2")[0]
    expected = _op_values(model, inputs, mode=True)
    expected_other = _op_values(other, other_inputs, mode=True)
    with torch.no_grad():
        plain = model.native(**inputs).logits
    errors: list[BaseException] = []
    results: dict[str, list[Any]] = {"a": [], "b": [], "plain": []}
    start = threading.Barrier(3)

    def traced(key: str, m: nnatlas.AtlasModel, ins: dict[str, torch.Tensor]) -> None:
        try:
            start.wait()
            for _ in range(4):
                results[key].append(_op_values(m, ins, mode=False))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def untraced() -> None:
        try:
            start.wait()
            for _ in range(6):
                with torch.no_grad():
                    results["plain"].append(model.native(**inputs).logits)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=traced, args=("a", model, inputs)),
               threading.Thread(target=traced, args=("b", other, other_inputs)),
               threading.Thread(target=untraced)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got in results["a"]:
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    for got in results["b"]:
        assert all(torch.equal(got[k], expected_other[k]) for k in expected_other)
    assert all(torch.equal(p, plain) for p in results["plain"])
    assert_nothing_swapped()


@pytest.mark.parametrize("mode", [False, True])
def test_a_boundary_edit_on_the_scopes_own_module_is_no_op_of_it(mode: bool) -> None:
    """The MoE block's own forward is the scope of ``op:mul`` (shared_expert_output); an edit of
    the block's input computed in the trace (``x * 1.0``, a ``mul`` too) runs outside that scope,
    so it neither shifts the count nor is served as the block's op."""
    model = T.build("qwen3_next", attn_implementation="eager")
    inputs = T.draw_inputs(int(model.normalized_config["vocab_size"]), 2, 6, [0, 2], seed=3)
    layer = model.layers[0]
    with force_mode(mode):
        with model.trace(inputs):
            plain = layer.mlp.shared_expert_output.save()
        with model.trace(inputs):
            layer.mlp_input = layer.mlp_input * 1.0
            routed = layer.mlp.routed_output.save()
            edited = layer.mlp.shared_expert_output.save()
            out = layer.mlp.mlp_output.save()
    assert torch.equal(plain, edited)
    torch.testing.assert_close(routed + edited, out)
    assert_nothing_swapped()
