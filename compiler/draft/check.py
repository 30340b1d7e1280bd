"""What a draft is worth: does it compile (``generate`` in memory, in a temporary copy of the
spec folder), do its generated tests pass (pytest on the rendered files in a temporary folder),
and which of a hand-written spec's standard values does it find at the same hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import compile_atlas, default_root
from ..emit import emit
from ..errors import SpecError
from ..language.ir import Atlas, FamilyIR

# the generated tests import nnatlas.families.<family>: this conftest puts the rendered adapter there
CONFTEST = '''\
import importlib.util

from hypothesis import Phase, settings

from nnatlas import registry

# a draft's tests say pass or fail: no shrinking of a failing example (it can take minutes)
settings.register_profile("nnatlas-draft", phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile("nnatlas-draft")

spec = importlib.util.spec_from_file_location("nnatlas.families.{family}", r"{adapter}")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
# the draft first: a hand-written family of the same model type must not be picked instead
registry.put_first(module)
'''


@dataclass
class Compiled:
    atlas: Atlas | None
    family: FamilyIR | None
    error: str = ""


def compile_draft(text: str, family: str, specs: Path | None = None, extends: list[str] | None = None) -> Compiled:
    """Compile the draft beside the shared vocabulary and notes (and the specs it extends)."""
    specs = specs or default_root() / "specs"
    with tempfile.TemporaryDirectory(prefix="nnatlas-draft-") as tmp:
        d = Path(tmp) / "specs"
        d.mkdir()
        for f in specs.glob("_*.yaml"):
            shutil.copy(f, d / f.name)
        todo = list(extends or [])
        while todo:
            base = todo.pop()
            src = specs / f"{base}.yaml"
            if src.exists() and not (d / src.name).exists():
                shutil.copy(src, d / src.name)
                import yaml

                ext = (yaml.safe_load(src.read_text()) or {}).get("extends") or []
                todo.extend([ext] if isinstance(ext, str) else ext)
        (d / f"{family}.yaml").write_text(text, encoding="utf-8")
        try:
            atlas = compile_atlas(d, Path(tmp))
        except SpecError as e:
            return Compiled(None, None, str(e))
    fam = next((f for f in atlas.families if f.name == family), None)
    return Compiled(atlas, fam)


@dataclass
class TestRun:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    output: str = ""
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0 and self.passed > 0


def run_tests(family: FamilyIR, timeout: float = 900, keep: Path | None = None, fail_fast: bool = False,
              in_process: bool = False) -> TestRun:
    """Render the draft's adapter and tests into a temporary folder and run pytest there (in a
    subprocess, or ``in_process`` in this one: only for a process that drafts one family and ends)."""
    with tempfile.TemporaryDirectory(prefix="nnatlas-draft-tests-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        adapter = root / f"_draft_{family.name}.py"
        adapter.write_text(emit.render_family(family), encoding="utf-8")
        (root / "conftest.py").write_text(CONFTEST.format(family=family.name, adapter=adapter), encoding="utf-8")
        test = root / f"test_{family.name}.py"
        test.write_text(emit.render_tests(family), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), str(test)]
        if fail_fast:
            cmd.insert(3, "-x")
        if in_process:  # a process of its own already (the sweep's): spare a second interpreter's imports
            return parse_summary(_pytest_here(cmd[3:], root))
        try:
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
            out = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return TestRun(0, 0, 1, out + f"\n(timed out after {timeout:.0f} s)", ["timeout"])
    return parse_summary(out)


def _pytest_here(args: list[str], root: Path) -> str:
    import contextlib
    import io

    import pytest

    buf = io.StringIO()
    cwd = os.getcwd()
    sys.path.insert(0, str(root))
    try:
        os.chdir(root)
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            pytest.main(args)
    finally:
        os.chdir(cwd)
        sys.path.remove(str(root))
    return buf.getvalue()


def parse_summary(out: str) -> TestRun:
    import re

    run = TestRun(output=out)
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    for n, what in re.findall(r"(\d+) (passed|failed|errors?)", tail):
        if what == "passed":
            run.passed = int(n)
        elif what == "failed":
            run.failed = int(n)
        else:
            run.errors = int(n)
    run.failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    if not run.passed and not run.failed and not run.errors:
        run.errors = 1
    return run


@dataclass
class Comparison:
    """A draft's standard values against a hand-written family's, host by host."""

    matched: dict[str, list[str]]  # host -> values at the same host with an equal or equivalent read point
    differ: dict[str, list[tuple[str, str, str]]]  # host -> (value, hand-written read, drafted read)
    missing: dict[str, list[str]]  # host -> values the hand-written spec has and the draft does not
    extra: dict[str, list[str]]  # host -> values the draft has and the hand-written spec does not

    @property
    def share(self) -> float:
        total = sum(len(v) for v in self.matched.values()) + sum(len(v) for v in self.differ.values()) + \
            sum(len(v) for v in self.missing.values())
        return sum(len(v) for v in self.matched.values()) / total if total else 0.0


def _all_reads(f: FamilyIR, rename: dict[str, tuple[str, ...]]) -> dict[str, dict[str, list[str]]]:
    """Each value's reads at each host path (the vision encoder's aside), over all of the path's kinds."""
    out: dict[str, dict[str, list[str]]] = {}
    for h in f.hosts:
        if h.path.startswith("vision"):
            continue
        vals = out.setdefault(h.path, {})
        for v in h.values:
            vals.setdefault(v.name, []).append(_canonical(v, h.path, rename))
    return out


