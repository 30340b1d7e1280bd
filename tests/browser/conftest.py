"""Headless Chromium (Debian's package, driven by Playwright) and the sites the browser tests open.

Chromium comes from `apt-get install chromium` (.ci/run does it); Playwright never downloads a
browser here (`playwright install` is never run). The browser resolves no outside name.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nnatlas.compiler import build_site, compile_atlas, default_root, render

ROOT = default_root()
ARTIFACTS = ROOT / "artifacts" / "screenshots"
ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1"]

# A hybrid family for the slider, built on llama: three blocks in four are "linear", with their
# mixer at layers[i].linear_attn, the fourth keeps self_attn. Its strings try to break out of
# the HTML, the JSON in <script> and the templates.
NASTY = 'He said "hi" & \'bye\' </script><script>window.__pwned = 1</script> {{ 7 * 7 }} {% raw %}'
HYBRID_SPEC = textwrap.dedent('''\
    family: hybrid_test
    extends: llama
    title: "Hybrid test </title><script>window.__pwned = 2</script>"
    lines: ["Line \\"one\\"", "</script><script>window.__pwned = 3</script>"]
    summary: |
      NASTY
      and a second line {{ x }}
    loads: {model_types: [hybrid_test], classes: [LlamaForCausalLM]}
    rename:
      layers[i].linear_attn: self_attn
      vision: model.visual
      vision.layers: model.visual.blocks
      vision.layers[i].input_layernorm: norm1
      vision.layers[i].post_attention_layernorm: norm2
      vision.layers[i].self_attn: attn
    hosts:
      vision:
        class: VisionModel
        values:
          token_embeddings: patch_embed.output
          final_norm_output: merger.output
      vision.layers[i]:
        class: VisionBlock
        values:
          layer_input: input
          attention_norm_output: input_layernorm.output
          layer_mid: post_attention_layernorm.input
          mlp_norm_output: post_attention_layernorm.output
          layer_output: output
      vision.layers[i].self_attn:
        class: VisionAttention
        values:
          attention_output: output
      vision.layers[i].mlp:
        class: VisionMLP
        values:
          mlp_output: output
      layers[i].self_attn:
        when: "layer_types[i] == 'full_attention'"
      layers[i].linear_attn:
        class: LlamaAttention
        when: "layer_types[i] == 'linear_attention'"
        values:
          attention_output: output[0]
    checkpoints:
      - name: "test/hybrid-<b>4</b>"
        config:
          model_type: llama
          num_hidden_layers: 8
          hidden_size: 64
          intermediate_size: 128
          num_attention_heads: 4
          num_key_value_heads: 2
          vocab_size: 100
          layer_types: [linear_attention, linear_attention, linear_attention, full_attention,
                        linear_attention, linear_attention, linear_attention, full_attention]
    notes:
      - title: "A note </script> {{ y }}"
        body: |
          Text with <b>tags</b>, `code </script>` and {{ z }}.

          ```
          not python: </script><script>window.__pwned = 4</script>
          ```
    ''').replace("NASTY", NASTY.replace("\\", "\\\\"))


# A page of the manual whose every string tries the same (compiler/guide.py): title, headings, links, a table, code
NASTY_GUIDE = textwrap.dedent('''\
    # Guide </title><script>window.__pwned = 5</script>

    NASTY, with [a link](javascript:window.__pwned=6) and [another page](getting-started.md).

    ## A section </h2><script>window.__pwned = 7</script>

    ### Sub <img src=x onerror="window.__pwned = 8">

    | a `</script>` | b |
    |---|---|
    | <td>cell</td> | {{ 7 * 7 }} |

    ```python
    print("</script><script>window.__pwned = 9</script>")
    ```
    ''').replace("NASTY", NASTY)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed: `apt-get install -y --no-install-recommends chromium` (.ci/run does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def real_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site `make docs` builds, from the repository's specs."""
    out = tmp_path_factory.mktemp("site")
    build_site(out, ROOT)
    return out


@pytest.fixture(scope="session")
def test_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site from a temporary specs dir: llama, and the hybrid test family above."""
    root = tmp_path_factory.mktemp("root")
    specs = root / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        shutil.copy(ROOT / "specs" / name, specs / name)
    (specs / "hybrid_test.yaml").write_text(HYBRID_SPEC, encoding="utf-8")
    atlas = compile_atlas(specs, root)
    out = root / "site"
    for rel, text in render(atlas, guide_texts={"nasty-guide": NASTY_GUIDE}).items():
        if rel.startswith("generated/docs/"):
            target = out / rel.removeprefix("generated/docs/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    return out


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.errors = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("requestfailed", lambda r: pg.errors.append(f"failed {r.url}"))
    pg.requests = []  # type: ignore[attr-defined]  # every request but the site's own files: none expected
    pg.on("request", lambda r: pg.requests.append(r.url) if not r.url.startswith(("file:", "data:", "blob:")) else None)
    try:
        yield pg
    finally:
        ctx.close()
