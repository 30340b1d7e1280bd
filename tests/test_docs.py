"""The README and every page of docs/ run where they show code, as a reader would run them: each page's ```python
blocks in order in one namespace, its ```sh blocks' `nnatlas` lines through the command's own entry point, in a
scratch folder holding a tiny llama checkpoint (``CHECKPOINT``, saved with save_pretrained, loaded with
nnatlas.load) and a 40-line ``corpus.txt``. A block that cannot run here starts with ``# not run by the tests:``
and says why. (docs/cookbook.md runs in tests/test_cookbook.py, on three families; docs/spec.md is the compiler's
reference, generated, with no code to run.) Then the front door's shape, the links, the families page, and the
manual's pages on the site: rendered, escaped, linked from the index, searched."""

from __future__ import annotations

import random
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nnatlas import registry, testing
from nnatlas.compiler.cli import main as nnatlas_main
from nnatlas.compiler.emit import guide, search_index
from nnatlas.loading import user_specs

ROOT = Path(__file__).resolve().parent.parent
GUIDES = guide.read(ROOT)
PAGES = ["README.md", *(f"docs/{name}.md" for name in GUIDES)]
GENERATED = ROOT / "generated" / "docs"
# pages another branch writes: a link to one is kept (the site draws it as text until the page lands)
PENDING = {"docs/security.md"}


@pytest.fixture(autouse=True)
def shipped_families_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A page that loads a spec of its own (docs/contributing.md: spec="helium.yaml") adds a family to this
    process's lookup: it is taken out again after the page, so the tests after it see the shipped families."""
    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path / "nnatlas-cache"))
    yield
    for name in list(registry._LAST):
        registry.remove_user(name)
    user_specs._COMPILED.clear()
    user_specs._ORIGINS.clear()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama checkpoint and the corpus, made once for every page."""
    folder = tmp_path_factory.mktemp("docs")
    model = testing.build("llama", seed=3)
    model.native.save_pretrained(folder / "ckpt")
    model.tokenizer.save_pretrained(folder / "ckpt")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(testing.WORDS) for _ in range(rng.randint(3, 12))) for _ in range(40)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")
    return folder


def run_sh(code: str, checkpoint: str, where: str) -> int:
    """Each `nnatlas` line of a shell block through the command's entry point (a line ending in a backslash goes
    on); the number of lines run. Any other command belongs in a block marked not run."""
    ran = 0
    for line in code.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        args = shlex.split(line.replace("CHECKPOINT", checkpoint), comments=True)
        assert args[0] == "nnatlas", f"{where}: `{line}` is not an nnatlas command: mark the block not run, saying why"
        try:
            rc = nnatlas_main(args[1:])
        except SystemExit as e:  # argparse's --help of the cache command's own parser
            rc = e.code if isinstance(e.code, int) else 2
        assert rc == 0, f"{where}: `{line}` exited {rc}"
        ran += 1
    return ran


def run_page(rel: str, folder: Path, ns: dict[str, Any] | None = None) -> tuple[int, int]:
    """Every block of one page, in order, in ``ns``; (blocks run, blocks marked not run)."""
    text = (ROOT / rel).read_text(encoding="utf-8")
    ns = {} if ns is None else ns
    ns.update({"CHECKPOINT": str(folder / "ckpt"), "__name__": "__docs__"})
    ran = skipped = 0
    for n, (lang, code) in enumerate(guide.code_blocks(text)):
        where = f"{rel}, block {n}"
        if lang not in ("python", "sh"):
            continue  # a drawing, a printout
        if not guide.runs(code):
            why = code.lstrip().splitlines()[0].removeprefix(guide.NOT_RUN).strip()
            assert len(why) > 10, f"{where}: a block not run says why"
            skipped += 1
            continue
        if lang == "python":
            exec(compile(code, where, "exec"), ns)  # noqa: S102 - the page's own code, as a reader runs it
        else:
            assert run_sh(code, ns["CHECKPOINT"], where) > 0, f"{where}: a shell block with no command"
        ran += 1
    return ran, skipped


@pytest.mark.parametrize("rel", PAGES)
def test_every_block_of_the_page_runs(rel: str, scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "corpus.txt").write_text((scratch / "corpus.txt").read_text())
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    ns: dict[str, Any] = {}
    ran, skipped = run_page(rel, scratch, ns)
    text = (ROOT / rel).read_text(encoding="utf-8")
    assert ran + skipped == sum(lang in ("python", "sh") for lang, _ in guide.code_blocks(text))
    assert skipped <= 3, f"{rel}: {skipped} blocks not run; a page shows what the tests run"
    checks(rel, ns, tmp_path)


def checks(rel: str, ns: dict[str, Any], folder: Path) -> None:
    """What a page's blocks must have done, beyond the asserts they show."""
    if rel == "docs/caching.md":
        assert ns["stored"].rows > 0 and (folder / "acts" / "manifest.json").is_file()
        assert set(ns["cache"]) >= {"layers[0].layer_output", "layers[1].self_attn.attention_output"}
    elif rel == "docs/contributing.md":
        assert ns["model"].family == "helium" and (folder / "my_family.yaml").is_file()
        assert "helium" in registry._LAST  # the user's family, in this process's lookup until the page ends
    elif rel == "docs/cli.md":
        assert (folder / "my_llama.yaml").is_file() and (folder / "acts" / "manifest.json").is_file()
    elif rel == "docs/concepts.md":
        assert ns["steer"].grad is not None and ns["steer"].abs().sum() > 0


