"""The site's build: printouts recomputed equal the committed ones, staleness from headers, escaping, docs."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, build_site, compile_atlas, default_root, plan_printouts, printout_key
from nnatlas.compiler.emit import emit, pages
from nnatlas.compiler.emit import printouts as P

ROOT = default_root()


def test_recomputed_printouts_equal_the_committed_files() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    with_ckpt = [f for f in atlas.families if f.checkpoints]
    assert with_ckpt
    for f in with_ckpt:
        committed = (ROOT / P.path_for(f.name)).read_text(encoding="utf-8")
        key = printout_key(f, atlas)
        assert P.is_fresh(committed, f, key), f"{f.name}: committed printout is stale; run `make generate`"
        fresh = P.compute(f, emit.render_family(f), key)
        assert fresh == committed
        names = [n for n, _ in P.body(fresh)]
        assert names == [c.name for c in f.checkpoints]
        head = P.parse_header(fresh)
        assert head is not None and head.spec_sha256 == f.sha256
        facts = head.facts["checkpoints"][0]
        assert facts["normalized"]["num_layers"] == len(facts["blocks"]["layers"])


def test_printout_follows_the_native_module_order() -> None:
    text = (ROOT / P.path_for("llama")).read_text(encoding="utf-8")
    printout = P.body(text)[0][1]
    tops = [line.split(")")[0].strip("( ") for line in printout.splitlines() if line.startswith("  (") and "->" not in line]
    assert tops[:4] == ["lm_head", "embed_tokens", "layers", "norm"]
    assert "    (0-15): 16 x LlamaDecoderLayer(\n      (self_attn): LlamaAttention(" in printout


def test_staleness_is_read_from_the_header_alone() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    f = next(f for f in atlas.families if f.name == "llama")
    text = (ROOT / P.path_for("llama")).read_text(encoding="utf-8")
    key = printout_key(f, atlas)
    assert P.is_fresh(text, f, key)
    assert not P.is_fresh(text, f, "0" * 64)
    assert not P.is_fresh(text.replace(f.sha256, "f" * 64), f, key)
    assert not P.is_fresh(text.replace("transformers ", "transformers 0.0.", 1), f, key)
    assert not P.is_fresh("hand-written\n", f, key)
    assert not P.is_fresh(None, f, key)


def test_check_reports_a_stale_printout_without_computing(tmp_path: Path) -> None:
    import shutil

    root = tmp_path
    shutil.copytree(ROOT / "specs", root / "specs")
    shutil.copytree(ROOT / "generated", root / "generated", ignore=shutil.ignore_patterns("__pycache__"))
    atlas = compile_atlas(root / "specs", root)
    texts, stale = plan_printouts(root, atlas, compute=False)
    assert stale == [] and set(texts) == {f.name for f in atlas.families}  # (one without a checkpoint: its header)
    target = root / P.path_for("llama")
    target.write_text(target.read_text(encoding="utf-8").replace("transformers ", "transformers 0.", 1), encoding="utf-8")
    from nnatlas.compiler import generate

    result = generate(root, check=True)
    assert P.path_for("llama") in result.changed and "stale" in result.diff
    assert target.exists()


def test_a_diagram_naming_an_unknown_part_is_a_spec_error(tmp_path: Path) -> None:
    import shutil

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    shutil.copy(ROOT / "specs" / "llama.yaml", specs)
    (specs / "llama_diag.yaml").write_text(
        "family: llama_diag\nextends: llama\ndiagram:\n  block: [input_layernorm, mixer, add, post_norm, mlp, add]\n",
        encoding="utf-8")
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert "specs/llama_diag.yaml:4:" in str(e.value) and "'post_norm'" in str(e.value)
    (specs / "llama_diag.yaml").write_text(
        "family: llama_diag\nextends: llama\ndiagram:\n  block: [input_layernorm, self_attn, add, post_attention_layernorm, mlp, add]\n",
        encoding="utf-8")
    atlas = compile_atlas(specs, tmp_path)
    f = next(f for f in atlas.families if f.name == "llama_diag")
    html = pages.render_page(f, atlas)
    assert 'data-std="attention_output"' in html


def test_every_generated_page_has_a_markdown_twin_and_llms_txt_lists_them() -> None:
    docs = ROOT / "generated" / "docs"
    llms = (docs / "llms.txt").read_text(encoding="utf-8")
    for page in docs.glob("*.html"):
        # spec.md is docs/spec.md, the cookbook's is docs/cookbook.md (its source); the status page's twin is status.json;
        # the matrix gathers the families' support() tables, each in its family's twin; the API reference's source is
        # the runtime's docstrings
        # a page of the manual (guide-NAME.html) is docs/NAME.md
        if page.stem in ("index", "spec", "status", "cookbook", "matrix", "api") or page.stem.startswith("guide-"):
            continue
        md = (docs / f"{page.stem}.md").read_text(encoding="utf-8")
        assert md.count("```") % 2 == 0
        assert f"# family {page.stem}" in md and re.search(r"^## \d+ · support\(\)$", md, re.M)
        assert f"({page.stem}.md)" in llms


def test_no_remote_reference_in_the_site() -> None:
    """Nothing is loaded from outside; the only outside addresses are links to a checkpoint's hub page and paper."""
    hub = re.compile(r'<a href="https://(huggingface\.co/[\w.-]+(?:/[\w.-]+)?|arxiv\.org/abs/\d{4}\.\d{4,5})" rel="external">')
    for page in (ROOT / "generated" / "docs").glob("*.html"):
        text = hub.sub("", page.read_text(encoding="utf-8"))
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, page.name


def test_docs_builds_one_folder_and_serves_on_loopback(tmp_path: Path) -> None:
    out = tmp_path / "site"
    written = build_site(out, ROOT)
    assert {"index.html", "llama.html", "llama.md", "llms.txt", "atlas.css", "atlas.js"} <= set(written)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "nnatlas.compiler.cli", "docs", "--out", str(out), "--serve",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = b""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/llama.html", timeout=2) as r:
                    body = r.read()
                break
            except OSError:
                time.sleep(0.2)
        assert b"family llama" in body
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    out_text = proc.stdout.read() if proc.stdout else ""
    assert "serving" in out_text and "127.0.0.1" in out_text


def test_a_hybrid_block_kind_draws_only_its_own_mixer() -> None:
    """qwen3_next: a DeltaNet block has linear_attn and no self_attn, an attention block the reverse."""
    import re

    page = (ROOT / "generated" / "docs" / "qwen3_next.html").read_text()
    labels = re.findall(r'class="kind kind-\d+" data-kind="\d+" data-label="([^"]*)"', page)
    assert labels == ["linear_attn: Qwen3NextGatedDeltaNet · mlp: Qwen3NextSparseMoeBlock",
                      "self_attn: Qwen3NextAttention · mlp: Qwen3NextSparseMoeBlock"]
