"""``python -m bench``: the overhead table, memory, and compiler times."""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

import torch

import nnatlas
from nnatlas.testing.suite import LIGHT_KINDS, SOAK_KINDS, standard_values

from . import cache as bench_cache
from . import compile_time, fixed_cost, gradients, memory, models, phases
from . import patching as bench_patching
from . import tensor_parallel as bench_tp
from .timing import Timings, measure
from .workloads import CASES, layer_values, nnsight_available, ours_workloads, theirs_workloads

# (scope, case) -> the most ours/plain may be; scope "tiny llama", "tiny", "deep" (tiny llama, 12 and 24 blocks), "mid"
TARGETS: dict[tuple[str, str], float] = {
    ("tiny", "a"): 1.02, ("mid", "a"): 1.02, ("deep", "a"): 1.02,
    ("tiny llama", "b"): 1.05, ("mid", "b"): 1.02, ("deep", "b"): 1.05,
    ("tiny", "c"): 1.25, ("deep", "c"): 1.25,
}
VS_NNSIGHT = 0.8
OVER_HOOKS = 0.03  # a row with floors: ours/plain may be at most this much over torch forward hooks' /plain
# the tiny families `make bench` times when --families is not given: a dense llama, GPT-2 (fused QKV, Conv1D),
# a mixture and a hybrid (gated DeltaNet); `--families all` times every family under the loads its class accepts
DEFAULT_FAMILIES = ("llama", "gpt2", "qwen3_moe", "qwen3_5_text")
FLOORS = {"hooks": "torch forward hooks", "wrappers": "bare forward wrappers"}  # (Workload.floors)


def floors_text(floors: dict[str, float]) -> str:
    """``torch forward hooks 1.045, bare forward wrappers 1.022``: each bare mechanism's ratio to plain."""
    return ", ".join(f"{FLOORS[name]} {ratio:.3f}" for name, ratio in floors.items())


def target(scope: str, family: str, case: str) -> float | None:
    if scope == "tiny" and family == "llama" and ("tiny llama", case) in TARGETS:
        return TARGETS[("tiny llama", case)]
    return TARGETS.get((scope, case))


