"""``make draft-sweep``: the drafter on every decoder-only causal-LM model type of transformers.

    python -m nnatlas.compiler.draft.sweep [--out generated/docs/draft_sweep.md] [--timeout 300]
        [--limit N] [--redo failing|all] [TYPE ...]
    python -m nnatlas.compiler.draft.sweep --one TYPE      (one type, in this process; prints JSON)

Each type runs in its own process (one thread, its own process group, killed whole at the
timeout): draft, generate in memory, the generated tests (stopping at the first failure), and,
for a type a hand-written spec loads, the share of that spec's standard values the draft finds at
the same hosts (0 when there is no draft to compare). The table is rewritten after every type and
is its own state: a rerun reads the rows it has and keeps them (each with the time it was swept),
sweeping first the types it lacks, then the ones named (or ``--redo failing``: every row that does
not pass; ``--redo all``); ``--limit N`` stops after N types, so a sweep can run in chunks. The
file is not one ``nnatlas generate`` writes (it carries no generated-file mark), so generate keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = "generated/docs/draft_sweep.md"


ENCODERS = ("bert-generation", "xlnet")  # encoders with a causal-LM head, in no masked-LM mapping


def model_types() -> list[str]:
    """The causal-LM model types, less encoders (masked-LM types and ENCODERS) and seq2seq ones (the
    seq2seq mapping, and any whose default config is an encoder-decoder)."""
    from transformers.models.auto import modeling_auto as m
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    exclude = set(m.MODEL_FOR_MASKED_LM_MAPPING_NAMES) | set(m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) | set(ENCODERS)
    out = []
    for t in sorted(m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if t in exclude:
            continue
        try:
            if getattr(CONFIG_MAPPING[t](), "is_encoder_decoder", False):
                continue
        except Exception:  # noqa: BLE001 - a config that does not build by default stays in (its row says why)
            pass
        out.append(t)
    return out


def hand_family(model_type: str) -> Any:
    """The hand-written family that loads this model type, or None."""
    from .. import compile_atlas, default_root

    return next((f for f in compile_atlas(default_root() / "specs").families if model_type in f.model_types), None)


def one(model_type: str) -> dict[str, Any]:
    """Every column of one row, measured in this process."""
    from . import DraftError, draft
    from .check import compare, compile_draft, run_tests

    row: dict[str, Any] = {"type": model_type, "built": False, "drafted": False, "generate": False, "tests": None,
                           "values": 0, "todos": 0, "share": None, "why": ""}
    hand = hand_family(model_type)
    if hand is not None:  # no draft compiled finds none of the spec's values
        row.update(share=0.0, hand=hand.name)
    start = time.perf_counter()
    try:
        d = draft(model_type)
    except DraftError as e:
        row["built"] = "does not build" not in str(e) and "forward failed" in str(e)
        row["why"] = str(e).splitlines()[0][:160]
        return row
    except Exception as e:  # noqa: BLE001 - a drafter bug on this type: the row says so
        row["built"] = True
        row["why"] = f"drafter: {type(e).__name__}: {e}".splitlines()[0][:160]
        return row
    row.update(built=True, drafted=True, values=sum(len(h.values) for h in d.proposal.hosts.values()),
               todos=len(d.proposal.todos))
    compiled = compile_draft(d.text, d.proposal.family)
    if compiled.family is None:
        row["why"] = "generate: " + compiled.error.splitlines()[0][:160]
        return row
    row["generate"] = True
    if hand is not None:
        row["share"] = round(compare(compiled.family, hand).share, 3)
    run = run_tests(compiled.family, fail_fast=True, in_process=True)
    row["tests"] = run.ok
    row["passed"] = run.passed
    if not run.ok:
        row["why"] = "tests: " + (run.failures[0] if run.failures else run.output.strip().splitlines()[-1][:160])
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


COLUMNS = "| model type | built | drafted | generate | tests | values | TODO | hand | why not | swept |"


def summary(rows: list[dict[str, Any]], total: int) -> str:
    done = len(rows)
    built = [r for r in rows if r["built"]]
    passing = [r for r in rows if r["tests"]]
    hand = [r for r in rows if r.get("share") is not None]
    line = (f"{done} of {total} types swept; {len(built)} build; {len(passing)} pass generate and their generated "
            f"tests unedited ({100 * len(passing) / max(len(built), 1):.0f}% of those that build, "
            f"{100 * len(passing) / max(done, 1):.0f}% of all swept).")
    if hand:
        mean = sum(r["share"] for r in hand) / len(hand)
        line += (f" {len(hand)} have a hand-written spec: their drafts find {100 * mean:.0f}% of its standard values "
                 f"on average ({sum(1 for r in hand if r['share'] == 1)} all of them).")
    return line


def table(rows: list[dict[str, Any]], total: int, started: str) -> str:
    def yn(x: Any) -> str:
        return "—" if x is None else ("yes" if x else "no")

    swept = sorted(r["swept"] for r in rows if r.get("swept"))
    when = f"rows swept from {swept[0]} to {swept[-1]} UTC" if swept else f"started {started}"
    lines = [
        "# The drafter on every decoder-only causal-LM model type",
        "",
        "Written by `make draft-sweep` (`python -m nnatlas.compiler.draft.sweep`), not by `nnatlas generate`;",
        f"{when} (last run started {started}). Each type's draft is used unedited: built (the tiny model builds",
        "on CPU and runs a forward), drafted (a spec was written), generate (it compiles), tests (its generated",
        "tests pass), values (standard values proposed), TODO (modules it could not map), hand (the share of a",
        "hand-written spec's standard values found at the same hosts with an equal read point; 0% where the",
        "type has a spec and no draft compiled), swept (when the row was measured: a rerun keeps the rows it has).",
        "",
        summary(rows, total),
        "",
        COLUMNS,
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r["type"]):
        share = f"{100 * r['share']:.0f}% ({r.get('hand')})" if r.get("share") is not None else ""
        why = r.get("why", "").replace("|", "\\|")
        lines.append(f"| {r['type']} | {yn(r['built'])} | {yn(r['drafted'])} | {yn(r['generate'] if r['drafted'] else None)} "
                     f"| {yn(r['tests'])} | {r['values'] or ''} | {r['todos'] or ''} | {share} | {why} | {r.get('swept', '')} |")
    return "\n".join(lines) + "\n"


def read_table(text: str) -> list[dict[str, Any]]:
    """The rows of a table ``table`` wrote (an older one without the swept column too)."""
    import re

    def flag(x: str) -> bool | None:
        return None if x == "—" else x == "yes"

    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| model type"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) < 9:
            continue
        t, built, drafted, generate, tests, values, todos, hand, why = cells[:9]
        m = re.match(r"(\d+)% \((.+)\)$", hand)
        row: dict[str, Any] = {"type": t, "built": flag(built), "drafted": flag(drafted), "generate": bool(flag(generate)),
                               "tests": flag(tests), "values": int(values or 0), "todos": int(todos or 0),
                               "share": int(m.group(1)) / 100 if m else None, "why": why}
        if m:
            row["hand"] = m.group(2)
        if len(cells) > 9 and cells[9]:
            row["swept"] = cells[9]
        rows.append(row)
    return rows


def sweep_one(t: str, timeout: float) -> dict[str, Any]:
    """One type's row, measured in a process of its own (a process group, killed whole at the timeout)."""
    import signal

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "nnatlas.compiler.draft.sweep", "--one", t], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"type": t, "built": None, "drafted": False, "generate": False, "tests": None, "values": 0, "todos": 0,
                "why": f"timed out after {timeout:.0f} s"}
    line = next((x for x in out.splitlines() if x.startswith("NNATLAS-ROW ")), None)
    if line:
        return json.loads(line[len("NNATLAS-ROW "):])  # type: ignore[no-any-return]
    return {"type": t, "built": False, "drafted": False, "generate": False, "tests": None, "values": 0, "todos": 0,
            "why": f"crashed (exit {proc.returncode}): " + ((err.strip().splitlines() or ["?"])[-1])[:160]}


