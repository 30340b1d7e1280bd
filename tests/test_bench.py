"""The benchmark runs (on a tiny model, few runs: a smoke test, never a timing assertion)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import nnatlas
from bench import models, run
from bench.workloads import ours_workloads, serve_order
from nnatlas.testing.suite import attention_loads, standard_values
from nnatlas.trace.tracer import Tracer


def test_the_bench_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    """End to end at its smallest; bloom refuses sdpa: the bench builds it under the loads its class accepts
    (it used to die building it under sdpa)."""
    assert run.main(["--families", "llama,bloom", "--runs", "3", "--gen-runs", "2", "--mid-layers", "0",
                     "--no-nnsight", "--cache-docs", "0", "--deep", "12", "--grad-traces", "10",
                     "--tp-runs", "0", "--fixed-runs", "5", "--sweep-runs", "0"]) == 0
    out = capsys.readouterr().out
    for case in ("(a) empty trace", "(b) save every layer output", "(c) save every standard value",
                 "(d) edit every layer", "(e) generate 16"):
        assert re.search(rf"llama tiny \(h16 L3\) +{re.escape(case)}", out), case
    for case in ("(a) empty trace", "(b) save every layer output", "(c) save every standard value"):
        assert re.search(rf"llama tiny \(h16 L12\) +{re.escape(case)}", out), case  # a per-trace cost hides in 3 blocks
    assert not re.search(r"llama tiny \(h16 L12\) +\(d\)", out)
    for case in "abcde":
        assert re.search(rf"bloom tiny \(h\d+ L\d+\) +\({case}\) ", out), case
    assert "traced forward allocated +0 bytes vs plain" in out
    grads = next(line for line in out.splitlines() if line.startswith("  llama tiny") and "autograd keeps" in line)
    assert "(+0 vs a plain forward with grad)" in grads and "(+0 vs plain without)" in grads
    assert grads.endswith("bytes for the backward (+0 vs plain)")
    assert any(line.startswith("  llama tiny") and "ours/plain" in line and "forward+backward" in line
               for line in out.splitlines())
    assert ("  llama tiny (h16 L3): 10 grad traces, saves dropped: 0 bytes held after (0 storages), "
            "0 autograd nodes of their graphs alive, +0 live tensors\n") in out
    assert "compiler: nnatlas generate --check" in out and "targets met:" in out
    assert re.search(r"the fixed cost of a trace: one save on a tiny llama \(4 blocks, hidden 32, 8 tokens\).*\n  5 "
                     r"paired rounds, µs over a [0-9.]+ ms forward .*: torch forward hook [+-]\d+, nnatlas [+-]\d+ "
                     r"\((ok|MISS) ≤ hook \+ 30: [+-]\d+\)\n  the steps a trace takes, by hand in one function \(.*\): "
                     r"[+-]\d+, the hook [+-]\d+ in the same rounds\n", out)
    # and the trace's own path warm, the forward one norm call (what resolves a microsecond): the line after them
    assert re.search(r"in the same rounds\n  its own path warm \(the forward one call of the norm where layer_mid is read, "
                     r"\d+ µs\): nnatlas [+-][0-9.]+, a forward pre-hook [+-][0-9.]+ in the same rounds\n", out), out
    for layers in (3, 12):  # every (b) row's floors, met or missed
        assert re.search(rf"  llama tiny \(h16 L{layers}\) +\(b\) ours [0-9.]+, torch forward hooks [0-9.]+, "
                         r"bare forward wrappers [0-9.]+\n", out), layers


def test_an_unknown_family_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        run.main(["--families", "llama,nosuch"])
    assert stop.value.code == 2
    assert "--families: no family nosuch (known: " in capsys.readouterr().err


@pytest.mark.parametrize("family", sorted(nnatlas.all_families()))
def test_every_familys_workloads_run(family: str) -> None:
    """`python -m bench --families all` at its smallest: every family builds under the loads its class accepts,
    and each workload (plain, ours and the bare floors) runs once."""
    model, eager, inputs = models.tiny(family)
    assert model.native.config._attn_implementation in attention_loads(family)
    for case, w in ours_workloads(model, eager, inputs).items():
        for name, fn in {"plain": w.plain, "ours": w.ours, **w.floors}.items():
            assert fn() is not None or case in "ad", (case, name)


def test_serve_order_is_the_forwards_order() -> None:
    """nnsight serves only in forward order: the bench sorts the handles by when our trace served them."""
    model, eager, inputs = models.tiny("llama")
    handles = standard_values(eager, needs_images=False)
    labels = [h.label for h in serve_order(eager, inputs, handles)]
    assert len(labels) == len([h for h in handles if h._read.kind != "derived"])
    position = {label: i for i, label in enumerate(labels)}
    assert position["input_ids"] < position["token_embeddings"] < position["layers[0].layer_input"]
    for i in range(len(model.layers)):
        assert (position[f"layers[{i}].layer_input"] < position[f"layers[{i}].self_attn.attention_scores"]
                < position[f"layers[{i}].self_attn.attention_output"] < position[f"layers[{i}].layer_output"])
    assert position["layers[2].layer_output"] < position["logits"]


def test_nnsight_reads_the_same_values_where_it_can(capsys: pytest.CaptureFixture[str]) -> None:
    """With the optional ``bench`` extra: nnsight's side of (c) on a hybrid family reads every value
    it can express, and ours/nnsight compares the two on exactly that subset."""
    pytest.importorskip("nnsight", reason="nnsight is the optional `bench` extra (pip install -e '.[bench]')")
    # (no deep rows, no cache row, no full-size sweep rows nor grad soak: the table's other tests run them, the sweep
    # rows at their smallest with nnsight's loop; 67 s and 130 s of CI otherwise; the fixed-cost row with nnsight's
    # trace, briefly)
    assert run.main(["--families", "qwen3_5_text", "--cases", "c", "--runs", "2", "--mid-layers", "0",
                     "--deep", "", "--cache-docs", "0", "--tp-runs", "0", "--sweep-runs", "0", "--grad-traces", "0",
                     "--fixed-runs", "5"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "(c) save every standard value" in line)
    assert "vs nnsight on the 55 of 79 values it can read (not 24: fn reads and what derives from them)" in row
    assert " - " not in row.split("(eager)")[1][:60]  # an nnsight time and ratio, not a dash
    assert re.search(r"torch forward hook [+-]\d+, nnatlas [+-]\d+ \(.*\), nnsight [+-]\d+", out), out  # the fixed cost, beside nnsight


def test_the_cache_row_runs_the_command() -> None:
    """``nnatlas cache`` in its own process: its summary line parsed into tokens/s and memory."""
    from bench import cache

    rows = cache.cache_rows(30, [1], rounds=1)
    assert len(rows) == 1 and re.search(r"nnatlas cache \d+ tokens/s .*, plain loop \d+ .*: ratio [\d.]+ ", rows[0])
    assert "; peak memory " in rows[0] and "MB of shards" in rows[0] and "padding " in rows[0]
    assert "allocated +0 bytes vs the plain forward" in cache.model_cache_memory()


def test_the_fixed_cost_verdict_is_nnatlas_over_the_hook_of_the_same_rounds() -> None:
    """ok at 30 µs over the hook (and below), MISS above; the plain forward's own time does not enter."""
    from bench import fixed_cost
    from bench.timing import Timings

    def line(ours: float, hook: float) -> str:
        return fixed_cost.text(Timings({"plain": 1e-3}, {}, {"plain": 0.0, "hook": hook, "ours": ours}), 7)

    assert line(70e-6, 40e-6).endswith("torch forward hook +40, nnatlas +70 (ok ≤ hook + 30: +30)")
    assert line(20e-6, 40e-6).endswith("nnatlas +20 (ok ≤ hook + 30: -20)")
    assert line(71e-6, 40e-6).endswith("nnatlas +71 (MISS ≤ hook + 30: +31)")
    assert line(71e-6, 40e-6).startswith("  7 paired rounds, µs over a 1.00 ms forward")