class Table:
    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        self.misses: list[str] = []
        self.met: list[str] = []
        self.costs: dict[tuple[str, str], tuple[float, int]] = {}  # (model, case) -> (ours - plain in s, values)
        self.phases: dict[tuple[str, str], dict[str, float]] = {}  # (model, case) -> seconds per phase (phases.split)
        self.calls: dict[tuple[str, str], tuple[int, int]] = {}  # (model, case) -> nnatlas calls (phases.runtime_calls)
        self.floors: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}  # (model, case) -> (ours, bare mechanism -> /plain)
        self.cold: dict[str, tuple[float, float]] = {}  # model -> a 12-step loop warm, after a forward (phases.cold_python)

    def add(self, model: str, scope: str, family: str, case: str, timings: Timings, note: str = "",
            values: int = 0) -> None:
        t, paired = timings.median, timings.ratio
        ratio = paired["ours"]
        goal = target(scope, family, case)
        theirs = t.get("theirs")
        vs = paired.get("ours_same", paired["ours"]) / paired["theirs"] if theirs else None
        self.costs[(model, case)] = (t["ours"] - t["plain"], values)
        floors = {name: paired[name] for name in FLOORS if name in paired}
        if floors:
            self.floors[(model, case)] = (ratio, floors)
        verdicts = []
        if goal is not None:
            ok = ratio <= goal
            verdicts.append(f"{'ok' if ok else 'MISS'} ≤{goal:.2f}")
            why = "" if ok else f": {self.why(model, case, t['plain'])}"
            (self.met if ok else self.misses).append(f"{model} ({case}) ours/plain {ratio:.3f} ≤ {goal}{why}")
        if "hooks" in floors:
            over = ratio - floors["hooks"]
            ok = over <= OVER_HOOKS
            verdicts.append(f"{'ok' if ok else 'MISS'} hooks+{OVER_HOOKS}")
            why = "" if ok else f": {self.why(model, case, t['plain'])}"
            (self.met if ok else self.misses).append(
                f"{model} ({case}) ours/plain {ratio:.3f} ≤ torch forward hooks {floors['hooks']:.3f} + {OVER_HOOKS}{why}")
        if vs is not None:
            ok = vs <= VS_NNSIGHT
            verdicts.append(f"{'ok' if ok else 'MISS'} vs ≤{VS_NNSIGHT}")
            (self.met if ok else self.misses).append(f"{model} ({case}) ours/nnsight {vs:.3f} ≤ {VS_NNSIGHT}")
        self.rows.append([
            model, f"({case}) {CASES[case]}", f"{t['plain'] * 1e3:.2f}", f"{t['ours'] * 1e3:.2f}", f"{ratio:.3f}",
            f"{theirs * 1e3:.2f}" if theirs else "-", f"{paired['theirs']:.3f}" if theirs else "-",
            f"{vs:.3f}" if vs is not None else "-", ", ".join(verdicts) + (f" {note}" if note else ""),
        ])

    def why(self, model: str, case: str, plain: float) -> str:
        """Where a row's time over plain goes: the per-trace cost (the empty trace's row of the same model)
        and the rest per value served (the values the workload saves)."""
        extra, values = self.costs[(model, case)]
        base = self.costs.get((model, "a"), (0.0, 0))[0] if case != "a" else extra
        words = f"{extra * 1e6:.0f} µs over a {plain * 1e3:.2f} ms forward; per trace {base * 1e6:.0f} µs (row a)"
        if case != "a" and values:
            words += f", then {(extra - base) / values * 1e6:.1f} µs for each of {values} values"
        split = self.phases.get((model, case))
        if split is not None:  # where it goes (the least of each phase over separate runs: phases.split)
            per = f" ({split['record'] / values * 1e6:.1f} µs per value)" if values else ""
            words += (f"; at best, recording {split['record'] * 1e6:.0f} µs{per}, installing {split['install'] * 1e6:.0f} µs, "
                      f"the forward {split['forward'] * 1e6:+.0f} µs over plain, closing {split['close'] * 1e6:.0f} µs")
        calls = self.calls.get((model, case))
        if calls is not None:  # counted: the Python work the time above pays for
            in_forward, total = calls
            per_value = f" ({in_forward / values:.1f} per value)" if values else ""
            words += f"; nnatlas functions run: {in_forward} in the forward{per_value}, {total} in all"
        floors = self.floors.get((model, case))
        if floors:  # what the mechanism alone costs: the rest is nnatlas' own Python
            words += "; the same saves with no library, same rounds: " + floors_text(floors[1])
        cold = self.cold.get(model)
        if cold is not None:
            words += (f"; Python runs cold after a forward here (a 12-step loop: {cold[0] * 1e6:.2f} µs warm, "
                      f"{cold[1] * 1e6:.2f} µs right after the plain forward)")
        return words

    def print(self) -> None:
        head = ["model", "workload", "plain ms", "ours ms", "ours/plain", "nnsight ms", "nnsight/plain",
                "ours/nnsight", "target"]
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(len(head))]
        line = lambda r: "  ".join(c.ljust(w) if i < 2 or i == 8 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        print(line(head))
        print("  ".join("-" * w for w in widths))
        last = None
        for r in self.rows:
            if last is not None and r[0] != last:
                print()
            print(line(r))
            last = r[0]
        if self.floors:
            print("\nthe same saves with no library, same rounds (/plain): what the mechanism alone costs")
            width = max(len(model) for model, _ in self.floors)
            for (model, case), (ours, floors) in self.floors.items():
                print(f"  {model.ljust(width)}  ({case}) ours {ours:.3f}, {floors_text(floors)}")


def bench_model(table: Table, name: str, scope: str, family: str, model: Any, eager: Any,
                inputs: dict[str, torch.Tensor], runs: int, gen_runs: int, cases: str, with_nnsight: bool) -> None:
    ours = ours_workloads(model, eager, inputs)
    theirs: dict[str, Any] = {}
    notes: dict[str, str] = {}
    if with_nnsight:
        theirs, notes = theirs_workloads(model, eager, inputs)
    for case in cases:
        w = ours[case]
        fns = {"plain": w.plain, "ours": w.ours, **w.floors}
        if case in theirs:
            fns["theirs"] = theirs[case]
            if f"{case}:ours" in theirs:  # nnsight reads a subset: ours on the same subset, for ours/nnsight
                fns["ours_same"] = theirs[f"{case}:ours"]
        t = measure(fns, gen_runs if case == "e" else runs, warmup=1 if scope == "mid" else 3)
        if case in "abc":  # (for the why of a miss)
            table.phases[(name, case)] = phases.split(w.ours, w.plain, max(5, runs // 4))
            table.calls[(name, case)] = phases.runtime_calls(w.ours)
        if case == "b":
            table.cold[name] = phases.cold_python(w.plain, max(5, runs // 4))
        table.add(name, scope, family, case, t, notes.get(case, ""), w.values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--runs", type=int, default=201, help="timed runs per forward workload, tiny models")
    parser.add_argument("--gen-runs", type=int, default=21, help="timed runs per generation workload, tiny models")
    parser.add_argument("--mid-runs", type=int, default=9, help="timed runs per workload, mid-size model")
    parser.add_argument("--mid-layers", type=int, default=4,
                        help="blocks of the mid-size model (0: skip it); 4 is one full period of Qwen3.5's "
                             "3 linear-attention + 1 full-attention blocks (24 recorded), the fewest a cache accepts")
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                        help=f"comma-separated families, or 'all' (default: {','.join(DEFAULT_FAMILIES)})")
    parser.add_argument("--deep", default="12,24",
                        help="block counts of the deep tiny llama rows (empty: none): a per-trace cost hides in 3 blocks")
    parser.add_argument("--cases", default="abcde")
    parser.add_argument("--sweep-runs", type=int, default=2,
                        help="paired rounds of the patching.sweep rows (0 skips them; a round takes minutes)")
    parser.add_argument("--no-nnsight", action="store_true")
    parser.add_argument("--grad-traces", type=int, default=1000,
                        help="grad traces of the gradients' leak row, tiny llama (0: skip it)")
    parser.add_argument("--cache-docs", type=int, default=1500,
                        help="documents of the nnatlas cache throughput row (0: skip it)")
    parser.add_argument("--cache-procs", default="1,2", help="process counts for the nnatlas cache row (torchrun)")
    parser.add_argument("--cache-rounds", type=int, default=3,
                        help="rounds of the nnatlas cache row (each: the command, then a plain loop, alternated)")
    parser.add_argument("--fixed-runs", type=int, default=801,
                        help="paired rounds of the fixed cost of one trace, tiny llama h32 L4 (0: skip it)")
    parser.add_argument("--tp-runs", type=int, default=21,
                        help="paired rounds of the tensor-parallel rows (torchrun, 2 gloo processes; 0: skip them)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    start = time.perf_counter()
    with_nnsight = nnsight_available() and not args.no_nnsight
    versions = f"torch {torch.__version__}, python {platform.python_version()}, 1 thread"
    if with_nnsight:
        import nnsight

        versions += f", nnsight {nnsight.__version__}"
    print(f"nnatlas overhead, interleaved warm runs ({versions}); ms columns: median times; ratios: median of "
          "per-round ratios to the plain call of the same round")
    print(f"tiny: {args.runs} runs ({args.gen_runs} for generation), batch 1 seq {models.TINY_SEQ}; "
          f"mid-size: {args.mid_runs} runs, seq {models.MID_SEQ}\n")

    table = Table()
    known = sorted(nnatlas.all_families())
    families = known if args.families == "all" else [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in known]
    if unknown:
        parser.error(f"--families: no family {', '.join(unknown)} (known: {', '.join(known)}, or 'all')")
    mem_rows: list[str] = []
    for family in families:
        model, eager, inputs = models.tiny(family)
        hidden = model.normalized_config.get("hidden_size")
        name = f"{family} tiny (h{hidden} L{len(model.layers)})"
        bench_model(table, name, "tiny", family, model, eager, inputs, args.runs, args.gen_runs, args.cases,
                    with_nnsight)
        mem_rows.append(memory_row(name, model, eager, inputs))

    for layers in [int(n) for n in args.deep.split(",") if n]:
        model, eager, inputs = models.tiny("llama", layers)
        name = f"llama tiny (h{model.normalized_config.get('hidden_size')} L{layers})"
        bench_model(table, name, "deep", "llama", model, eager, inputs, args.runs, args.gen_runs,
                    "".join(c for c in args.cases if c in "abc"), with_nnsight)

    if args.mid_layers:
        t0 = time.perf_counter()
        label, model, eager, inputs = models.mid(args.mid_layers)
        built = time.perf_counter() - t0
        bench_model(table, f"mid {label}", "mid", model.family, model, eager, inputs, args.mid_runs,
                    max(2, args.mid_runs // 2), args.cases, with_nnsight)
        mem_rows.append(memory_row(f"mid {label}", model, eager, inputs))
        mid_note = f"mid-size model built in {built:.1f} s (recorded config, random weights, blocks scaled down)"
    else:
        mid_note = "mid-size model skipped"

    table.print()
    print(f"\n{mid_note}")
    if args.fixed_runs:
        print(f"\nthe fixed cost of a trace: {fixed_cost.__doc__.splitlines()[0].split(': ', 1)[1]}")
        fixed, ok = fixed_cost.row(args.fixed_runs, with_nnsight)
        print(fixed)
        (table.met if ok else table.misses).append("fixed cost of a trace: " + fixed.splitlines()[0].split("): ", 1)[1])
    print("\nmemory (saving makes no copies): bytes allocated by the traced forward beyond the plain one")
    for row in mem_rows:
        print("  " + row)

    print("\ngradients (trace(grad=True)): memory and a traced backward vs a plain backward; leaks: grad traces "
          "in turn " + "; ".join(SOAK_KINDS[k] for k in LIGHT_KINDS))
    for family in [f for f in ("llama", "qwen3_5_text") if f in families]:
        _model, eager, inputs = models.tiny(family)
        name = f"{family} tiny (h{eager.normalized_config.get('hidden_size')} L{len(eager.layers)})"
        print("  " + gradients.memory_row(name, eager, inputs))
        print("  " + gradients.timing_row(name, eager, inputs, max(5, args.runs // 4)))
        if family == "llama" and args.grad_traces:
            print("  " + gradients.leak_row(name, eager, args.grad_traces, models.TINY_SEQ))

    if args.sweep_runs:
        print(f"\nactivation patching: {bench_patching.__doc__.splitlines()[0].split(': ', 1)[1]}")
        for row in bench_patching.rows(args.sweep_runs, with_nnsight, misses=table.misses):
            print(row)

    print(f"\nnnatlas cache: {bench_cache.__doc__.splitlines()[0].split(': ', 1)[1]}")
    print(bench_cache.model_cache_memory())
    if args.cache_docs:
        procs = [int(n) for n in args.cache_procs.split(",") if n]
        print(f"  a small llama (h256 L4), {args.cache_docs} documents of 20-60 words, seq-len {bench_cache.SEQ_LEN}, "
              f"batch {bench_cache.BATCH}, every layer_output at every token, {bench_cache.SHARD_MB} MB shards, 1 "
              "thread per process; forward-loop tokens/s of the command and of a plain loop over the same batches:")
        for row in bench_cache.cache_rows(args.cache_docs, procs, args.cache_rounds):
            print(row)

    if args.tp_runs:
        print(f"\ntensor parallel: {bench_tp.__doc__.splitlines()[0].split(': ', 1)[1]}")
        print(f"  a small llama (h256 L4, 4 heads), seq {bench_tp.SEQ}, {args.tp_runs} paired rounds, 1 thread per process:")
        for row in bench_tp.rows(args.tp_runs):
            print(row)

    cold, cold_cpu = compile_time.cold_check()
    warm, n = compile_time.in_process()
    print("\ncompiler: nnatlas generate --check")
    cold_ok = "ok" if cold < 1.5 else "MISS"
    warm_ok = "ok" if warm / n < 0.1 else "MISS"
    print(f"  cold process: {cold * 1e3:.0f} ms wall, {cold_cpu * 1e3:.0f} ms CPU ({cold_ok} < 1500 ms)")
    print(f"  in process:   {warm * 1e3:.0f} ms for {n} families = {warm / n * 1e3:.0f} ms per family "
          f"({warm_ok} < 100 ms)")
    (table.met if cold < 1.5 else table.misses).append(f"compiler cold {cold * 1e3:.0f} ms < 1500")
    (table.met if warm / n < 0.1 else table.misses).append(f"compiler in process {warm / n * 1e3:.0f} ms/family < 100")

    print(f"\ntargets met: {len(table.met)}, missed: {len(table.misses)}")
    for miss in table.misses:
        print(f"  MISS {miss}")
    print(f"(bench took {time.perf_counter() - start:.0f} s)")
    return 0


def memory_row(name: str, model: Any, eager: Any, inputs: dict[str, torch.Tensor]) -> str:
    values = standard_values(eager, derived=False, needs_images=False)  # a text prompt: no image values

    def traced() -> list[Any]:
        with eager.trace(inputs, order="any"):
            saved = [h.save() for h in values]
        return saved

    with torch.no_grad():
        plain, _ = memory.allocated(lambda: eager.native(**inputs))
        ours, saved = memory.allocated(traced)
    tensors = [s for s in saved if isinstance(s, torch.Tensor)]
    same, total = memory.shared_storage(model, inputs, layer_values(model))
    extra = ours - plain
    return (f"{name}: {len(tensors)} values saved ({memory.saved_bytes(tensors) / 1e6:.3f} MB of storage they "
            f"look into); traced forward allocated {extra:+d} bytes vs plain; "
            f"{same}/{total} saved layer outputs share storage with the model's own tensors")
