"""The audit: every place the package's sources (runtime/, compiler/, generated/families/: what ``import nnatlas``
ships) could run code that came from somewhere else: ``exec``, ``eval``, ``compile(..., "exec")``, unpickling
(pickle and its kin, ``torch.load`` without ``weights_only=True``, ``numpy.load(allow_pickle=True)``), ``yaml.load``
without a safe loader, a shell (``subprocess`` with ``shell=True``, ``os.system``, ``os.popen``), a module run from a
path (``runpy``, ``spec_from_file_location``). Each allowed site is named below with its reason; a new one fails,
and so does an allowed one that is gone (the list says what is, not what was)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("runtime", "compiler", "generated/families")

UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
SHELLS = {("os", "system"), ("os", "popen"), ("runpy", "run_path"), ("runpy", "run_module")}

# (file, the function it is in, what) -> why it is allowed
ALLOWED = {
    ("compiler/userspec.py", "compile_text", "exec"):
        "the adapter this process's compiler rendered from a validated spec (pycheck and treecheck passed on it), run "
        "in memory as a module: a spec's strings reach it only as escaped literals; a kept draft reaches it as a spec",
    ("compiler/userspec.py", "compile_text", "compile(..., 'exec')"): "the same adapter's source, compiled in memory",
    ("compiler/resolve/treecheck.py", "_adapter", "exec"):
        "the compiler's own adapter, rendered in memory, run to build its module tree on the meta device",
    ("compiler/resolve/treecheck.py", "_adapter", "compile(..., 'exec')"): "the same adapter's source",
    ("compiler/emit/printouts.py", "compute", "exec"):
        "generate's own adapter of a shipped spec, rendered in memory, run to print the recorded checkpoints",
    ("compiler/emit/printouts.py", "compute", "compile(..., 'exec')"): "the same adapter's source",
    ("compiler/emit/pycheck.py", "_compile", "compile(..., 'exec')"):
        "compiled to check that a rendered adapter parses; the code object is never run",
    ("compiler/draft/configexpr.py", "evaluate", "eval"):
        "the drafter's config expressions, checked first against a whitelist (names, items, arithmetic; no call but "
        "len, no double underscore), evaluated without builtins: a config.json key cannot reach it as code",
    ("compiler/draft/configexpr.py", "evaluate", "compile(..., 'eval')"): "the same checked expression",
    ("runtime/testing/examples.py", "run_example", "exec"):
        "the test helpers run a page's code examples (the notes of the specs this nnatlas carries) on a tiny model: "
        "what a page states, CI runs",
    ("runtime/testing/examples.py", "run_example", "compile(..., 'exec')"): "the same examples, compiled",
}


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a Name or Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _kind(call: ast.Call) -> str | None:
    """What is dangerous about ``call``, or None."""
    name = _name(call.func)
    head, _, last = name.rpartition(".")
    if name in ("exec", "eval", "builtins.exec", "builtins.eval", "__import__"):
        return name.rpartition(".")[2]
    if name in ("compile", "builtins.compile"):
        mode = call.args[2] if len(call.args) > 2 else _kw(call, "mode")
        shown = mode.value if isinstance(mode, ast.Constant) else "?"
        return f"compile(..., {shown!r})"
    if head in UNPICKLERS or head.endswith(".pickle"):
        return f"{name}(...)"
    if name == "torch.load" and not _is(_kw(call, "weights_only"), True):
        return "torch.load without weights_only=True"
    if last == "load" and head in ("np", "numpy") and not _is(_kw(call, "allow_pickle"), False) \
            and _kw(call, "allow_pickle") is not None:
        return "numpy.load(allow_pickle=...)"
    if head == "yaml" and last in ("load", "load_all"):
        loader = _kw(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        if loader is None or _name(loader).rpartition(".")[2] not in SAFE_LOADERS:
            return f"yaml.{last} without a safe loader"
    if head == "yaml" and last in ("unsafe_load", "unsafe_load_all", "full_load", "full_load_all"):
        return f"yaml.{last}"
    if head == "subprocess" and not _is(_kw(call, "shell"), False) and _kw(call, "shell") is not None:
        return "subprocess with shell="
    if (head.rpartition(".")[2], last) in SHELLS:
        return name
    if last == "spec_from_file_location":
        return "a module from a path"
    return None


def audit(source: str, file: str) -> list[tuple[str, str, str, int]]:
    """(file, enclosing function, what, line) of every dangerous call and unpickler import in ``source``."""
    found: list[tuple[str, str, str, int]] = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else where
            if isinstance(child, ast.Call):
                kind = _kind(child)
                if kind is not None:
                    found.append((file, where, kind, child.lineno))
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                for m in mods:
                    if m.split(".")[0] in UNPICKLERS:
                        found.append((file, where, f"import {m}", child.lineno))
            walk(child, inner)

    walk(ast.parse(source, file), "<module>")
    return found


def _package_sites() -> list[tuple[str, str, str, int]]:
    sites = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            sites += audit(path.read_text(encoding="utf-8"), rel)
    return sites


def test_every_site_that_could_run_code_is_named_with_its_reason() -> None:
    sites = _package_sites()
    new = [f"{f}:{line} in {fn}: {what}" for f, fn, what, line in sites if (f, fn, what) not in ALLOWED]
    assert new == [], "a new place that could run code from elsewhere; remove it, or name it in ALLOWED with why:\n" \
                      + "\n".join(new)
    gone = sorted(set(ALLOWED) - {(f, fn, what) for f, fn, what, _ in sites})
    assert gone == [], f"allowed sites that are no longer there (take them out of ALLOWED): {gone}"


def test_the_audit_finds_each_kind() -> None:
    """The audit is only as good as what it sees: each kind it lists, planted in a source, is found."""
    planted = '''
import pickle
from marshal import loads
import subprocess, os, yaml, torch, runpy, importlib.util, numpy as np

def f(text, path):
    exec(text)
    eval(text)
    compile(text, path, "exec")
    compile(text, path, mode="eval")
    pickle.loads(text)
    torch.load(path)
    torch.load(path, weights_only=False)
    torch.load(path, weights_only=True)          # safe: not listed
    np.load(path, allow_pickle=True)
    yaml.load(text)
    yaml.load(text, Loader=yaml.Loader)
    yaml.load(text, Loader=yaml.SafeLoader)      # safe: not listed
    yaml.unsafe_load(text)
    subprocess.run(text, shell=True)
    subprocess.run([text], shell=False)          # safe: not listed
    os.system(text)
    runpy.run_path(path)
    importlib.util.spec_from_file_location("m", path)
    re.compile(text)                             # not the builtin: not listed
'''
    kinds = [what for _, fn, what, _ in audit(planted, "planted.py")]
    assert kinds == ["import pickle", "import marshal", "exec", "eval", "compile(..., 'exec')",
                     "compile(..., 'eval')", "pickle.loads(...)", "torch.load without weights_only=True",
                     "torch.load without weights_only=True", "numpy.load(allow_pickle=...)",
                     "yaml.load without a safe loader", "yaml.load without a safe loader", "yaml.unsafe_load",
                     "subprocess with shell=", "os.system", "runpy.run_path", "a module from a path"]
    assert {fn for _, fn, _, _ in audit(planted, "planted.py")} == {"<module>", "f"}


def test_a_config_key_never_reaches_the_drafters_eval() -> None:
    """A checkpoint's config.json names attributes the drafter writes into its config expressions: text that is not a
    plain expression of names, items and arithmetic is refused before eval, so a crafted key runs nothing."""
    import pytest

    from nnatlas.compiler.draft import configexpr

    class Cfg:
        hidden_size, num_attention_heads, head_dim = 32, 4, None

    names = {"hidden_size": 32, "num_attention_heads": 4, "head_dim": None, "cfg": Cfg()}
    assert configexpr.evaluate("head_dim or hidden_size // num_attention_heads", names) == 8
    assert configexpr.evaluate("[['moe'] * 2, ['moe'] * 3][num_attention_heads - 3]", names) == ["moe"] * 3
    assert configexpr.evaluate("len([1, 2]) * cfg.hidden_size", names, {"len": len}) == 64
    for text, why in [("().__class__.__base__", "double underscore"), ("().__class__.__base__.__subclasses__()", "a call"),
                      ("cfg.__init__.__globals__", "double underscore"),
                      ("open('/etc/passwd')", "a call is not allowed"),
                      ("len([1]) if hidden_size else exec('x')", "a call is not allowed"),
                      ("[x for x in (1, 2)]", "ListComp is not allowed"),
                      ("(lambda: 1)", "Lambda is not allowed"),
                      ("hidden_size; import os", "not an expression")]:
        with pytest.raises(configexpr.Refused, match=why):
            configexpr.evaluate(text, names, {"len": len})


def test_the_file_safety_helpers_are_one_leaf_module() -> None:
    """nnatlas.safe_files imports nothing of nnatlas (the draft cache, the dataset cache and its writer share it, one copy)."""
    from . import imports as I

    g = I.graph("nnatlas")
    assert [i.target for i in g["nnatlas.safe_files"] if i.target.startswith("nnatlas")] == []
    users = sorted(m for m, imps in g.items() if any(i.target == "nnatlas.safe_files" for i in imps))
    assert users == ["nnatlas.cache.stored", "nnatlas.cli.out", "nnatlas.loading.draft_cache", "nnatlas.loading.user_specs"]
