"""The import graph of nnatlas's hand-written packages, read from the source (nothing is imported).

Every ``import`` and ``from ... import`` counts, at module level, inside a function or under
``if TYPE_CHECKING:`` (annotations only, never run, but a tie between the modules all the same). Modules are named as users import them:
``runtime/`` is ``nnatlas``, ``compiler/`` is ``nnatlas.compiler``, ``generated/families/`` is
``nnatlas.families``, as pyproject's package-dir maps them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"nnatlas": ROOT / "runtime", "nnatlas.compiler": ROOT / "compiler",
            "nnatlas.families": ROOT / "generated" / "families"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module: nnatlas.model
    target: str  # the module imported: nnatlas.tree.hosts (a name imported from a package counts as its module if one)
    line: int
    local: bool  # inside a function (not at module level)
    typing: bool = False  # under ``if TYPE_CHECKING:`` (for a type checker only)


def module_name(path: Path) -> str:
    for pkg, folder in sorted(PACKAGES.items(), key=lambda kv: -len(str(kv[1]))):
        if path.is_relative_to(folder):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join([pkg, *parts])
    raise ValueError(f"{path} is in no package")


def modules(package: str) -> dict[str, Path]:
    """Every module of a package folder (``nnatlas`` alone: runtime/, not its subpackages' folders)."""
    folder = PACKAGES[package]
    return {module_name(p): p for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path, known: set[str] | None = None) -> list[Import]:
    """The imports of one file; ``from . import x`` names module ``pkg.x`` when ``known`` holds it."""
    source = module_name(path)
    is_pkg = path.name == "__init__.py"
    base = source.split(".") if is_pkg else source.split(".")[:-1]
    out: list[Import] = []

    def visit(node: ast.AST, local: bool, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit(ast.Module([sub], []), local, True)
                for sub in child.orelse:
                    visit(ast.Module([sub], []), local, typing)
                continue
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend(Import(source, a.name, child.lineno, local, typing) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    mod = ".".join(base[:len(base) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                for a in child.names:
                    sub = f"{mod}.{a.name}"
                    out.append(Import(source, sub if known and sub in known else mod, child.lineno, local, typing))
            visit(child, inner, typing)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return out


def graph(*packages: str) -> dict[str, list[Import]]:
    """module → its imports of modules among ``packages`` (other imports dropped)."""
    mods: dict[str, Path] = {}
    for pkg in packages:
        mods.update(modules(pkg))
    known = set(mods)
    out: dict[str, list[Import]] = {}
    for name, path in mods.items():
        out[name] = [i for i in imports(path, known) if i.target in known and i.target != name]
    return out


def circles(g: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for imp in g.get(v, []):
            w = imp.target
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return sorted(found)
