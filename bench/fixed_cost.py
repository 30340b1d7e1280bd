"""The fixed cost of a trace: one save on a tiny llama (4 blocks, hidden 32, 8 tokens), in µs over a plain forward.

Beside it, in the same shuffled rounds (``bench.timing``): one torch forward hook reading the same output
(registered, run, removed), and nnsight's trace of the same save where nnsight is installed. On a model this
small the forward is about a millisecond, so what a trace adds is what each trace pays whatever the model:
the inputs' checks, opening and closing (the lock, the interrupt handlers), the request, putting the plan's
wrappers on and taking them off. Each is a difference of medians' worth of noise on a loaded machine: the
row is the median over rounds of (call - plain call of the same round), and the verdict compares nnatlas with
the hook measured in the same rounds. Issue 39's target: nnatlas within 30 µs of the hook.

A second line, in rounds of its own, times the steps such a trace takes written by hand in one function
(``by_hand``): the C-level work a trace cannot skip, without nnatlas' Python around it. Where nnatlas misses and
the steps by hand do not, what is left to cut is nnatlas' own Python path, not the steps.

A third line times that path warm, where a change of a microsecond shows (``own_path``): the forward replaced by one
call of the norm where block 1's ``layer_mid`` is read (a trace of that save, against a forward pre-hook reading the
same input), in rounds of calls of some 20 µs, so that nothing evicts the trace's code between two of them. The cold
row moves by ±15 µs from one process to another (where its memory lies); this line by about ±0.5 µs.
"""

from __future__ import annotations

import _signal
from collections.abc import Callable
from typing import Any

import torch

from nnatlas.inputs.prepare import prepare
from nnatlas.model import AtlasModel
from nnatlas.testing import build, draw_inputs
from nnatlas.testing.suite import first_params
from nnatlas.trace import interrupts
from nnatlas.trace.placeholders import Placeholder
from nnatlas.trace.requests import RUNNING_TRACE
from nnatlas.trace.tracer import Tracer

from .timing import Timings, measure
from .workloads import Theirs, hooked_forward, value_module

LAYERS, HIDDEN, SEQ = 4, 32, 8
OVER_HOOK = 30e-6  # seconds nnatlas may add over one torch forward hook
BLOCK = 1  # the block whose output the row saves
BY_HAND = "inputs checked, signal guard on and off, lock, placeholder, context, wrapper, .data"


