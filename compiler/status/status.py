"""The status of every family: what the last ``make status`` run of the generated tests found.

``nnatlas status`` (``make status``) runs every family's generated tests once per transformers
version listed in pyproject.toml (``[tool.nnatlas] status-transformers``; the first is the pinned
one CI uses), each in its own venv under ``.venv-status/<version>/``, with the pytest plugin
``compiler/status/status_plugin.py`` recording each test's outcome. It folds those outcomes into
``generated/docs/status.json``: per family, the values it serves, its identities, its oracle
checks and the attention loads its tests ran, with pass/fail per version. Only ``nnatlas status``
writes that file (it is committed): ``nnatlas generate`` reads it to render ``status.html`` and
the index's status row, so ``generate --check`` stays a function of committed files. A family the
run did not see reads "not run"; one whose spec or generated tests changed since, "stale".

``nnatlas status --tp`` (also run by ``make status``) records the tensor-parallel column: the TP oracle
(``nnatlas.testing.tp_oracle``, under torchrun, 2 gloo processes) over every family, with this checkout's own
interpreter and its transformers only (``status.json``'s ``tp``: the version, and per family under ``families``: pass
with the largest difference, refused with the runtime's reason, or fail with the error).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..language.ir import Atlas, FamilyIR
from ..resolve.resolve import resolve

PATH = "generated/docs/status.json"
VENVS = ".venv-status"
GROUPS = ("values", "identities", "oracle", "loads", "notes")
_GROUP_OF = {"test_oracle": "oracle", "test_identity": "identities", "test_image_text_identity": "identities",
             "test_identities": "identities", "test_image_text_identities": "identities",
             "test_attention_loads_match_the_class": "loads", "test_support_agrees_with_trace": "loads",
             "test_support_agrees_with_trace_experts": "loads", "test_image_text_support_agrees_with_trace": "loads",
             "test_note_example": "notes"}
_NODE = re.compile(r"^generated/tests/test_(?P<family>\w+)\.py(?:::(?P<fn>\w+)(?:\[(?P<param>.*)\])?)?$")
# what the generated tests import beside nnatlas itself (the project's own dependencies are read from pyproject)
TEST_REQUIREMENTS = ("pytest", "hypothesis", "pillow")


def versions(root: Path) -> list[str]:
    """The transformers versions ``make status`` runs, the pinned one first (pyproject.toml)."""
    data = tomllib.loads((root / "pyproject.toml").read_text())
    found = data.get("tool", {}).get("nnatlas", {}).get("status-transformers")
    if not found or not all(isinstance(v, str) for v in found):
        raise UserError("nnatlas: pyproject.toml has no [tool.nnatlas] status-transformers list of versions")
    return list(found)


def pinned(root: Path, package: str) -> str:
    """``package==X`` as constraints.txt pins it (the version CI and ``make`` install)."""
    path = root / "constraints.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        name = re.split(r"[<>=!~\[ ;]", line.strip(), maxsplit=1)[0]
        if name.lower() == package.lower() and "==" in line:
            return line.split("#", 1)[0].strip()
    raise UserError(f"nnatlas: {path} pins no {package}== version")


def read(root: Path) -> dict[str, Any] | None:
    """The committed status (``generated/docs/status.json``), or None before the first run."""
    path = root / PATH
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _node(nodeid: str) -> tuple[str, str, str] | None:
    found = _NODE.match(nodeid)
    if not found:
        return None
    return found.group("family"), found.group("fn") or "", found.group("param") or ""


def fold(atlas: Atlas, runs: list[tuple[str, Mapping[str, Any] | None, str | None]]) -> dict[str, Any]:
    """status.json from each version's record (the plugin's file; None with why it did not run)."""
    out_versions = []
    families: dict[str, dict[str, Any]] = {}
    for f in atlas.families:
        families[f.name] = {"title": f.title, "spec_sha256": f.sha256, "values": _values(f),
                            "identities": sum(len(h.identities) for h in f.hosts), "oracle_checks": [],
                            "loads": [], "runs": {}}
    for version, record, why in runs:
        entry: dict[str, Any] = {"transformers": version}
        if record is None:
            entry.update(ran=False, why=why or "did not run")
            out_versions.append(entry)
            continue
        tests: Mapping[str, str] = record.get("tests", {})
        entry.update(ran=True, torch=record.get("torch"), python=record.get("python"), date=record.get("date"),
                     passed=sum(1 for o in tests.values() if o == "passed"),
                     failed=sum(1 for o in tests.values() if o == "failed"),
                     collection_errors=len(record.get("errors", {})))
        if record.get("transformers") != version:
            entry["installed"] = record.get("transformers")
        out_versions.append(entry)
        by_family = _by_family(tests)
        errors: dict[str, str] = {}
        for nodeid, msg in record.get("errors", {}).items():
            node = _node(nodeid)
            if node is not None:
                errors[node[0]] = msg
        for name, fam in families.items():
            fam["runs"][version] = _family_run(by_family.get(name, []), errors.get(name),
                                               record.get("specs", {}).get(name), fam["spec_sha256"])
            if name in record.get("test_files", {}):
                fam["runs"][version].update(tests_sha256=record["test_files"][name], date=record.get("date"))
            if version == runs[0][0] and name in by_family:  # the pinned run says which checks and loads exist
                fam["oracle_checks"] = sorted(p for fn, p, _ in by_family[name] if fn == "test_oracle")
                fam["loads"] = sorted(p for fn, p, _ in by_family[name] if fn == "test_support_agrees_with_trace")
    return {"about": "Written by `make status` (nnatlas status): the generated tests of every family, run once "
                     "per transformers version in pyproject.toml's [tool.nnatlas] status-transformers; the first "
                     "is the pinned version CI uses.",
            "pinned": runs[0][0] if runs else None, "versions": out_versions, "families": families}


def _values(f: FamilyIR) -> int:
    return len({(h.path, v.name) for h in f.hosts for v in h.values if v.missing is None})


def _by_family(tests: Mapping[str, str]) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for nodeid, outcome in tests.items():
        node = _node(nodeid)
        if node is not None and node[1]:
            out.setdefault(node[0], []).append((node[1], node[2], outcome))
    return out


def _family_run(tests: list[tuple[str, str, str]], error: str | None, ran_sha: str | None, sha: str) -> dict[str, Any]:
    groups = {g: [0, 0] for g in GROUPS}
    failed = []
    for fn, param, outcome in tests:
        counts = groups[_GROUP_OF.get(fn, "values")]
        counts[1] += 1
        if outcome == "passed":
            counts[0] += 1
        elif outcome == "failed":
            failed.append(f"{fn}[{param}]" if param else fn)
    if error is not None:
        result = "error"
    elif not tests:
        result = "not run"
    else:
        result = "fail" if failed else "pass"
    run: dict[str, Any] = {"result": result, "passed": sum(g[0] for g in groups.values()),
                           "total": sum(g[1] for g in groups.values()), "groups": groups, "failed": failed[:20]}
    if error is not None:
        run["error"] = error
    if len(failed) > 20:
        run["more_failed"] = len(failed) - 20
    oracle = {p: o for fn, p, o in tests if fn == "test_oracle"}
    loads = {p: o for fn, p, o in tests if fn == "test_support_agrees_with_trace"}
    if oracle:
        run["oracle"] = oracle
    if loads:
        run["loads"] = loads
    if ran_sha is not None:
        run["spec_sha256"] = ran_sha
    return run


def merge(previous: Mapping[str, Any] | None, new: dict[str, Any], ran: Iterable[str],
          order: Iterable[str] | None = None) -> dict[str, Any]:
    """``new`` (a run of the families in ``ran`` only, under some versions) with everything else kept
    from ``previous``: the other families' runs, and every version the run did not reach (``order``:
    every version, the pinned one first; default the run's own). Each version's counts are then the
    sums over the families' runs, and its date the newest one's."""
    ran = set(ran)
    old_families = (previous or {}).get("families", {})
    old_versions = {v["transformers"]: v for v in (previous or {}).get("versions", [])}
    new_versions = {v["transformers"]: v for v in new["versions"]}
    order = list(order) if order is not None else list(new_versions)
    ran_now = {v for v, entry in new_versions.items() if entry.get("ran")}
    if (previous or {}).get("tp") and "tp" not in new:  # the tensor-parallel column is run on its own (run_tp)
        new["tp"] = previous["tp"]  # type: ignore[index]
    for name, fam in new["families"].items():
        old = old_families.get(name) or {}
        for version in order:
            if (version not in ran_now or name not in ran) and version in old.get("runs", {}):
                fam["runs"][version] = old["runs"][version]
        if name not in ran and old:
            fam["oracle_checks"], fam["loads"] = old.get("oracle_checks", []), old.get("loads", [])
    out_versions = []
    for version in order:
        entry = dict(new_versions.get(version) or {"transformers": version, "ran": False, "why": "not run yet"})
        runs = [f["runs"][version] for f in new["families"].values() if f["runs"].get(version, {}).get("total")]
        if not entry.get("ran"):
            if version in old_versions and runs:  # this version did not run now: keep what it said before
                entry = dict(old_versions[version])
            out_versions.append(entry)
            continue
        entry["passed"] = sum(r["passed"] for r in runs)
        entry["failed"] = sum(len(r["failed"]) + r.get("more_failed", 0) for r in runs)
        entry["collection_errors"] = sum(1 for r in runs if r["result"] == "error")
        entry["date"] = max([entry.get("date") or "", *(r.get("date") or "" for r in runs)])
        out_versions.append(entry)
    new["versions"], new["pinned"] = out_versions, order[0] if order else new.get("pinned")
    return new


def stale(atlas: Atlas, status: Mapping[str, Any] | None, root: Path, version: str) -> list[str]:
    """The families whose last run under ``version`` is missing, or saw another spec or other tests
    than the ones now in ``root`` (what ``nnatlas status --stale`` reruns)."""
    out = []
    for f in atlas.families:
        run = (status or {}).get("families", {}).get(f.name, {}).get("runs", {}).get(version) or {}
        path = root / "generated" / "tests" / f"test_{f.name}.py"
        tests = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if (run.get("result") in (None, "not run") or run.get("spec_sha256") != f.sha256
                or run.get("tests_sha256") != tests):
            out.append(f.name)
    return out


def dumps(status: Mapping[str, Any]) -> str:
    return json.dumps(status, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


# ---- the page: status.json seen from the current specs ---------------------------------------

_EMPTY_CELL: dict[str, Any] = {"result": "not run", "passed": 0, "total": 0, "groups": {}, "failed": [], "error": "",
                               "oracle": {}, "loads": {}}


def tests_digest(text: str) -> str:
    """The digest a run records of a family's generated tests file (``stale`` hashes the file's bytes)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def page_rows(atlas: Atlas, status: Mapping[str, Any] | None, tests: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What status.html and the index show: one row per family of the atlas, one column per version;
    ``tests``: family → the digest of its generated tests as rendered now (``tests_digest``)."""
    rows = [row(f, status, (tests or {}).get(f.name)) for f in atlas.families]
    stale = sum(1 for r in rows if r["pinned"]["stale"])
    return {"status": status, "versions": (status or {}).get("versions", []), "rows": rows, "stale_count": stale,
            "tp": (status or {}).get("tp")}


STALE_WHY = {(True, False): "the spec changed since the run",
             (False, True): "the generated tests changed since the run (the compiler or its templates did; the spec did not)",
             (True, True): "the spec and the generated tests changed since the run"}


def row(f: FamilyIR, status: Mapping[str, Any] | None, tests: str | None = None) -> dict[str, Any]:
    """One family's status: what it serves and checks, and a cell per version of the last run
    (``pinned``: the first version's, which the family page's badge shows). A cell is stale when the
    run saw another spec, or (``tests``: the digest of the family's generated tests now) other tests:
    the families ``nnatlas status --stale`` reruns, less those the run did not see."""
    versions = [v["transformers"] for v in (status or {}).get("versions", [])]
    fam = (status or {}).get("families", {}).get(f.name)
    cells = []
    for v in versions:
        run = (fam or {}).get("runs", {}).get(v) or {}
        why = (run.get("spec_sha256") not in (None, f.sha256),
               tests is not None and run.get("tests_sha256") not in (None, tests))
        cells.append({**_EMPTY_CELL, **run, "version": v, "stale": any(why), "stale_why": STALE_WHY.get(why, "")})
    tp = ((status or {}).get("tp") or {}).get("families", {}).get(f.name)
    if tp is not None:
        tp = {**tp, "stale": tp.get("spec_sha256") not in (None, f.sha256)}
    return {"family": f.name, "title": f.title, "seen": fam is not None, "values_served": _values(f), "tp": tp,
            "identities": sum(len(h.identities) for h in f.hosts),
            "oracle_checks": (fam or {}).get("oracle_checks", []), "loads": (fam or {}).get("loads", []),
            "cells": cells, "pinned": cells[0] if cells else {**_EMPTY_CELL, "version": None, "stale": False, "stale_why": ""}}


CARRIED = "generated/families/version_status.json"  # shipped in the wheel as nnatlas.families' package data


def carried(atlas: Atlas, status: Mapping[str, Any] | None, tests: Mapping[str, str] | None = None) -> str:
    """What the runtime carries of status.json (``nnatlas.version_status`` reads it at load): per family, the
    result of each version's last run, marked ``stale`` where that run saw another spec or other generated tests
    of the family (a stale failure warns, saying so, and never refuses; a missing run says nothing)."""
    versions = [v["transformers"] for v in (status or {}).get("versions", [])]
    families: dict[str, dict[str, Any]] = {}
    for f in atlas.families:
        cells = {c["version"]: {"result": c["result"], "passed": c["passed"], "total": c["total"],
                                **({"stale": True} if c["stale"] else {})}
                 for c in row(f, status, (tests or {}).get(f.name))["cells"]
                 if c["result"] in ("pass", "fail")}
        if cells:
            families[f.name] = cells
    digest = hashlib.sha256(json.dumps(status or {}, sort_keys=True).encode()).hexdigest()
    data = {"about": f"Generated by nnatlas from generated/docs/status.json (its data's sha256 {digest}): per family "
                     "and transformers version, the result of its generated tests, stale where they changed since "
                     "(nnatlas.loading.version_status warns or refuses from it). Do not edit: run `make status`, "
                     "then `make generate`.",
            "versions": versions, "families": families}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


# ---- the run ---------------------------------------------------------------------------------

def run(root: Path, chosen: Iterable[str] | None = None, timeout: float = 3600.0,
        families: Iterable[str] | None = None) -> dict[str, Any]:
    """Run every family's generated tests (or only ``families``'s, keeping the others' last runs
    from the committed status.json) under each transformers version, write status.json.

    The tests run in a snapshot of the checkout (``.venv-status/checkout``: the files git tracks or
    would track, as they are now), with nnatlas installed from it into each version's venv, so the
    run sees one state of the specs however long it takes and whatever is edited meanwhile."""
    wanted = list(chosen) if chosen is not None else versions(root)
    snapshot = _snapshot(root, root / VENVS / "checkout")
    atlas = resolve(snapshot / "specs", snapshot)
    names = [f.name for f in atlas.families]
    picked = names if families is None else list(families)
    unknown = sorted(set(picked) - set(names))
    if unknown:
        raise UserError(f"nnatlas status: no family {', '.join(unknown)} (families: {', '.join(names)})")
    if not picked:
        return read(root) or fold(atlas, [])
    targets = ["generated/tests"] if families is None else [f"generated/tests/test_{f}.py" for f in picked]
    runs: list[tuple[str, Mapping[str, Any] | None, str | None]] = []
    for version in wanted:
        venv = root / VENVS / version
        try:
            python = _venv(root, venv, version)
            _run_step([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                       "--force-reinstall", str(snapshot)])
        except subprocess.CalledProcessError as e:
            runs.append((version, None, f"could not install: {_last_line(e.stderr or e.stdout)}"))
            continue
        record = venv / "status-run.json"
        record.unlink(missing_ok=True)
        print(f"nnatlas status: transformers {version}: running generated/tests", file=sys.stderr, flush=True)
        proc = subprocess.run([str(python), "-m", "pytest", *targets, "-p", "nnatlas.compiler.status.status_plugin",
                               f"--nnatlas-status={record}", "-q", "--no-header", "-rN",
                               "--continue-on-collection-errors"],
                              cwd=snapshot, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=timeout)
        if record.is_file():
            runs.append((version, json.loads(record.read_text()), None))
        else:
            runs.append((version, None, f"pytest wrote no record: {_last_line(proc.stdout + proc.stderr)}"))
        print(f"nnatlas status: transformers {version}: {_last_line(proc.stdout)}", file=sys.stderr, flush=True)
    status = merge(read(root), fold(atlas, runs), picked, versions(root))
    (root / PATH).write_text(dumps(status), encoding="utf-8")
    return status


def _snapshot(root: Path, into: Path) -> Path:
    """A copy of the checkout's files (tracked, or untracked and not ignored) in ``into``, afresh."""
    import shutil

    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    if into.exists():
        shutil.rmtree(into)
    for rel in filter(None, listed):
        src = root / rel
        if src.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / rel)
    return into