def _reads(f: FamilyIR, rename: dict[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
    """Each value's read at each host path (the last kind's, where kinds read it two ways)."""
    return {path: {name: reads[-1] for name, reads in vals.items()} for path, vals in _all_reads(f, rename).items()}


def _canonical(v: object, host: str, rename: dict[str, tuple[str, ...]]) -> str:
    """A read point with every standard child name replaced by the native one, and its view."""
    read = getattr(v, "read", None)
    if read is None:
        if getattr(v, "missing", None):
            return "missing"
        return f"derived:{getattr(v, 'derived_text', '')}"
    text = read.text
    first = text.split(">")[0].strip().split(".")[0]
    full = f"{host}.{first}" if host != "model" else first
    native = rename.get(full)
    if native and not text.startswith(("call:", "op:", "fn:", "method:", "input", "output")):
        text = native[0].split(".")[-1] + text[len(first):]
    view = getattr(v, "view_text", None) or getattr(v, "view", None) or ""
    return f"{text} | {view}" if view else text


def compare(draft: FamilyIR, hand: FamilyIR) -> Comparison:
    """The draft's reads against the hand spec's, value by value. Where the hand spec's kinds read one value two ways
    at one host path (a mixture's mlp_activation missing, a dense block's act_fn.output), the draft matches either:
    it is drafted on one layout, which may have one of those kinds only."""
    dr, hr = _reads(draft, dict(draft.rename)), _all_reads(hand, dict(hand.rename))
    matched: dict[str, list[str]] = {}
    differ: dict[str, list[tuple[str, str, str]]] = {}
    missing: dict[str, list[str]] = {}
    extra: dict[str, list[str]] = {}
    for host, vals in hr.items():
        got = dr.get(host, {})
        for name, reads in vals.items():
            if name not in got:
                missing.setdefault(host, []).append(name)
            elif any(got[name] == r or _equivalent(r, got[name]) for r in reads):
                matched.setdefault(host, []).append(name)
            else:
                differ.setdefault(host, []).append((name, reads[-1], got[name]))
        for name in got:
            if name not in vals:
                extra.setdefault(host, []).append(name)
    for host, drafted in dr.items():
        if host not in hr:
            extra.setdefault(host, []).extend(drafted)
    return Comparison(matched, differ, missing, extra)


def _equivalent(a: str, b: str) -> bool:
    """Read points that serve the same tensor: a module's ``output`` and ``output[0]`` of the same
    call when one side returns a tensor (the layer's boundary), nothing else."""
    strip = {a.replace("output[0]", "output"), b.replace("output[0]", "output")}
    return len(strip) == 1
