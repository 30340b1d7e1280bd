"""``make draft-sweep``: the drafter on every decoder-only causal-LM model type of transformers.

    python -m nnatlas.compiler.draft.sweep [--out generated/docs/draft_sweep.md] [--timeout 300] [TYPE ...]
    python -m nnatlas.compiler.draft.sweep --one TYPE      (one type, in this process; prints JSON)

Each type runs in its own process (one thread, a timeout): draft, generate in memory, the
generated tests (stopping at the first failure), and, for a type a hand-written spec loads, the
share of that spec's standard values the draft finds at the same hosts. The table is rewritten
after every type, so an interrupted sweep leaves the rows it has. The file is not one
``nnatlas generate`` writes (it carries no generated-file mark), so generate keeps it.
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


def one(model_type: str) -> dict[str, Any]:
    """Every column of one row, measured in this process."""
    from .. import compile_atlas, default_root
    from . import DraftError, draft
    from .check import compare, compile_draft, run_tests

    row: dict[str, Any] = {"type": model_type, "built": False, "drafted": False, "generate": False, "tests": None,
                           "values": 0, "todos": 0, "share": None, "why": ""}
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
    hand = next((f for f in compile_atlas(default_root() / "specs").families if model_type in f.model_types), None)
    if hand is not None:
        cmp = compare(compiled.family, hand)
        row["share"] = round(cmp.share, 3)
        row["hand"] = hand.name
    run = run_tests(compiled.family, fail_fast=True, in_process=True)
    row["tests"] = run.ok
    row["passed"] = run.passed
    if not run.ok:
        row["why"] = "tests: " + (run.failures[0] if run.failures else run.output.strip().splitlines()[-1][:160])
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def table(rows: list[dict[str, Any]], total: int, started: str) -> str:
    def yn(x: Any) -> str:
        return "—" if x is None else ("yes" if x else "no")

    lines = [
        "# The drafter on every decoder-only causal-LM model type",
        "",
        "Written by `make draft-sweep` (`python -m nnatlas.compiler.draft.sweep`), not by `nnatlas generate`;",
        f"started {started}. Each type's draft is used unedited: built (the tiny model builds on CPU and runs",
        "a forward), drafted (a spec was written), generate (it compiles), tests (its generated tests pass),",
        "values (standard values proposed), TODO (modules it could not map), hand (the share of a",
        "hand-written spec's standard values found at the same hosts with an equal read point).",
        "",
    ]
    done = len(rows)
    built = [r for r in rows if r["built"]]
    passing = [r for r in rows if r["tests"]]
    lines.append(f"{done} of {total} types swept; {len(built)} build; {len(passing)} pass generate and their generated "
                 f"tests unedited ({100 * len(passing) / max(len(built), 1):.0f}% of those that build, "
                 f"{100 * len(passing) / max(done, 1):.0f}% of all swept).")
    lines += ["", "| model type | built | drafted | generate | tests | values | TODO | hand | why not |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f"{100 * r['share']:.0f}% ({r.get('hand')})" if r.get("share") is not None else ""
        why = r.get("why", "").replace("|", "\\|")
        lines.append(f"| {r['type']} | {yn(r['built'])} | {yn(r['drafted'])} | {yn(r['generate'] if r['drafted'] else None)} "
                     f"| {yn(r['tests'])} | {r['values'] or ''} | {r['todos'] or ''} | {share} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nnatlas.compiler.draft.sweep")
    parser.add_argument("types", nargs="*", help="model types (default: every decoder-only causal-LM type)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    parser.add_argument("--one", default=None, help="run one type in this process and print its row as JSON")
    parser.add_argument("--rows", type=Path, default=None,
                        help="a JSON file of rows: read first (the types it has are kept, unless named), written after each type")
    args = parser.parse_args(argv)
    if args.one:
        print("NNATLAS-ROW " + json.dumps(one(args.one)), flush=True)
        return 0
    from .. import default_root

    out = args.out or default_root() / OUT
    types = args.types or model_types()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[dict[str, Any]] = []
    kept: dict[str, dict[str, Any]] = {}
    if args.rows is not None and args.rows.exists():
        kept = {r["type"]: r for r in json.loads(args.rows.read_text())}
    if args.types and kept:  # rerun the named types, keep every other row
        types = sorted(set(kept) | set(args.types))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    for t in types:
        if t in kept and t not in args.types:
            rows.append(kept[t])
            continue
        try:
            proc = subprocess.run([sys.executable, "-m", "nnatlas.compiler.draft.sweep", "--one", t], capture_output=True,
                                  text=True, timeout=args.timeout, env=env)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("NNATLAS-ROW ")), None)
            row = json.loads(line[len("NNATLAS-ROW "):]) if line else {
                "type": t, "built": False, "drafted": False, "generate": False, "tests": None, "values": 0, "todos": 0,
                "why": "crashed: " + ((proc.stderr.strip().splitlines() or ["?"])[-1])[:160]}
        except subprocess.TimeoutExpired:
            row = {"type": t, "built": None, "drafted": False, "generate": False, "tests": None, "values": 0,
                   "todos": 0, "why": f"timed out after {args.timeout:.0f} s"}
        rows.append(row)
        print(f"{t}: {row.get('why') or 'ok'}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table(rows, len(types), started), encoding="utf-8")
        if args.rows is not None:
            args.rows.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