def _run_step(step: list[str]) -> None:
    print(f"nnatlas status: {' '.join(step[-3:])}", file=sys.stderr, flush=True)
    subprocess.run(step, check=True, capture_output=True, text=True)


def _last_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _venv(root: Path, venv: Path, version: str) -> Path:
    """``.venv-status/<version>``: torch, that transformers, the project's other dependencies and the
    tests' own (made once, then reused; nnatlas itself is installed from the snapshot on each run)."""
    python = venv / "bin" / "python"
    stamp = venv / ".nnatlas-status-installed"
    if stamp.is_file():
        return python
    data = tomllib.loads((root / "pyproject.toml").read_text())
    deps = [d for d in data["project"]["dependencies"] if not d.startswith("transformers")]
    tests = [d for d in data["project"]["optional-dependencies"]["test"]
             if re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0] in TEST_REQUIREMENTS]
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", pinned(root, "torch")],
             [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"transformers=={version}",
              *deps, *tests]]
    for step in steps:
        _run_step(step)
    stamp.write_text(version + "\n")
    return python


# ---- the tensor-parallel column ---------------------------------------------------------------

TP_RANKS = 2


def run_tp(root: Path, families: Iterable[str] | None = None, timeout: float = 7200.0) -> dict[str, Any]:
    """The TP oracle over every family (or ``families``), with this interpreter (the checkout's venv, its
    transformers): one torchrun launch of ``nnatlas.testing.tp_oracle`` (2 gloo processes), then one launch per
    family it did not report (a launch that died); folded into status.json's ``tp`` and each family's ``tp``."""
    import importlib.metadata
    import tempfile
    import time

    atlas = resolve(root / "specs", root)
    names = [f.name for f in atlas.families]
    picked = names if families is None else list(families)
    unknown = sorted(set(picked) - set(names))
    if unknown:
        raise UserError(f"nnatlas status: no family {', '.join(unknown)} (families: {', '.join(names)})")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        raise UserError(f"nnatlas status --tp: no torchrun beside {sys.executable} (torch's launcher)")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nnatlas-tp-") as tmp:
        batches = [picked] if picked else []
        while batches:
            batch = batches.pop(0)
            print(f"nnatlas status --tp: {len(batch)} families under torchrun ({TP_RANKS} gloo processes)",
                  file=sys.stderr, flush=True)
            out = Path(tmp) / f"run{len(report)}"
            out.mkdir()
            said = _tp_launch(torchrun, batch, out, min(timeout, 120.0 + 180.0 * len(batch)))
            got = {f: r for f, r in said.items() if f in batch}
            report.update(got)
            missing = [f for f in batch if f not in got]
            if missing and len(batch) > 1:  # the launch died: each family it left, on its own
                batches.extend([f] for f in missing)
            elif missing:
                report[batch[0]] = {"error": said.get("_launch", "the launch ended without a report")}
    status = read(root) or fold(atlas, [])
    cells = dict((status.get("tp") or {}).get("families", {}))  # (the families not run now keep their cells)
    for f in atlas.families:
        if f.name in report:
            cells[f.name] = {**_tp_entry(report[f.name]), "spec_sha256": f.sha256}
    status["tp"] = {"transformers": importlib.metadata.version("transformers"),
                    "torch": importlib.metadata.version("torch"), "python": sys.version.split()[0],
                    "date": time.strftime("%Y-%m-%d", time.gmtime()), "ranks": TP_RANKS, "backend": "gloo",
                    "about": "the TP oracle (nnatlas.testing.tp_oracle): every served value, an edit, generate "
                             "with per-step edits, model.cache and the gradients under tensor parallel against one "
                             "process, run by `nnatlas status --tp` with the checkout's own transformers",
                    "families": {n: cells[n] for n in names if n in cells}}
    (root / PATH).write_text(dumps(status), encoding="utf-8")
    return status


