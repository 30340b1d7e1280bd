"""Whatever a spec says, the compiler answers with a result or a SpecError, nothing else."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnatlas.compiler import SpecError, compile_atlas

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(p.name for p in (ROOT / "specs").glob("*.yaml"))
TOKENS = [":", "-", "- ", "[", "]", "{", "}", "&a ", "*a", "\t", "{{ x }}", "'", '"', "\\", "#", "!!python/object:os.system ",
          "null", "~", "0", "-1", "1e309", "true", "<<: {}", "\n", "  ", "call:attention", "op:softmax.input[0]", ">"]
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def check(name: str, text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        shutil.copytree(ROOT / "specs", root / "specs")
        (root / "specs" / name).write_text(text)
        try:
            compile_atlas(root / "specs", root)
        except SpecError as e:
            assert e.problems, "a SpecError lists its problems"
            for p in e.problems:
                assert p.file.startswith("specs/") and p.line >= 1 and p.col >= 1 and p.message


@SETTINGS
@given(st.sampled_from(SPECS), st.data())
def test_textual_mutations(name: str, data: st.DataObject) -> None:
    lines = (ROOT / "specs" / name).read_text().splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        kind = data.draw(st.sampled_from(["delete", "duplicate", "insert", "truncate", "indent"]))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "insert":
            pos = data.draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + data.draw(st.sampled_from(TOKENS)) + lines[i][pos:]
        elif kind == "truncate":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))] + "\n"
        else:
            lines[i] = "  " + lines[i]
        if not lines:
            lines = ["\n"]
    check(name, "".join(lines))


def _paths(node: object, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=12),
                st.lists(st.text(max_size=4), max_size=2), st.dictionaries(st.text(max_size=6), st.integers(), max_size=2))


@SETTINGS
@given(st.sampled_from(SPECS), st.data())
def test_structural_mutations(name: str, data: st.DataObject) -> None:
    doc = yaml.safe_load((ROOT / "specs" / name).read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(ODD)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    check(name, yaml.safe_dump(doc, sort_keys=False))