def test_a_block_that_fails_fails_its_page(scratch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner is a test: a wrong claim in a block, a failing command, a shell line that is not nnatlas's and a
    block marked not run without a reason each fail."""
    monkeypatch.chdir(tmp_path)
    bad = {
        "claim.md": "# T\n\n```python\nimport nnatlas\nm = nnatlas.load(CHECKPOINT)\nassert m.num_layers == 99\n```\n",
        "command.md": "# T\n\n```sh\nnnatlas cache CHECKPOINT --data missing.txt --out acts/\n```\n",
        "other.md": "# T\n\n```sh\nrm -rf acts/\n```\n",
        "reason.md": "# T\n\n```python\n# not run by the tests:\nraise SystemExit\n```\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(AssertionError):
            run_page(str(tmp_path / name), scratch)


def test_the_readme_is_a_front_door() -> None:
    """At most 150 lines: what nnatlas is, the picture of the flow, the two commands exactly, ten lines of example,
    the families as a link, and a link to every page of the manual."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "\nmake generate " in text and "\nmake test " in text  # CI runs the README's test command (.ci/run)
    assert "specs/*.yaml" in text and "generated/" in text and "runtime" in text
    example = [code for lang, code in guide.code_blocks(text) if lang == "python"]
    assert len(example) == 1 and len(example[0].strip().splitlines()) <= 12
    for name in [*GUIDES, "spec", "cookbook", "security"]:
        assert f"](docs/{name}.md)" in text, f"the README does not link docs/{name}.md"


def test_every_link_of_the_readme_and_the_manual_finds_its_file() -> None:
    for rel in ["README.md", *(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]:
        text = (ROOT / rel).read_text(encoding="utf-8")
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))  # code links nothing
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if target.startswith(("#", "http")):
                continue
            path = (ROOT / rel).parent / target.partition("#")[0]
            resolved = path.resolve().relative_to(ROOT).as_posix()
            assert path.exists() or resolved in PENDING, f"{rel}: a link to {target}, which does not exist"


def test_the_families_page_names_every_family() -> None:
    text = (ROOT / "docs" / "families.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z0-9_]+)`", text))
    families = {m.group(1) for p in (ROOT / "specs").glob("*.yaml")
                if (m := re.search(r"^family: (\w+)", p.read_text(encoding="utf-8"), re.M))}
    assert len(families) > 70 and families <= named, families - named
    assert f"({len(families)})" in text


# ---- the manual on the site ----

NASTY = ("# Title </title><script>window.__pwned = 1</script>\n\nIntro {{ 7 * 7 }} & [a link](concepts.md#x) "
         "[out](https://example.org) [js](javascript:alert(1)) [readme](../README.md) [here](#s-1).\n\n"
         "## S </h2><script>window.__pwned = 2</script>\n\n### Sub & <b>\n\nText `<i>code</i>` **bold**\n\n"
         "```python\nx = '</script>[no](concepts.md)'\n```\n\n## S\n\n| a | b |\n|---|---|\n| <td> | `|` |\n\n"
         "## S\n\nagain\n")


