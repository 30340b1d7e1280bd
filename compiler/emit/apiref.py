"""The API reference page, ``generated/docs/api.html``: every public name of the runtime (``nnatlas.__all__``) and
the classes its calls return (Tracer, Support, Value, StoredCache), with signatures and docstrings.

Read from the runtime's source with ``ast`` (its signatures as written, ``ast.get_docstring``), not by importing
it: the names of ``nnatlas.__all__`` that need torch are imported lazily, and ``nnatlas generate --check`` starts
without torch. ``__all__``, ``_LAZY`` (name -> module) and the top-level ``from .x import`` lines of
runtime/__init__.py say where each name is defined.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

PAGE = "generated/docs/api.html"
RUNTIME = Path(__file__).resolve().parent.parent.parent / "runtime"
# classes the public calls return: (name, module, what returns it)
RETURNED = (("Tracer", "trace.tracer", "AtlasModel.trace and AtlasModel.generate"),
            ("Value", "tree.values", "AtlasModel.value and a host's standard value"),
            ("Support", "tree.describe", "AtlasModel.support"),
            ("StoredCache", "cache.stored", "Cache.load"))


@dataclass
class Entry:
    name: str
    kind: str  # "class", "function", "method", "property", "exception"
    signature: str
    doc: str
    module: str
    returned_by: str = ""
    members: list[Entry] = field(default_factory=list)


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, drop_self: bool) -> str:
    """``(args) -> returns`` as written in the source; ``drop_self``: without the first positional (self, cls)."""
    a = fn.args
    posonly, args, defaults = list(a.posonlyargs), list(a.args), list(a.defaults)
    if drop_self and (posonly or args):
        if len(defaults) == len(posonly) + len(args):  # the first positional has a default: it goes with it
            defaults = defaults[1:]
        if posonly:
            posonly = posonly[1:]
        else:
            args = args[1:]
    shown = ast.arguments(posonlyargs=posonly, args=args, vararg=a.vararg, kwonlyargs=a.kwonlyargs,
                          kw_defaults=a.kw_defaults, kwarg=a.kwarg, defaults=defaults)
    text = f"({ast.unparse(shown)})"
    if fn.returns is not None:
        text += f" -> {ast.unparse(fn.returns)}"
    return text


def _decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] for d in fn.decorator_list}


def _tree(module: str) -> ast.Module:
    path = RUNTIME / f"{module.replace('.', '/')}.py"
    stat = path.stat()
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(path: Path, mtime_ns: int, size: int) -> ast.Module:
    """A runtime file's tree, parsed once while the file is unchanged (a generate renders the page once, the
    spec fuzzers once per example: parsing every time was two thirds of an example's render)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _find(tree: ast.Module, name: str) -> ast.ClassDef | ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node
    return None


def _base(tree: ast.Module, name: str, module: str) -> tuple[ast.ClassDef, str] | None:
    """The class ``name`` a class of ``tree`` (the runtime module ``module``, dotted below ``nnatlas``) derives
    from, where the runtime defines it: in the same module or one it imports with ``from .module import name``
    (or ``..room.module``)."""
    found = _find(tree, name)
    if isinstance(found, ast.ClassDef):
        return found, ""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level and node.module and any(a.name == name for a in node.names):
            package = module.split(".")[:-1]
            where = ".".join([*package[:len(package) - node.level + 1], node.module])
            other = _find(_tree(where), name)
            return (other, where) if isinstance(other, ast.ClassDef) else None
    return None


def _class(node: ast.ClassDef, module: str) -> Entry:
    entry = _own_class(node, module)
    tree = _tree(module)
    seen = {m.name for m in entry.members}
    for b in node.bases:  # the public members the class inherits from runtime classes, after its own
        found = _base(tree, ast.unparse(b), module)
        if found is None:
            continue
        base = _class(found[0], found[1] or module)
        if not entry.signature and not entry.kind == "exception":
            entry.signature = base.signature
        for m in base.members:
            if m.name not in seen:
                seen.add(m.name)
                entry.members.append(m)
    return entry


