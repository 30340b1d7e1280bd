"""The nnatlas spec compiler: specs/*.yaml → adapters, tests and pages under generated/.

    from nnatlas.compiler import compile_atlas, generate
    atlas = compile_atlas(Path("specs"))          # validate and resolve (raises SpecError)
    generate(root)                                 # write what changed; generate(root, check=True) only compares
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .emit import apiref, cookbook, emit, files, guide, outdir, pages, printouts, pycheck, reference, templating
from .errors import GenerateError, Problem, SpecError, UserError
from .language.ir import Atlas, FamilyIR
from .resolve import treecheck
from .resolve.resolve import resolve, resolve_texts
from .status import status

OWNED = ("generated/families", "generated/tests", "generated/docs")


def default_root() -> Path:
    """The checkout this package was installed from (compiler/ sits at its top level)."""
    return Path(__file__).resolve().parent.parent


def compile_atlas(spec_dir: Path, root: Path | None = None) -> Atlas:
    return resolve(spec_dir, root)


def compile_texts(texts: dict[str, str]) -> Atlas:
    """``compile_atlas`` from memory: spec file name (``gpt2.yaml``) → its text."""
    return resolve_texts(texts)


def render(atlas: Atlas, printout_texts: dict[str, str] | None = None,
           status_data: dict[str, Any] | None = None, adapters: dict[str, str] | None = None,
           cookbook_text: str | None = None, guide_texts: dict[str, str] | None = None) -> dict[str, str]:
    """Every generated file, path relative to the root → text.

    ``printout_texts``: family → its printout file (``compiler/emit/printouts.py``), which the pages
    show and take their per-checkpoint facts from; without it the pages are drawn from the specs alone.
    ``status_data``: the committed ``generated/docs/status.json`` (``compiler/status/status.py``), which
    status.html and the index's status row show; without it they say no run is recorded.
    ``adapters``: family → its rendered adapter, when the caller has rendered them already (``render_adapters``).
    ``cookbook_text``: docs/cookbook.md (``compiler/emit/cookbook.py``), rendered as the site's cookbook page.
    ``guide_texts``: the other pages of docs/ (``guide.read``), rendered as the manual's pages (``compiler/emit/guide.py``).
    """
    printout_texts = printout_texts or {}
    adapters = adapters if adapters is not None else render_adapters(atlas)
    out: dict[str, str] = {"generated/families/__init__.py": emit.render_registry(atlas),
                           "generated/tests/conftest.py": emit.render_tests_conftest(atlas)}
    tests: dict[str, str] = {}  # family → the digest of its generated tests: a run that saw others is stale
    for f in atlas.families:
        printout = printout_texts.get(f.name)
        out[f"generated/families/{f.name}.py"] = adapters[f.name]
        out[f"generated/tests/test_{f.name}.py"] = emit.render_tests(f)
        tests[f.name] = status.tests_digest(out[f"generated/tests/test_{f.name}.py"])
        out[f"generated/docs/{f.name}.html"], out[f"generated/docs/{f.name}.md"] = pages.render_pages(f, atlas, printout,
                                                                                                 status_data, tests[f.name])
        if printout is not None:
            out[printouts.path_for(f.name)] = printout
    guides = guide.pages(guide_texts or {})
    searched = guides + ([guide.parse("cookbook", cookbook_text)] if cookbook_text is not None else [])
    out["generated/docs/index.html"], out["generated/docs/search.js"], out["generated/docs/matrix.html"] = pages.render_index(
        atlas, printout_texts, status_data, cookbook_text is not None, tests, [(p.title, p.href) for p in guides],
        guide.entries(searched))
    out["generated/docs/status.html"] = pages.render_status(atlas, status_data, tests)
    out[status.CARRIED] = status.carried(atlas, status_data, tests)
    out["generated/docs/llms.txt"] = pages.render_llms(atlas, [(p.title, p.href) for p in guides])
    out["generated/docs/atlas.css"] = templating.env().get_template("atlas.css.j2").render()
    out["generated/docs/atlas.js"] = templating.env().get_template("atlas.js.j2").render()
    out[reference.PATH] = reference.render_md()  # the spec language reference, from the compiler's own models
    out[reference.PAGE] = reference.render_html()
    out[apiref.PAGE] = apiref.render_html(cookbook_text is not None)  # the runtime's API, from its source
    if cookbook_text is not None:
        out[cookbook.PAGE] = cookbook.render_html(cookbook_text)
    out.update(guide.render_all(guide_texts or {}, guides, cookbook_text is not None))
    return out


def render_adapters(atlas: Atlas) -> dict[str, str]:
    """Family → its generated adapter, each rendered once: printouts, their keys and the files share them."""
    return {f.name: emit.render_family(f) for f in atlas.families}


def printout_key(f: FamilyIR, atlas: Atlas, adapter: str | None = None) -> str:
    """The key a printout file must carry to be fresh (see ``compiler/emit/printouts.py``); ``adapter``:
    ``f``'s rendered adapter when the caller has it."""
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
    return printouts.input_key(f, emit.render_family(f) if adapter is None else adapter, chain)