def tiny_llama() -> tuple[AtlasModel, dict[str, torch.Tensor]]:
    """The row's model (sdpa, the default load) and its one prompt of ``SEQ`` tokens."""
    params = {**first_params("llama"), "num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": HIDDEN // 4, "intermediate_size": 2 * HIDDEN}
    model = build("llama", params, attn_implementation="sdpa")
    return model, draw_inputs(int(model.normalized_config["vocab_size"]), 1, SEQ, [0], seed=1)


def workloads(model: AtlasModel, inputs: dict[str, torch.Tensor], with_nnsight: bool) -> dict[str, Callable[[], Any]]:
    """plain, hook, ours and (where installed) nnsight: each call returns the block's output it read."""
    hf = model.native
    handle = model.layers[BLOCK].layer_output
    module = value_module(handle)

    def plain() -> Any:
        with torch.no_grad():
            return hf(**inputs)

    def hook() -> Any:
        saved: list[Any] = []
        hooked_forward(hf, inputs, [module.register_forward_hook(lambda _m, _a, out: saved.append(out))])
        return saved[0]

    def ours() -> Any:
        with model.trace(inputs):
            out = model.layers[BLOCK].layer_output.save()
        return out

    fns = {"plain": plain, "hook": hook, "ours": ours}
    if with_nnsight:
        theirs = Theirs(model)
        nn, proxy = theirs.nn, theirs.proxy

        def nnsight() -> Any:
            with nn.trace(inputs):
                out = proxy(handle).save()
            return out

        fns["nnsight"] = nnsight
    return fns


def by_hand(model: AtlasModel, inputs: dict[str, torch.Tensor]) -> Callable[[], Any]:
    """The steps a trace of this one save takes, written by hand in one function without nnatlas' Python around
    them (the why of a miss): the inputs copied and checked (the ids' in-place version, the mask's shape, the
    device), the interrupt guard's handler put on each signal that has a Python handler and put back (one
    ``sigaction`` each way, as ``nnatlas.trace.interrupts`` does), the model's lock, a placeholder made and made a
    plain tensor again, the running-trace context variable, the block's instance-forward wrapper, ``.data``
    pointed at the output, grad mode off and back."""
    hf, lock = model.native, model._lock
    handle = model.layers[BLOCK].layer_output
    module, label = value_module(handle), handle.label
    empty, param = torch.empty(0), next(hf.parameters())  # (the device read on each call, as ``prepare`` does)
    original = module.forward
    held: dict[str, Any] = {}

    def forward(*args: Any, **kwargs: Any) -> Any:
        if RUNNING_TRACE.get() is not held.get("mine"):
            return original(*args, **kwargs)
        out = original(*args, **kwargs)
        held["holder"].data = out
        return out

    def steps() -> Any:
        x = dict(inputs)
        ids, mask = x["input_ids"], x["attention_mask"]
        if ids._version < 0 or mask.shape != ids.shape or ids.device != param.device:
            raise AssertionError("fixed cost: the inputs do not pass")
        wrapped = {sig: h for sig in interrupts.SIGNALS if callable(h := _signal.getsignal(sig))}
        for sig in wrapped:
            _signal.signal(sig, interrupts._handler)
        if not lock.acquire(False):
            raise AssertionError("fixed cost: the model's lock is held")
        try:
            holder = empty.new()
            holder.__class__ = Placeholder  # type: ignore[assignment]
            holder.__dict__["_nnatlas_label"] = label
            del holder.__dict__["_nnatlas_label"]
            holder.__class__ = torch.Tensor  # type: ignore[assignment]
            mine: dict[int, Any] = {}
            held["mine"], held["holder"] = mine, holder
            token, grad, d = RUNNING_TRACE.set(mine), torch._C.is_grad_enabled(), module.__dict__
            previous = d.get("forward")  # (an instance's own forward, accelerate's: put back after, as a plan does)
            try:
                d["forward"] = forward
                torch._C._set_grad_enabled(False)
                hf(**x)
            finally:
                torch._C._set_grad_enabled(grad)
                if previous is None:
                    del d["forward"]
                else:
                    d["forward"] = previous
                RUNNING_TRACE.reset(token)
                held.clear()
        finally:
            lock.release()
            for sig, h in wrapped.items():
                _signal.signal(sig, h)
        return holder

    return steps


def own_path(model: AtlasModel, inputs: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """plain, hook and ours with the forward replaced by one call of the norm where block ``BLOCK``'s ``layer_mid``
    is read (its input): a trace as ``model.trace`` makes it (``Tracer._plain``, the inputs prepared) saving that
    value, a forward pre-hook reading it, and the bare call, each under grad off. Each returns the tensor it read."""
    norm = value_module(model.layers[BLOCK].layer_mid)
    x = torch.randn(1, SEQ, HIDDEN, generator=torch.Generator().manual_seed(0))
    set_grad, grad_enabled = torch._C._set_grad_enabled, torch._C.is_grad_enabled

    def forward(**_: Any) -> Any:
        return norm(x)

    def call() -> None:  # (the norm with grad off, as a trace runs its forward)
        grad = grad_enabled()
        set_grad(False)
        try:
            norm(x)
        finally:
            set_grad(grad)

    def plain() -> Any:
        call()
        return x

    def hook() -> Any:
        saved: list[Any] = []
        handle = norm.register_forward_pre_hook(lambda _m, args: saved.append(args[0]))
        try:
            call()
        finally:
            handle.remove()
        return saved[0]

    def ours() -> Any:
        with Tracer._plain(model, prepare(model, inputs, {}), forward):
            out = model.layers[BLOCK].layer_mid.save()
        return out

    return {"plain": plain, "hook": hook, "ours": ours}


def row(runs: int, with_nnsight: bool) -> tuple[str, bool]:
    """The printed row and whether nnatlas is within ``OVER_HOOK`` of the hook; then, in rounds of their own (so that
    they do not warm nnatlas' code for the row), the steps by hand beside the hook. Refuses (AssertionError) when
    they do not all read the same tensor: the row times the same read each way."""
    model, inputs = tiny_llama()
    fns = workloads(model, inputs, with_nnsight)
    steps = by_hand(model, inputs)
    reads = {name: fn() for name, fn in fns.items() if name != "plain"}
    reads["by hand"] = steps()
    for name, got in reads.items():
        torch.testing.assert_close(got, reads["hook"], rtol=0, atol=0, msg=f"fixed cost: {name} read another tensor")
    path = own_path(model, inputs)
    for name, fn in path.items():
        torch.testing.assert_close(fn(), path["plain"](), rtol=0, atol=0, msg=f"fixed cost: the warm {name} read another tensor")
    t = measure(fns, runs)
    floor = measure({"plain": fns["plain"], "hook": fns["hook"], "steps": steps}, runs)
    warm = measure(path, 10 * runs)
    return f"{text(t, runs)}\n{steps_text(floor)}\n{warm_text(warm)}", met(t)


def warm_text(t: Timings) -> str:
    """The trace's own path warm (``own_path``), in µs over the bare call, beside the pre-hook of its rounds."""
    return (f"  its own path warm (the forward one call of the norm where layer_mid is read, {t.median['plain'] * 1e6:.0f} "
            f"µs): nnatlas {t.over['ours'] * 1e6:+.1f}, a forward pre-hook {t.over['hook'] * 1e6:+.1f} in the same rounds")


def steps_text(t: Timings) -> str:
    """The steps by hand (``by_hand``), in µs over a plain forward, beside the hook of their rounds."""
    return (f"  the steps a trace takes, by hand in one function ({BY_HAND}): {t.over['steps'] * 1e6:+.0f}, "
            f"the hook {t.over['hook'] * 1e6:+.0f} in the same rounds")


def met(t: Timings) -> bool:
    """nnatlas within ``OVER_HOOK`` of the hook, in whole µs (what the row prints)."""
    return round(t.over["ours"] * 1e6) - round(t.over["hook"] * 1e6) <= round(OVER_HOOK * 1e6)


def text(t: Timings, runs: int) -> str:
    over = {name: us * 1e6 for name, us in t.over.items()}
    ok = met(t)
    line = (f"  {runs} paired rounds, µs over a {t.median['plain'] * 1e3:.2f} ms forward (median of per-round "
            f"differences): torch forward hook {over['hook']:+.0f}, nnatlas {over['ours']:+.0f} "
            f"({'ok' if ok else 'MISS'} ≤ hook + {OVER_HOOK * 1e6:.0f}: {round(over['ours']) - round(over['hook']):+d})")
    if "nnsight" in over:
        line += f", nnsight {over['nnsight']:+.0f}"
    return line