def _own_class(node: ast.ClassDef, module: str) -> Entry:
    bases = [ast.unparse(b) for b in node.bases]
    exception = any(b.endswith(("Error", "Exception", "Unavailable", "NotReached", "UnknownName")) for b in bases)
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        sig = _signature(init, True)
        sig = sig.split(" -> ")[0]
    elif any(ast.unparse(d) in ("dataclass", "dataclasses.dataclass") or ast.unparse(d).startswith(("dataclass(", "dataclasses.dataclass("))
             for d in node.decorator_list):
        sig = "(" + ", ".join(ast.unparse(n.target) + ": " + ast.unparse(n.annotation) + (f" = {ast.unparse(n.value)}" if n.value else "")
                              for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)) + ")"
    else:
        sig = ""
    entry = Entry(node.name, "exception" if exception else "class", sig, ast.get_docstring(node) or "", module)
    if bases:
        entry.signature = f"({', '.join(bases)})" if exception else entry.signature
    for n in node.body:
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) or n.name.startswith("_"):
            continue
        decos = _decorators(n)
        if "setter" in decos or "deleter" in decos:
            continue
        if "property" in decos or "cached_property" in decos:
            ret = f" -> {ast.unparse(n.returns)}" if n.returns is not None else ""
            entry.members.append(Entry(n.name, "property", ret, ast.get_docstring(n) or "", module))
        else:
            entry.members.append(Entry(n.name, "method", _signature(n, "staticmethod" not in decos),
                                       ast.get_docstring(n) or "", module))
    return entry


def public_names() -> tuple[list[str], dict[str, str], str]:
    """(nnatlas.__all__, name -> the runtime module defining it, the package docstring), from runtime/__init__.py."""
    tree = _tree("__init__")
    names: list[str] = []
    where: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for a in node.names:
                where[a.asname or a.name] = node.module
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                names = list(ast.literal_eval(node.value))
            elif isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
                where.update(ast.literal_eval(node.value))
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):  # defined in the package itself
            where[node.name] = "__init__"
    return names, where, ast.get_docstring(tree) or ""


def entries() -> tuple[list[Entry], str]:
    """(every entry: nnatlas.__all__ in its order, then the returned classes; the package docstring)."""
    names, where, intro = public_names()
    out: list[Entry] = []
    for name, module, returned_by in [*((n, where[n], "") for n in names), *RETURNED]:
        node = _find(_tree(module), name)
        if node is None:
            raise LookupError(f"nnatlas.{name}: no class or function {name} in runtime/{module}.py")
        if isinstance(node, ast.ClassDef):
            entry = _class(node, module)
        else:
            kind = "context manager" if "contextmanager" in _decorators(node) else "function"
            entry = Entry(name, kind, _signature(node, False), ast.get_docstring(node) or "", module)
        entry.returned_by = returned_by
        out.append(entry)
    return out, intro


def render_html(cookbook: bool = True) -> str:
    """The page; ``cookbook``: the site has a cookbook page to link to."""
    from .templating import env

    items, intro = entries()
    sources = sorted({e.module for e in items} | {"__init__"})
    digest = hashlib.sha256("".join((RUNTIME / f"{m.replace('.', '/')}.py").read_text(encoding="utf-8") for m in sources).encode()).hexdigest()
    header = (f"<!-- Generated by nnatlas from the runtime's source (runtime/: {', '.join(m + '.py' for m in sources)}; "
              f"sha256 {digest}) by compiler/emit/apiref.py. Do not edit: change the docstrings, then run `make generate`. -->")
    return env().get_template("api.html.j2").render(header=header, intro=intro, cookbook=cookbook, public=[e for e in items if not e.returned_by],
                                                    returned=[e for e in items if e.returned_by])