def _tp_launch(torchrun: Path, families: list[str], out: Path, timeout: float) -> dict[str, Any]:
    """One torchrun launch of the oracle: its report (``_launch``: why there is none)."""
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(TP_RANKS), "-m", "nnatlas.testing.tp_oracle",
           ",".join(families), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"_launch": f"the launch took more than {timeout:.0f} s"}
    path = out / "tp_oracle.json"
    if path.is_file():
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    return {"_launch": f"the launch ended without a report: {_last_line(proc.stderr)}"}


def _tp_entry(r: Mapping[str, Any]) -> dict[str, Any]:
    """A family's TP cell from the oracle's report of it."""
    if "refused" in r:
        return {"result": "refused", "why": str(r["refused"])[:400]}
    if "error" in r:
        return {"result": "fail", "error": str(r["error"])[:400]}
    diffs = [r.get(k) for k in ("max_value_diff", "max_edit_logit_diff", "max_generate_diff", "max_cache_diff")]
    grad = r.get("max_grad_diff")
    entry: dict[str, Any] = {"result": "pass", "values": r.get("values"),
                             "max_diff": max((float(d) for d in diffs if isinstance(d, int | float)), default=0.0),
                             "sharded_values": len(r.get("sharded_values", [])), "edits": r.get("edits", []),
                             "seconds": r.get("seconds")}
    if isinstance(grad, int | float):
        entry["max_grad_diff"] = float(grad)
    elif grad is not None:
        entry["grad"] = str(grad)[:200]
    return entry