def order(types: list[str], kept: dict[str, dict[str, Any]], named: list[str], redo: str | None,
          hand: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """What to sweep, in order: the types the table lacks, the rows of a type with a hand-written spec
    and no hand share (the spec is newer than the row), those named, then those to redo."""
    lacking = [t for t in types if t not in kept]
    unscored = [t for t in types if t in kept and t in hand and kept[t].get("share") is None]
    first = [t for t in types if t in kept and t not in unscored and t in named]
    again = [t for t in types if t in kept and t not in unscored and t not in named and (
        redo == "all" or (redo == "failing" and not kept[t]["tests"]))]
    return lacking + unscored + first + again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nnatlas.compiler.draft.sweep")
    parser.add_argument("types", nargs="*", help="model types to sweep again (the table's other rows are kept)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    parser.add_argument("--limit", type=int, default=None, help="sweep at most this many types, then stop")
    parser.add_argument("--redo", choices=("failing", "all"), default=None,
                        help="sweep again every row that does not pass (failing) or every row (all)")
    parser.add_argument("--fresh", action="store_true", help="start a new table (the rows there are dropped)")
    parser.add_argument("--one", default=None, help="run one type in this process and print its row as JSON")
    args = parser.parse_args(argv)
    if args.one:
        print("NNATLAS-ROW " + json.dumps(one(args.one)), flush=True)
        return 0
    from .. import default_root

    out = args.out or default_root() / OUT
    types = model_types()
    unknown = [t for t in args.types if t not in types]
    if unknown:
        parser.error(f"not decoder-only causal-LM model types: {', '.join(unknown)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kept: dict[str, dict[str, Any]] = {}
    if out.exists() and not args.fresh:
        kept = {r["type"]: r for r in read_table(out.read_text(encoding="utf-8")) if r["type"] in types}
    from .. import compile_atlas

    hand = {t for f in compile_atlas(default_root() / "specs").families for t in f.model_types}
    todo = order(types, kept, args.types, args.redo, hand)[:args.limit]
    print(f"{len(kept)} rows kept; sweeping {len(todo)}: {' '.join(todo)}", flush=True)
    for t in todo:
        row = sweep_one(t, args.timeout)
        row["swept"] = time.strftime("%m-%d %H:%M", time.gmtime())
        kept[t] = row
        print(f"{t}: {row.get('why') or 'ok'}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table(list(kept.values()), len(types), started), encoding="utf-8")
    print(summary(list(kept.values()), len(types)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
