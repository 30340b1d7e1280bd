"""The nnatlas spec compiler: specs/*.yaml → adapters, tests and pages under generated/.

    from nnatlas.compiler import compile_atlas, generate
    atlas = compile_atlas(Path("specs"))          # validate and resolve (raises SpecError)
    generate(root)                                 # write what changed; generate(root, check=True) only compares
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import emit, files, printouts, treecheck
from .errors import Problem, SpecError
from .ir import Atlas, FamilyIR
from .resolve import resolve

OWNED = ("generated/families", "generated/tests", "generated/docs")


def default_root() -> Path:
    """The checkout this package was installed from (compiler/ sits at its top level)."""
    return Path(__file__).resolve().parent.parent


def compile_atlas(spec_dir: Path, root: Path | None = None) -> Atlas:
    return resolve(spec_dir, root)


def render(atlas: Atlas, printout_texts: dict[str, str] | None = None) -> dict[str, str]:
    """Every generated file, path relative to the root → text.

    ``printout_texts``: family → its printout file (``compiler/printouts.py``), which the pages
    show and take their per-checkpoint facts from; without it the pages are drawn from the specs alone.
    """
    printout_texts = printout_texts or {}
    out: dict[str, str] = {"generated/families/__init__.py": emit.render_registry(atlas)}
    for f in atlas.families:
        printout = printout_texts.get(f.name)
        out[f"generated/families/{f.name}.py"] = emit.render_family(f)
        out[f"generated/tests/test_{f.name}.py"] = emit.render_tests(f)
        out[f"generated/docs/{f.name}.html"] = emit.render_page(f, atlas, printout)
        out[f"generated/docs/{f.name}.md"] = emit.render_page_md(f, atlas, printout)
        if printout is not None:
            out[printouts.path_for(f.name)] = printout
    out["generated/docs/index.html"] = emit.render_index(atlas)
    out["generated/docs/llms.txt"] = emit.render_llms(atlas)
    out["generated/docs/atlas.css"] = emit.env().get_template("atlas.css.j2").render()
    out["generated/docs/atlas.js"] = emit.env().get_template("atlas.js.j2").render()
    return out


def printout_key(f: FamilyIR, atlas: Atlas) -> str:
    """The key a printout file must carry to be fresh (see ``compiler/printouts.py``)."""
    by_name = {x.name: x for x in atlas.families}
    chain: list[str] = []
    todo = [f.name]
    while todo:  # the family and every spec it extends, directly or not
        node = by_name.get(todo.pop(0))
        if node is not None and node.sha256 not in chain:
            chain.append(node.sha256)
            todo.extend(node.extends)
    chain += [sha for _, sha in f.parts]
    chain.append(atlas.vocabulary_sha256)
    return printouts.input_key(f, emit.render_family(f), chain)


def plan_printouts(root: Path, atlas: Atlas, compute: bool) -> tuple[dict[str, str], list[str]]:
    """(family → printout text, the printout files that are stale).

    Each family whose printout is recomputed is first checked against its module trees on the
    meta device (``compiler/treecheck.py``); their problems, every family's, raise one SpecError.
    A fresh file (its header's key matches) is kept as it is; a stale one is recomputed on the
    meta device when ``compute`` (this imports torch), else reported stale and its old text kept.
    """
    texts: dict[str, str] = {}
    stale: list[str] = []
    problems: list[Problem] = []
    for f in atlas.families:
        if not f.checkpoints:  # no printout to cache the module tree check: it runs every time
            problems += treecheck.check(f, emit.render_family(f))
            continue
        rel = printouts.path_for(f.name)
        existing = files.read(root / rel)
        key = printout_key(f, atlas)
        if printouts.is_fresh(existing, f, key):
            texts[f.name] = existing or ""
        elif compute:
            found = treecheck.check(f, emit.render_family(f))  # a fresh printout means its family passed
            problems += found
            if not found:
                texts[f.name] = printouts.compute(f, emit.render_family(f), key)
        else:
            stale.append(rel)
            if existing is not None:
                texts[f.name] = existing
    if problems:  # a base's line that fails in each family extending it is reported once, for the first
        first: dict[tuple[str, int, int], Problem] = {}
        for p in problems:
            first.setdefault((p.file, p.line, p.col), p)
        raise SpecError(list(first.values()))
    return texts, stale


@dataclass
class Result:
    changed: list[str]
    removed: list[str]
    diff: str


def generate(root: Path | None = None, check: bool = False) -> Result:
    """Validate every spec and regenerate; with ``check`` write nothing and report the diff.

    All files are rendered in memory first: a spec error writes nothing at all. Printouts are
    recomputed (on the meta device, importing torch) only when their header says they are stale;
    ``check`` decides that from the headers alone.
    """
    root = root or default_root()
    atlas = compile_atlas(root / "specs", root)
    texts, stale_printouts = plan_printouts(root, atlas, compute=not check)
    outputs = render(atlas, texts)
    changed, orphans = files.stale(root, outputs, OWNED)
    orphans = [o for o in orphans if o not in stale_printouts]
    diff = files.diff(root, outputs, changed, orphans) if check else ""
    for rel in stale_printouts:
        diff += f"--- a/{rel}\n+++ b/{rel}\n(stale: its header does not match the spec, the code or transformers)\n"
        if rel not in changed:
            changed.append(rel)
    result = Result(changed, orphans, diff)
    if not check:
        files.write(root, outputs, changed, orphans)
    return result


def build_site(out: Path, root: Path | None = None) -> list[str]:
    """The static site, one folder: every page, the Markdown pages, llms.txt, CSS and JS.

    Rendered from the specs in memory (stale printouts recomputed), so it never depends on
    whether ``generated/`` was regenerated; returns the files written, relative to ``out``.
    """
    import shutil

    root = root or default_root()
    atlas = compile_atlas(root / "specs", root)
    texts, _ = plan_printouts(root, atlas, compute=True)
    outputs = render(atlas, texts)
    if out.exists():
        shutil.rmtree(out)
    written = []
    for rel, text in sorted(outputs.items()):
        if not rel.startswith("generated/docs/"):
            continue
        target = out / rel.removeprefix("generated/docs/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8", newline="\n")
        written.append(target.relative_to(out).as_posix())
    (out / ".nojekyll").write_text("", encoding="utf-8")
    return written


__all__ = ["Atlas", "Problem", "Result", "SpecError", "build_site", "compile_atlas", "default_root", "generate",
           "plan_printouts", "render"]
