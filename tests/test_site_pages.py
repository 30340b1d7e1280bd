"""What the committed pages say (issue 17): the image-text build of qwen3_5_text, qwen3_vl's checkpoints,
the matrix, the sizes and "coming from" tables, and Markdown twins that render as their HTML pages do."""

from __future__ import annotations

import re
from functools import cache
from html import unescape

import pytest

from nnatlas.compiler import compile_atlas, default_root
from nnatlas.compiler.emit import config_words, emit, page_model, pages
from nnatlas.compiler.emit import printouts as P

ROOT = default_root()
DOCS = ROOT / "generated" / "docs"
FAMILIES = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml") if not p.stem.startswith("_"))  # every family's page


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _cells(row: str) -> list[str]:
    """A GFM table row's cells: split at the pipes a backslash does not escape, as GFM does."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


@cache
def _atlas():  # type: ignore[no-untyped-def]
    return compile_atlas(ROOT / "specs", ROOT)


def _family(name: str):  # type: ignore[no-untyped-def]
    return next(f for f in _atlas().families if f.name == name)


def _facts(name: str) -> dict:  # type: ignore[type-arg]
    head = P.parse_header(_text(f"printouts/{name}.txt"))
    assert head is not None
    return head.facts


# ---- qwen3_5_text on the image-text wrapper, like the seed ----

def test_qwen3_5_text_is_built_on_the_image_text_wrapper_with_the_seeds_vision_config() -> None:
    facts = _facts("qwen3_5_text")["checkpoints"][0]
    assert facts["class"] == "Qwen3_5ForConditionalGeneration"
    assert len(facts["blocks"]["vision.layers"]) == 12
    n = facts["normalized"]
    seed = {"vision_num_layers": 12, "vision_hidden_size": 768, "vision_num_heads": 12, "vision_head_dim": 64,
            "vision_intermediate_size": 3072, "vision_patch_size": 16, "vision_spatial_merge_size": 2}
    assert {k: n[k] for k in seed} == seed
    html = _text("qwen3_5_text.html")
    rows = dict(re.findall(r"<tr><td><code>(model\.vision\.[a-z_]+)</code></td><td><code>[^<]*</code></td><td>([^<]*)</td>",
                           html))
    assert rows["model.vision.num_layers"] == "12" and rows["model.vision.vision_hidden_size"] == "768"
    assert rows["model.vision.head_dim"] == "64" and rows["model.vision.intermediate_size"] == "3072"
    printout = P.body(_text("printouts/qwen3_5_text.txt"))[0][1]
    assert "(vision/visual): Qwen3_5VisionModel(" in printout
    assert "(projector/merger): Qwen3_5VisionPatchMerger(" in printout
    assert "(0-11): 12 x Qwen3_5VisionBlock(" in printout


def test_qwen3_5_text_vision_path_and_no_warning_on_what_the_image_text_load_serves() -> None:
    html = _text("qwen3_5_text.html")
    vision = html[html.index('<section id="vision"'):html.index('<section id="sizes"')]
    chain = vision[vision.index('<div class="chain">'):vision.index('<div class="picker">')]
    names = [unescape(x) for x in re.findall(r'<span class="part-name">([^<]+)', chain)]
    assert [x.strip() for x in names] == ["image", "patch_embed", "layers", "projector", "image_features", "layers[0].input"]
    assert "× 12" in chain and "tower_output" in chain and "at image_token_mask" in chain
    support = html[html.index('<section id="support"'):html.index('<h3 id="printout-1"')]
    vision_rows = re.findall(r'<tr id="(v-vision[^"]*)"( class="[a-z]+")?>\s*<td><code>(⚠︎)?', support)
    assert len(vision_rows) >= 20
    warned = [a for a, _, w in vision_rows if w]
    # only the values no load serves (the vision encoder computes no pattern) keep their ⚠︎
    assert warned == [a for a in warned if "attention_scores" in a or "attention_probabilities" in a]
    assert "served by the image-text load" in support


# ---- qwen3_vl ----

def test_qwen3_vl_has_one_config_column_per_release_standard_names_and_a_drawn_deepstack() -> None:
    f = _family("qwen3_vl")
    assert [c.name for c in f.checkpoints] == [f"Qwen/Qwen3-VL-{s}-Instruct" for s in ("2B", "4B", "8B", "32B")]
    facts = {c["name"]: c for c in _facts("qwen3_vl")["checkpoints"]}
    heads = {name.split("-")[2]: (c["normalized"]["num_heads"], c["normalized"]["num_kv_heads"]) for name, c in facts.items()}
    assert heads == {"2B": (16, 8), "4B": (32, 8), "8B": (32, 8), "32B": (64, 8)}  # the seed's numbers
    printout = P.body(_text("printouts/qwen3_vl.txt"))[1][1]
    assert "  (language_model): Qwen3VLTextModel(\n    (embed_tokens)" in printout
    assert "(layer_output) -> Residual" in printout and "(deepstack_output) -> " in printout
    assert "(projector/merger): Qwen3VLVisionPatchMerger(" in printout
    html = _text("qwen3_vl.html")
    block = html[html.index('<section id="block"'):html.index('<section id="vision"')]
    kinds = re.findall(r'<div class="kind kind-(\d)" data-kind="\d" data-label="([^"]*)"', block)
    assert "deepstack" in kinds[0][1] and "deepstack" not in kinds[1][1]
    first = block[block.index('data-kind="0"'):block.index('data-kind="1"')]
    assert "deepstack_output" in first
    assert re.search(r'data-blocks="0,0,0,1,', block)
    vision = html[html.index('<section id="vision"'):html.index('<section id="sizes"')]
    assert '<span class="part-name">projector' in vision


# ---- the index ----

def test_the_matrix_warns_only_where_the_text_value_is_conditional_and_has_a_legend() -> None:
    html = _text("matrix.html")
    matrix = html[html.index('<section id="matrix"'):]
    assert 'class="legend"' in matrix.split("<table")[0]

    def cell(value: str, family: str) -> str:
        row = re.search(rf"<tr><td><code>{value}</code></td>(.*?)</tr>", matrix, re.S)
        assert row is not None
        c = re.search(rf'<td data-col-family="{family}">(.*?)</td>', row.group(1))
        assert c is not None
        return c.group(1)

    for fam in ("qwen3_5_text", "qwen3_vl"):
        for value in ("layer_output", "attention_output", "mlp_output", "mlp_input", "layer_input"):
            assert "●" in cell(value, fam), (fam, value)
        assert "●" in cell("attention_probabilities", fam)  # recomputed under sdpa: served on every load
    assert "●" in cell("attention_probabilities", "falcon")  # its own code's sdpa call: recomputed (recompute: sdpa)
    assert "●" in cell("patch_embeddings", "qwen3_5_text")  # the page's image-text load serves it
    assert cell("router_logits", "llama") == ""


def test_sizes_are_counted_on_the_meta_device_for_every_checkpoint_on_each_page_and_the_index() -> None:
    index = _text("index.html")
    for name in FAMILIES:
        f = _family(name)
        facts = _facts(name) if f.checkpoints else {"checkpoints": []}
        for c in facts["checkpoints"]:
            assert isinstance(c["parameters"], int) and c["parameters"] > 10**6
            assert f'data-parameters="{c["parameters"]}"' in _text(f"{name}.html")
            assert f'data-parameters="{c["parameters"]}"' in index
    counts = {c["name"]: c["parameters"] for c in _facts("qwen3_next")["checkpoints"]}
    assert 79e9 < next(iter(counts.values())) < 81e9  # Qwen3-Next-80B, tied tensors once
    assert config_words.param_text(752_393_024) == "752.4 M" and config_words.param_text(79_674_391_296) == "79.67 B"


@pytest.mark.parametrize("name", FAMILIES)
def test_coming_from_maps_transformer_lens_and_nnsight_names_to_values_the_family_serves(name: str) -> None:
    f = _family(name)
    head = P.parse_header(_text(f"printouts/{name}.txt")) if (DOCS / f"printouts/{name}.txt").exists() else None
    rows = page_model.PageModel(f, head.facts if head else None).coming_from()
    served = {(h.path, v.name) for h in f.hosts for v in h.values if v.missing is None}
    assert rows and all(any(r["nnatlas"] == (f"model.{p}.{v}" if p != "model" else f"model.{v}") for p, v in served)
                        for r in rows)
    tl = {r["tl"]: r for r in rows}
    assert tl["blocks.{i}.hook_resid_post"]["nnatlas"] == "model.layers[i].layer_output"
    assert tl["blocks.{i}.hook_resid_pre"]["nnatlas"] == "model.layers[i].layer_input"
    if ("layers[i].mlp", "mlp_output") in served:  # not on attention-free or MLP-less blocks (mamba, opt)
        assert tl["blocks.{i}.hook_mlp_out"]["nnatlas"] == "model.layers[i].mlp.mlp_output"
    # a block returning a tuple (bloom, falcon, ...) gives the stream as its output's first item
    assert re.fullmatch(r"model\.[a-z_.]+\[i\]\.output(\[0\])?", tl["blocks.{i}.hook_resid_post"]["nnsight"])
    page = _text(f"{name}.html")
    assert page.count("<td><code>blocks.{i}.hook_resid_post</code></td>") == 1
    md = _text(f"{name}.md")
    assert "| `blocks.{i}.hook_resid_post` |" in md


def test_coming_from_rows_follow_the_spec() -> None:
    llama = {r["tl"]: r for r in page_model.PageModel(_family("llama"), _facts("llama")).coming_from()}
    assert llama["blocks.{i}.attn.hook_pattern"]["nnatlas"] == "model.layers[i].self_attn.attention_probabilities"
    assert not llama["blocks.{i}.attn.hook_pattern"]["warn"]  # read under eager, recomputed under sdpa
    falcon = {r["tl"]: r for r in page_model.PageModel(_family("falcon"), _facts("falcon")).coming_from()}
    assert not falcon["blocks.{i}.attn.hook_pattern"]["warn"]  # read under eager, recomputed under sdpa
    assert llama["blocks.{i}.hook_resid_post"]["nnsight"] == "model.model.layers[i].output"
    assert not llama["blocks.{i}.hook_resid_post"]["warn"]
    gpt2 = {r["tl"]: r for r in page_model.PageModel(_family("gpt2"), _facts("gpt2")).coming_from()}
    assert gpt2["blocks.{i}.hook_resid_post"]["nnsight"] == "model.transformer.h[i].output"
    vl = page_model.PageModel(_family("qwen3_vl"), _facts("qwen3_vl")).coming_from()
    assert {r["tl"]: r for r in vl}["blocks.{i}.hook_resid_post"]["nnsight"] == "model.model.language_model.layers[i].output"


def test_sae_hook_points_appear_where_the_notes_list_sae_repositories() -> None:
    html = _text("qwen3_5_text.html")
    assert "SAE-Res-Qwen3.5" in html
    points = html[html.index('id="sae-points"'):html.index('<section id="support"')]
    assert "<td><code>resid_post</code></td><td><a href=\"#" in points
    assert "model.layers[i].layer_output" in points
    assert 'id="sae-points"' not in _text("gpt2.html")


# ---- the Markdown twins ----

def test_markdown_rows_keep_their_columns_with_a_pipe_in_a_layout() -> None:
    md = _text("qwen3_5_text.md")
    row = next(line for line in md.splitlines() if line.startswith("| `state_input` |"))
    cells = _cells(row)
    assert len(cells) == 4 and cells[1] == "`State \\| None [batch heads key_dim value_dim]`"
    assert "initial_state" in cells[3]
    for name in FAMILIES:  # every table row of every twin has as many cells as its header
        lines = _text(f"{name}.md").splitlines()
        fenced = False
        width = 0
        for line in lines:
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("|"):
                width = 0 if not line.startswith("|") else width
                continue
            n = len(_cells(line))
            if width == 0:
                width = n
            assert n == width, (name, line)


def test_markdown_notes_keep_angle_brackets_as_text_and_the_fix_of_a_condition() -> None:
    md = _text("qwen3_5_text.md")
    assert "&lt;think&gt;" in md
    prose = "\n".join(md.split("```")[0::2])  # outside fenced code
    assert "<think>" not in prose and "layer<i>" not in prose
    assert "layer&lt;i&gt;.sae.pt" in prose
    row = next(line for line in md.splitlines() if line.startswith("| ⚠︎ `attention_probabilities` |"))
    assert "; fix: " in row


def test_markdown_identities_stand_apart_from_the_part_list() -> None:
    for name in FAMILIES:
        lines = _text(f"{name}.md").splitlines()
        for k, line in enumerate(lines):
            if line.startswith("Identities of this kind"):
                assert lines[k - 1] == "" and lines[k + 1] == "", name
            assert not line.startswith("Identity:"), name


def test_markdown_and_html_name_the_vision_config_alike_and_headings_draw_code() -> None:
    md = _text("qwen3_5_text.md")
    html = _text("qwen3_5_text.html")
    md_names = re.findall(r"^\| `(model\.vision\.[a-z_]+)` \|", md, re.M)
    html_names = re.findall(r"<tr><td><code>(model\.vision\.[a-z_]+)</code></td>", html)
    assert md_names and md_names == html_names
    assert "model.vision_num_layers" not in md
    assert "<h3>Sizes, and no <code>image_size</code></h3>" in html
    assert "`image_size`</h3>" not in html


def test_a_missing_value_says_so_once() -> None:
    md = _text("qwen3_next.md")
    row = next(line for line in md.splitlines() if line.startswith("| ⚠︎ `mlp_activation` |"))
    assert row.count("no activation of one width per token") == 1
    html = _text("qwen3_next.html")
    support = html[html.index('<section id="support"'):html.index('<h3 id="printout-1"')]
    tr = re.search(r'<tr id="v-layers[^"]*mlp_activation" class="missing">(.*?)</tr>', support, re.S)
    assert tr is not None and tr.group(1).count("no activation of one width per token") == 1


def test_every_page_renders_for_a_family_without_checkpoints() -> None:
    """The templates work for any family: one with no checkpoint and no printout still renders its
    sizes section, its coming-from table and a Markdown twin."""
    f = _family("gpt2")
    bare = type(f)(**{**f.__dict__, "checkpoints": ()})
    html = pages.render_page(bare, _atlas())
    md = pages.render_page_md(bare, _atlas())
    assert "This family records no checkpoint." in html and "This family records no checkpoint." in md
    assert "blocks.{i}.hook_resid_post" in html


def test_the_vision_path_says_its_facts_from_the_part() -> None:
    for name in ("qwen3_5_text", "qwen3_vl"):
        html = _text(f"{name}.html")
        vision = html[html.index('<section id="vision"'):html.index('<section id="sizes"')]
        facts = vision[vision.index('<dl class="facts">'):]
        terms = re.findall(r"<dt>([^<]+)</dt><dd>", facts[:facts.index("</dl>")])
        assert terms == ["rows", "positions", "masking", "final norm"]
        assert "no vision.norm" in vision
        assert "- **masking**: The attention runs once per image" in _text(f"{name}.md")


def test_vision_facts_need_a_vision_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from nnatlas.compiler import SpecError

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    text = (ROOT / "specs" / "llama.yaml").read_text(encoding="utf-8")
    (specs / "llama.yaml").write_text(text + "\ndiagram:\n  vision_facts: {rows: one row}\n", encoding="utf-8")
    with pytest.raises(SpecError, match="vision_facts: this family has no vision host"):
        compile_atlas(specs, tmp_path)


def test_computing_a_printout_leaves_the_specs_checkpoint_config_as_written() -> None:
    """transformers' Qwen3_5Config rewrites vision_config.model_type in place; the spec's copy must not
    change, or a generate that recomputes the printout writes another adapter than --check expects."""
    from nnatlas.compiler import printout_key

    atlas = compile_atlas(ROOT / "specs", ROOT)
    f = next(f for f in atlas.families if f.name == "qwen3_5_text")
    before = repr(f.checkpoints)
    P.compute(f, emit.render_family(f), printout_key(f, atlas))
    assert repr(f.checkpoints) == before and "'model_type': 'qwen3_5'," in before


def test_transformer_lens_attention_hooks_map_to_softmax_attention_only_and_rotary_rows_to_rotary_families() -> None:
    q35 = page_model.PageModel(_family("qwen3_5_text"), _facts("qwen3_5_text")).coming_from()
    pattern = [r["nnatlas"] for r in q35 if r["tl"] == "blocks.{i}.attn.hook_pattern"]
    assert pattern == ["model.layers[i].self_attn.attention_probabilities"]  # not the DeltaNet's
    attn_out = sorted(r["nnatlas"] for r in q35 if r["tl"] == "blocks.{i}.hook_attn_out")
    assert attn_out == ["model.layers[i].linear_attn.attention_output", "model.layers[i].self_attn.attention_output"]
    gpt2 = {r["tl"] for r in page_model.PageModel(_family("gpt2"), _facts("gpt2")).coming_from()}
    assert "blocks.{i}.attn.hook_q" in gpt2 and "blocks.{i}.attn.hook_rot_q" not in gpt2
    llama = {r["tl"] for r in page_model.PageModel(_family("llama"), _facts("llama")).coming_from()}
    assert "blocks.{i}.attn.hook_rot_q" in llama