def test_a_guide_page_escapes_everything_and_links_only_the_manual() -> None:
    out = guide.render_all({"nasty": NASTY, "concepts": "# Concepts\n\n## X\n\ntext\n"})
    page = out["generated/docs/guide-nasty.html"]
    assert "<script>window" not in page and "&lt;script&gt;window.__pwned = 1" in page
    assert "Intro {{ 7 * 7 }} &amp; " in page  # a template's braces are text, never evaluated
    assert '<a href="guide-concepts.html#x">a link</a>' in page
    assert "example.org" not in page and "<p>Intro {{ 7 * 7 }} &amp; " in page  # an outside address: its text alone
    assert 'href="javascript' not in page and 'href="../README.md"' not in page
    assert '<a href="#s-1">here</a>' in page  # a link inside the page, as it is
    assert '<section id="s">' in page and '<section id="s-2">' in page and '<h3 id="sub-b">Sub &amp; &lt;b&gt;</h3>' in page
    assert "[no](concepts.md)" in page  # code is code: no link inside a block
    assert '<a href="guide-nasty.html">' not in page and 'aria-current="page"' in page
    assert '<a href="guide-concepts.html">Concepts</a>' in page


def test_a_guide_page_name_must_be_words(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "Bad Name.md").write_text("# x\n")
    from nnatlas.compiler import GenerateError

    with pytest.raises(GenerateError, match="lower-case words"):
        guide.read(tmp_path)


def test_the_site_renders_every_page_of_the_manual_linked_from_the_index_and_searched() -> None:
    index = (GENERATED / "index.html").read_text(encoding="utf-8")
    search = search_index.read_search_script((GENERATED / "search.js").read_text(encoding="utf-8"))
    found = [e for e in search if e["family"] == guide.FAMILY]
    cookbook = (ROOT / "docs" / "cookbook.md").read_text(encoding="utf-8")
    for name, text in [*GUIDES.items(), ("cookbook", cookbook)]:  # the cookbook's recipes are searched too
        page = guide.parse(name, text)
        html = (GENERATED / page.href).read_text(encoding="utf-8")
        assert f"Generated by nnatlas from docs/{name}.md" in html and f'<a href="{page.href}">' in index
        python = [code for lang, code in guide.code_blocks(text) if lang == "python"]
        assert html.count('<pre data-runs="true">') == sum(map(guide.runs, python))  # a block not run says so
        for section, anchor in zip(page.sections, guide.section_anchors(page)):
            assert f'<section id="{anchor}">' in html
            assert any(e["href"] == f"{page.href}#{anchor}" and e["name"] == section.title for e in found), section
    locks = [e for e in found if "fcntl.flock" in e.get("text", "")]
    assert locks and all(e["href"].startswith("guide-caching.html#") for e in locks)
    assert search_index.unpack_search(search_index.pack_search(search)) == search


def test_the_moved_facts_live_in_the_manual() -> None:
    """What the README said before it became a front door, in the pages it moved to (a sample of each)."""
    moved = {"getting-started": ["constraints.txt", "tests/test_wheel.py", "NNATLAS_SPECS", "check=False"],
             "concepts": ["OutOfOrderError", "PaddingWarning", "route_kernels", "disable_adapter",
                          "test_pattern_recomputed_equals_eager", "grad_soak"],
             "caching": ["--resume", "fcntl.flock", "nnatlas-cache/2", "verify=\"content\""],
             "tensor-parallel": ["save(local=True)", "moe_tp_experts", "device_map"],
             "verification": ["atol 0", "tiny.factors", "--stale", "status --tp"],
             "cli": [".nnatlas-site", "a 400 for a NUL"], "contributing": ["identities+:", "drafts/TYPE.failing.yaml"],
             "architecture": ["TorchFunctionMode", "0.44–0.67×", "user_specs.py"]}
    for name, facts in moved.items():
        text = " ".join(GUIDES[name].split())
        for fact in facts:
            assert fact in text, f"docs/{name}.md: {fact}"