def test_a_missed_row_says_where_its_time_goes() -> None:
    """A row over its target says its cost over plain: per trace (row a), then per value served."""
    from bench.timing import Timings

    table = run.Table()
    plain = {"plain": 1e-3, "ours": 1.01e-3}
    table.add("m", "deep", "llama", "a", Timings(plain, {"ours": 1.01}))
    table.add("m", "deep", "llama", "b", Timings({"plain": 1e-3, "ours": 1.2e-3}, {"ours": 1.2}), values=10)
    assert table.misses == ["m (b) ours/plain 1.200 ≤ 1.05: 200 µs over a 1.00 ms forward; per trace 10 µs "
                            "(row a), then 19.0 µs for each of 10 values"]


def test_a_missed_row_says_which_phase_its_time_goes_to() -> None:
    """With the phases of the traced call measured (bench.phases), the why splits the time: recording
    (per value), installing, the forward over plain, closing."""
    from bench import phases
    from bench.timing import Timings

    model, _eager, inputs = models.tiny("llama")

    def saves() -> list[Any]:
        with model.trace(inputs):
            saved = [layer.output.save() for layer in model.layers]
        return saved

    exit_, forward = Tracer.__exit__, Tracer._forward
    def plain() -> Any:
        with torch.no_grad():
            return model.native(**inputs)

    split = phases.split(saves, plain, 3)
    assert set(split) == set(phases.PHASES)
    assert all(split[p] > 0 for p in ("record", "install", "close"))  # (the forward over plain may be either sign)
    assert (Tracer.__exit__, Tracer._forward) == (exit_, forward)  # put back
    table = run.Table()
    table.phases[("m", "b")] = {"record": 30e-6, "install": 10e-6, "forward": 50e-6, "close": 5e-6}
    table.add("m", "deep", "llama", "b", Timings({"plain": 1e-3, "ours": 1.2e-3}, {"ours": 1.2}), values=10)
    assert table.misses == ["m (b) ours/plain 1.200 ≤ 1.05: 200 µs over a 1.00 ms forward; per trace 0 µs "
                            "(row a), then 20.0 µs for each of 10 values; at best, recording 30 µs (3.0 µs per value), "
                            "installing 10 µs, the forward +50 µs over plain, closing 5 µs"]