def plan_printouts(root: Path, atlas: Atlas, compute: bool,
                   adapters: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """(family → printout text, the printout files that are stale).

    Each family whose printout is recomputed is first checked against its module trees on the
    meta device (``compiler/resolve/treecheck.py``); their problems, every family's, raise one SpecError.
    A fresh file (its header's key matches) is kept as it is; a stale one is recomputed on the
    meta device when ``compute`` (this imports torch), else reported stale and its old text kept.
    A family with no recorded checkpoint has a printout too, its header alone (no checkpoint's facts): its key
    caches the tree check as every other family's does (checked on every run, it made ``generate --check``
    import torch and build its models each time).
    """
    adapters = adapters if adapters is not None else render_adapters(atlas)
    texts: dict[str, str] = {}
    stale: list[str] = []
    problems: list[Problem] = []
    for f in atlas.families:
        adapter = adapters[f.name]
        rel = printouts.path_for(f.name)
        existing = files.read(root / rel)
        key = printout_key(f, atlas, adapter)
        if printouts.is_fresh(existing, f, key):
            texts[f.name] = existing or ""
        elif compute:
            pycheck.check_adapter(f"generated/families/{f.name}.py", adapter)  # before it runs
            found = treecheck.check(f, adapter)  # a fresh printout means its family passed
            problems += found
            if not found:
                texts[f.name] = printouts.compute(f, adapter, key)
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


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused, then restored as it was: a run builds millions of objects that
    live until it ends (the resolved atlas, every rendered file, each adapter's syntax tree), and the
    collector's passes over them cost ~13 % of a cold ``generate --check`` while finding almost nothing.
    Reference counting still frees everything that is not in a cycle, and a run makes few cycles (the
    merge and the YAML builder are classes, not recursive closures): peak memory is the same, ~78 MB."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def generate(root: Path | None = None, check: bool = False) -> Result:
    """Validate every spec and regenerate; with ``check`` write nothing and report the diff.

    All files are rendered in memory first: a spec error writes nothing at all, and neither does
    rendered Python that does not parse (GenerateError). Printouts are recomputed (on the meta
    device, importing torch, running the rendered adapter) only when their header says they are
    stale; ``check`` decides that from the headers alone.
    """
    with _no_cycle_collection():
        return _generate(root or default_root(), check)


def _generate(root: Path, check: bool) -> Result:
    atlas = compile_atlas(root / "specs", root)
    adapters = render_adapters(atlas)
    texts, stale_printouts = plan_printouts(root, atlas, not check, adapters)
    outputs = render(atlas, texts, status.read(root), adapters, cookbook.read(root), guide.read(root))
    files.check_python(outputs)
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
    ``out`` is a new or empty folder, or one an earlier build made (``compiler/emit/outdir.py``):
    any other is refused with GenerateError before anything is built.
    """
    outdir.check(out)
    root = root or default_root()
    atlas = compile_atlas(root / "specs", root)
    adapters = render_adapters(atlas)
    texts, _ = plan_printouts(root, atlas, True, adapters)
    recorded = status.read(root)
    outputs = render(atlas, texts, recorded, adapters, cookbook.read(root), guide.read(root))
    site = {rel.removeprefix("generated/docs/"): text for rel, text in outputs.items() if rel.startswith("generated/docs/")}
    if recorded is not None:
        site["status.json"] = status.dumps(recorded)
    site[".nojekyll"] = ""
    return [rel for rel in outdir.write(out, site) if rel != ".nojekyll"]


__all__ = ["Atlas", "GenerateError", "Problem", "Result", "SpecError", "UserError", "build_site", "compile_atlas", "compile_texts", "default_root", "generate",
           "plan_printouts", "render"]
