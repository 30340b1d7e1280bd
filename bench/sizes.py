"""The largest hand-written modules and classes: ``python -m bench.sizes [N]``.

Lines are counted as they stand in the file (blank lines and comments included), over the packages
people edit (``runtime/``, ``compiler/``, ``bench/``; never ``generated/`` or ``tests/``); a class
counts its methods (functions defined directly in its body). Nothing is imported: the files are parsed.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "compiler", "bench")


@dataclass(frozen=True)
class Size:
    name: str  # runtime/trace/tracer.py, or runtime/trace/tracer.py:Tracer
    lines: int
    methods: int = 0


def modules(root: Path = ROOT) -> list[Size]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            out.append(Size(path.relative_to(root).as_posix(), len(path.read_text().splitlines())))
    return sorted(out, key=lambda s: (-s.lines, s.name))


def classes(root: Path = ROOT) -> list[Size]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    assert node.end_lineno is not None
                    methods = sum(isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) for b in node.body)
                    out.append(Size(f"{path.relative_to(root).as_posix()}:{node.name}",
                                    node.end_lineno - node.lineno + 1, methods))
    return sorted(out, key=lambda s: (-s.lines, s.name))


def report(n: int = 5, root: Path = ROOT) -> str:
    lines = [f"largest modules (lines), of {', '.join(PACKAGES)}:"]
    lines += [f"  {s.lines:5d}  {s.name}" for s in modules(root)[:n]]
    lines.append("largest classes (lines, methods):")
    lines += [f"  {s.lines:5d}  {s.methods:3d}  {s.name}" for s in classes(root)[:n]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