def test_the_floors_read_what_ours_saves_and_leave_nothing() -> None:
    """(b)'s bare mechanisms (torch forward hooks, bare forward wrappers) capture the very tensors
    our trace saves, and take themselves off again: a floor compares like with like."""
    from bench.workloads import ours_workloads

    model, eager, inputs = models.tiny("llama")
    b = ours_workloads(model, eager, inputs)["b"]
    assert set(b.floors) == set(run.FLOORS)
    ours = b.ours()
    modules = [layer._module for layer in model.layers]
    for name, floor in b.floors.items():
        got = floor()
        assert len(got) == len(ours) == len(modules), name
        for saved, out in zip(ours, got, strict=True):
            assert torch.equal(saved, out), name
        assert all("forward" not in m.__dict__ and not m._forward_hooks for m in modules), name


def test_a_missed_row_says_what_the_bare_mechanisms_cost() -> None:
    """The why of a (b) miss names the same saves' ratio with no library (same rounds) and how cold
    Python runs right after a forward on this machine."""
    from bench import phases
    from bench.timing import Timings

    table = run.Table()
    table.cold["m"] = (0.3e-6, 1.7e-6)
    table.add("m", "deep", "llama", "b", Timings({"plain": 1e-3, "ours": 1.2e-3},
                                                  {"ours": 1.2, "hooks": 1.04, "wrappers": 1.01}), values=10)
    assert table.misses[0].endswith("; the same saves with no library, same rounds: torch forward hooks 1.040, "
                                    "bare forward wrappers 1.010; Python runs cold after a forward here (a 12-step "
                                    "loop: 0.30 µs warm, 1.70 µs right after the plain forward)")
    warm, cold = phases.cold_python(lambda: None, 3)
    assert 0 < warm and 0 < cold


def test_a_row_with_floors_is_held_within_0_03_of_torch_forward_hooks() -> None:
    """Every layer output within 0.03 of torch's own forward hooks, measured in the same rounds: a (b) row
    with floors is met at hooks + 0.03 and missed just over it, the miss saying both ratios."""
    from bench.timing import Timings

    def verdict(ours: float) -> tuple[list[str], list[str]]:
        table = run.Table()
        table.add("m", "mid", "gpt2", "b", Timings({"plain": 1e-3, "ours": ours * 1e-3},
                                                   {"ours": ours, "hooks": 1.04, "wrappers": 1.01}), values=3)
        return table.met, table.misses

    met, missed = verdict(1.02)
    assert missed == [] and any("torch forward hooks 1.040 + 0.03" in m for m in met)
    met, missed = verdict(1.075)
    assert len(missed) == 2 and missed[1].startswith("m (b) ours/plain 1.075 ≤ torch forward hooks 1.040 + 0.03: ")


def test_measure_puts_every_function_behind_every_other() -> None:
    """A call pays for what ran just before it, so the rounds' order is shuffled: over the rounds,
    each function runs right after each other one (a rotation kept the same neighbour every time)."""
    from bench.timing import measure

    ran: list[str] = []
    names = ["plain", "ours", "theirs", "hooks"]
    timings = measure({name: (lambda name=name: ran.append(name)) for name in names}, runs=40, warmup=0)
    pairs = set(zip(ran, ran[1:]))
    assert {(a, b) for a in names for b in names if a != b} <= pairs
    assert len(ran) == 160 and all(ran.count(name) == 40 for name in names)
    assert set(timings.ratio) == set(names) and timings.ratio["plain"] == 1.0


def test_the_sweep_rows_time_the_sweep_against_the_loops() -> None:
    """bench.patching at its smallest (with nnsight's loop where the bench extra is installed): both rows, every
    sweep equal to the loop, a ratio per function, a verdict per target."""
    from bench import patching
    from bench.workloads import nnsight_available

    size = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8,
            "intermediate_size": 16}
    misses: list[str] = []
    rows = patching.rows(1, nnsight_available(), size=size, seq=16, misses=misses)
    assert rows[0].startswith("  llama h16 L2 vocab 96, 16 tokens")
    for label, row in zip(("every block x 8 spread positions", "every block x the last 8 positions"), rows[1::2],
                          strict=True):
        assert row.startswith(f"    {label} (16 patches): loop "), row
        assert "sweep " in row and "sweep, causal=False " in row and ("nnsight loop " in row) == nnsight_available()
        worst = float(re.search(r"largest difference from the loop (\S+)$", row).group(1))  # type: ignore[union-attr]
        spread = float(re.search(r"the effects span (\S+),", row).group(1))  # type: ignore[union-attr]
        assert worst <= 1e-5 and spread > 0, row
    assert all(re.match(r"      target .* of the loop: (met|MISS) ", r) for r in rows[2::2])
    assert len(misses) == sum("MISS" in r for r in rows[2::2])
