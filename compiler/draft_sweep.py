"""``make draft-sweep``: the drafter on every decoder-only causal-LM model type of transformers.

    python -m nnatlas.compiler.draft_sweep [--out generated/docs/draft_sweep.md] [--timeout 300]
        [--limit N] [--redo failing|all] [TYPE ...]
    python -m nnatlas.compiler.draft_sweep --one TYPE      (one type, in this process; prints JSON)

Each type runs in its own process (one thread, its own process group, killed whole at the
timeout): draft, generate in memory, what ``load(path, draft=True)`` does on a tiny model of the type (draft from
its config, verify on a perturbed tiny twin, refuse what did not verify), and,
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
import re
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


def scored_only(types: list[str], families: Any = None) -> list[str]:
    """A model type of each hand-written family (``families``: the shipped ones) none of whose model types is swept
    (a multimodal wrapper with no causal-LM class, LLaVA's): its row is the draft's score against the hand-written
    spec, not a load."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from . import compile_atlas, default_root

    out = []
    for f in families if families is not None else compile_atlas(default_root() / "specs").families:
        if not set(f.model_types) & set(types):  # (the wrapper's type, listed after its text model's)
            out += [t for t in f.model_types if t in CONFIG_MAPPING_NAMES][-1:]
    return sorted(out)


def hand_family(model_type: str) -> Any:
    """The hand-written family that loads this model type, or None."""
    from . import compile_atlas, default_root

    return next((f for f in compile_atlas(default_root() / "specs").families if model_type in f.model_types), None)


def one(model_type: str, score_only: bool = False) -> dict[str, Any]:
    """Every column of one row, measured in this process: the draft from the default config, compiled and scored against
    the hand-written spec; then what ``load(path, draft=True)`` does on a tiny model of the type (the drafter's tiny
    config, saved as a checkpoint's config): drafted from that config, verified on a perturbed tiny twin, refusing what
    did not verify (a type with a hand-written spec: its draft put first in the lookup, under the spec's name)."""
    import tempfile

    from .draft import DraftError, draft, tiny
    from .draft.check import compare, compile_draft

    row: dict[str, Any] = {**_unmeasured(model_type, ""), "share": None}
    hand = hand_family(model_type)
    if hand is not None:  # no draft compiled finds none of the spec's values
        row.update(share=0.0, hand=hand.name)
    start = time.perf_counter()
    try:
        d = draft(model_type)
    except DraftError as e:
        row["built"] = e.built or ("does not build" not in str(e) and "forward failed" in str(e))
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
    if score_only:  # no causal-LM model type: nothing for load(draft=True) to serve
        row["why"] = f"scored only: drafted through its text model, {d.proposal.model_type}"
        return row
    from .errors import SpecError, UserError
    from .userspec import DraftFailed, draft_verified

    os.environ["NNATLAS_CACHE"] = tempfile.mkdtemp(prefix="nnatlas-sweep-cache-")
    try:
        with tempfile.TemporaryDirectory(prefix="nnatlas-sweep-config-") as tmp:
            from nnatlas import registry

            plan = tiny.plan(model_type)
            params = checkpoint_like(plan)
            row["layout"] = moved(plan.first(), params)
            model = tiny.build(plan, params)
            model.config.save_pretrained(tmp)
            # a type a shipped family loads (by its spec, or as the classes of another type: gpt-sw3 runs GPT-2's):
            # its draft is put first, else the shipped family would be the one verified
            shipped = hand is not None or registry.find(model) is not None
            done = draft_verified(model_type, tmp, budget_s=120.0, first=shipped)
    except DraftFailed as e:
        row["tests"] = False
        row["why"] = "verify: " + (e.failed[0] if e.failed else str(e))[:160]
    except (SpecError, UserError, DraftError) as e:
        row["tests"] = False
        row["why"] = "load(draft=True): " + str(e).splitlines()[-1][:160]
    else:
        row["tests"] = True
        row["passed"] = len(done.held)
        row["refused"] = len(done.refused)
        if done.refused:
            row["why"] = f"served, {len(done.refused)} refused: " + done.refused[0][:120]
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def checkpoint_like(plan: Any) -> dict[str, Any]:
    """The drafter's tiny config with its structural options off their defaults, as released checkpoints have them
    (found by rule, :func:`nnatlas.testing.layouts.structural_options`): a dense-first count of 1 (with a block after
    it), each per-block kind list rotated by one and each period of the stack at 1 set to 2 (:func:`nnatlas.testing.layouts.stack_periods`); the
    tiny config as it is when the class or its model refuses that."""
    import copy

    import torch
    import transformers

    from nnatlas.testing.suite import DENSE_FIRST, stack_periods, structural_options

    params = plan.first()
    cls = getattr(transformers, plan.config_class)
    try:
        found = structural_options(cls(**copy.deepcopy(params)))
    except Exception:  # noqa: BLE001 - the build says why
        return params
    moved = dict(params)
    for k, options in found.items():
        if k in DENSE_FIRST and 1 in options:
            moved[k] = 1
            for name, v in params.items():  # an MLP kind list of one kind given beside it: derived from the count
                if isinstance(v, list) and len(set(map(str, v))) == 1 and re.search(r"mlp|moe|ffn", name):
                    moved.pop(name, None)
        elif isinstance(options[0], list):
            moved[k] = options[-1]
    def builds(laid: dict[str, Any]) -> bool:
        try:
            config = cls(**copy.deepcopy(laid))
            with torch.device("meta"):  # (the model too: Gemma 4's per-layer sizes by block index, rotated with the kinds)
                getattr(transformers, plan.model_class)(config)
        except Exception:  # noqa: BLE001 - a combination the class or its model refuses
            return False
        return True

    if not builds(moved):  # the tiny config's own layout
        return params
    periods = {**moved, **stack_periods(cls(**copy.deepcopy(moved)).to_dict())}
    return periods if builds(periods) else moved  # (periods the class refuses beside the rest: the rest alone)


def moved(first: dict[str, Any], params: dict[str, Any]) -> str:
    """The layout column: the structural options ``checkpoint_like`` moved off the tiny config's (``first``), each
    with its value (one it dropped, derived from another, as ``-``), else ``default``."""
    out = [f"{k}={params[k]!r}" for k in params if k not in first or params[k] != first[k]]
    out += [f"{k}=-" for k in first if k not in params]
    return "; ".join(out).replace("'", "") or "default"


COLUMNS = ("| model type | built | drafted | generate | verified | values | TODO | hand | why not | swept | layout |")
RULE = "|---|---|---|---|---|---|---|---|---|---|---|"
# when the verified column began to load a checkpoint-like layout (before: the class's default layout)
CHECKPOINT_LIKE_SINCE = "12-06 21:40"


def summary(rows: list[dict[str, Any]], total: int, extra: frozenset[str] | set[str] = frozenset()) -> str:
    """The counts over the swept types; the hand-written specs' shares over every row (``extra``: the rows of
    scored_only types)."""
    hand = [r for r in rows if r.get("share") is not None]
    rows = [r for r in rows if r["type"] not in extra]
    done = len(rows)
    built = [r for r in rows if r["built"]]
    passing = [r for r in rows if r["tests"]]
    partly = [r for r in passing if str(r.get("why", "")).startswith("served,")]
    line = (f"{done} of {total} types swept; {len(built)} build; {len(passing)} verified by load(draft=True) on a "
            f"perturbed tiny twin, unedited ({100 * len(passing) / max(len(built), 1):.0f}% of those that build, "
            f"{100 * len(passing) / max(done, 1):.0f}% of all swept; {len(partly)} of them served with some values "
            "refused).")
    laid = [r for r in rows if r.get("layout")]
    if laid:
        off = sum(1 for r in laid if r["layout"] != "default")
        line += (f" Of the {len(laid)} loaded by load(draft=True), {off} were laid out off the drafter's tiny config "
                 f"(dense-first, kind lists, periods), {len(laid) - off} on its own layout (the layout column).")
    if hand:
        mean = sum(r["share"] for r in hand) / len(hand)
        line += (f" {len(hand)} have a hand-written spec: their drafts find {100 * mean:.0f}% of its standard values "
                 f"on average ({sum(1 for r in hand if r['share'] == 1)} all of them).")
    return line


def table(rows: list[dict[str, Any]], total: int, started: str, extra: frozenset[str] | set[str] = frozenset()) -> str:
    def yn(x: Any) -> str:
        return "—" if x is None else ("yes" if x else "no")

    swept = sorted(r["swept"] for r in rows if r.get("swept"))
    when = f"rows swept from {swept[0]} to {swept[-1]} UTC" if swept else f"started {started}"
    lines = [
        "# The drafter on every decoder-only causal-LM model type",
        "",
        "Written by `make draft-sweep` (`python -m nnatlas.compiler.draft_sweep`), not by `nnatlas generate`;",
        f"{when} (last run started {started}). Each type's draft is used unedited: built (the tiny model builds",
        "on CPU and runs a forward), drafted (a spec was written), generate (it compiles), verified (`load(path,",
        "draft=True)` on a tiny model of the type, laid out as a released checkpoint (`checkpoint_like`: a",
        "dense-first count of 1, each per-block kind list rotated by one, each period of the stack at 1 set to 2",
        "(`decoder_sparse_step`, `interleave_moe_layer_step`, `expert_layer_period`: a mixture every other block,",
        "its offset kept under it), where the class has such options and both",
        f"it and its model accept them{_unlaid(rows)}), serves: its draft's oracle and identities held on a perturbed tiny",
        "twin, values that did not refused), values (standard values proposed), TODO (modules it could not map), hand (the share of a",
        "hand-written spec's standard values found at the same hosts with an equal read point; 0% where the",
        "type has a spec and no draft compiled), swept (when the row was measured: a rerun keeps the rows it has),",
        "layout (the options the verified model had off the drafter's tiny config, `default`: none to move, or the",
        "class or its model refuses the moved ones; the drafted column's draft is made on the tiny config's own layout).",
        "",
        summary(rows, total, extra),
        "",
        COLUMNS,
        RULE,
    ]
    main = sorted((r for r in rows if r["type"] not in extra), key=lambda r: r["type"])
    others = sorted((r for r in rows if r["type"] in extra), key=lambda r: r["type"])
    for r in main + others:
        if others and r is others[0]:
            lines += ["", "Hand-written families none of whose model types is a causal-LM one (multimodal wrappers): "
                      "each drafted through its text model and scored against the hand-written spec (not loaded).", "",
                      COLUMNS, RULE]
        share = f"{100 * r['share']:.0f}% ({r.get('hand')})" if r.get("share") is not None else ""
        why = r.get("why", "").replace("|", "\\|")
        lines.append(f"| {r['type']} | {yn(r['built'])} | {yn(r['drafted'])} | {yn(r['generate'] if r['drafted'] else None)} "
                     f"| {yn(r['tests'])} | {r['values'] or ''} | {r['todos'] or ''} | {share} | {why} | {r.get('swept', '')} "
                     f"| {r.get('layout', '')} |")
    return "\n".join(lines) + "\n"


def _unlaid(rows: list[dict[str, Any]]) -> str:
    """What the header says of verified rows that record no layout (swept before the column was), if any."""
    old = [r for r in rows if r.get("tests") is not None and not r.get("layout") and r.get("swept")]
    if not old:
        return ""
    before = sum(1 for r in old if r["swept"] < CHECKPOINT_LIKE_SINCE)
    return (f"; {len(old)} rows record no layout, swept before it was recorded, {before} of them before "
            f"{CHECKPOINT_LIKE_SINCE}, on the class's default layout")


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
        if len(cells) > 10 and cells[10]:
            row["layout"] = cells[10]
        rows.append(row)
    return rows


def _warm() -> None:
    """What every type's row imports, imported once in the sweep's process, before it forks one child per type."""
    import torch

    torch.set_num_threads(1)
    from nnatlas.compiler import userspec  # noqa: F401

    from .draft import check, matcher, recorder, tiny, writer  # noqa: F401


def _unmeasured(t: str, why: str, built: bool | None = False) -> dict[str, Any]:
    """The row of a type whose child process gave none (it crashed, or ran out of time: built None, not known)."""
    return {"type": t, "built": built, "drafted": False, "generate": False, "tests": None, "values": 0, "todos": 0,
            "why": why}


def sweep_forked(t: str, timeout: float, score_only: bool = False) -> dict[str, Any]:
    """One type's row, measured in a child forked from this process (the imports done once; a session of its own,
    killed whole at the timeout)."""
    import select
    import signal

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, write the row, leave without running the parent's exit handlers
        os.close(r)
        os.setsid()
        try:
            data = json.dumps(one(t, score_only))
        except BaseException as e:  # noqa: BLE001 - a crash is the row's finding
            data = json.dumps(_unmeasured(t, f"crashed: {type(e).__name__}: {e}"[:160]))
        os.write(w, data.encode())
        os._exit(0)
    os.close(w)
    chunks: list[bytes] = []
    end = time.monotonic() + timeout
    timed_out = False
    while True:
        left = end - time.monotonic()
        ready, _, _ = select.select([r], [], [], max(left, 0))
        if not ready:
            timed_out = True
            break
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return _unmeasured(t, f"timed out after {timeout:.0f} s", built=None)
    try:
        return json.loads(b"".join(chunks).decode())  # type: ignore[no-any-return]
    except ValueError:
        return _unmeasured(t, f"crashed (status {status})")


def sweep_one(t: str, timeout: float, score_only: bool = False) -> dict[str, Any]:
    """One type's row, measured in a process of its own (a process group, killed whole at the timeout)."""
    import signal

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "nnatlas.compiler.draft_sweep", "--one", t,
                             *(["--score-only"] if score_only else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return _unmeasured(t, f"timed out after {timeout:.0f} s", built=None)
    line = next((x for x in out.splitlines() if x.startswith("NNATLAS-ROW ")), None)
    if line:
        return json.loads(line[len("NNATLAS-ROW "):])  # type: ignore[no-any-return]
    return _unmeasured(t, f"crashed (exit {proc.returncode}): " + ((err.strip().splitlines() or ["?"])[-1])[:160])


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
    parser = argparse.ArgumentParser(prog="python -m nnatlas.compiler.draft_sweep")
    parser.add_argument("types", nargs="*", help="model types to sweep again (the table's other rows are kept)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per model type")
    parser.add_argument("--limit", type=int, default=None, help="sweep at most this many types, then stop")
    parser.add_argument("--redo", choices=("failing", "all"), default=None,
                        help="sweep again every row that does not pass (failing) or every row (all)")
    parser.add_argument("--fresh", action="store_true", help="start a new table (the rows there are dropped)")
    parser.add_argument("--one", default=None, help="run one type in this process and print its row as JSON")
    parser.add_argument("--fork", action="store_true",
                        help="import once, then fork a child per type (faster; POSIX only)")
    parser.add_argument("--score-only", action="store_true", help="with --one: the draft's hand score only")
    args = parser.parse_args(argv)
    if args.one:
        print("NNATLAS-ROW " + json.dumps(one(args.one, args.score_only)), flush=True)
        return 0
    from . import default_root

    out = args.out or default_root() / OUT
    types = model_types()
    extra = scored_only(types)
    swept = types + extra
    unknown = [t for t in args.types if t not in swept]
    if unknown:
        parser.error(f"not decoder-only causal-LM model types: {', '.join(unknown)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kept: dict[str, dict[str, Any]] = {}
    if out.exists() and not args.fresh:
        kept = {r["type"]: r for r in read_table(out.read_text(encoding="utf-8")) if r["type"] in swept}
    from . import compile_atlas

    hand = {t for f in compile_atlas(default_root() / "specs").families for t in f.model_types}
    todo = order(swept, kept, args.types, args.redo, hand)[:args.limit]
    print(f"{len(kept)} rows kept; sweeping {len(todo)}: {' '.join(todo)}", flush=True)
    if args.fork:
        _warm()
    for t in todo:
        row = sweep_forked(t, args.timeout, t in extra) if args.fork else sweep_one(t, args.timeout, t in extra)
        row["swept"] = time.strftime("%m-%d %H:%M", time.gmtime())
        kept[t] = row
        print(f"{t}: {row.get('why') or 'ok'}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table(list(kept.values()), len(types), started, set(extra)), encoding="utf-8")
    print(summary(list(kept.values()), len(types), set(extra)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
