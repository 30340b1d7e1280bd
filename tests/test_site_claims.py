"""What the site claims agrees with what each family's own page and spec say (issue 30): the index's
matrix per load, the trait tooltips, the config cells, the diagrams' parts and the search index.

Plain reads of the committed HTML in generated/docs (no browser)."""

from __future__ import annotations

import re
from functools import cache
from html import unescape

import pytest

from nnatlas.compiler import compile_atlas, default_root
from nnatlas.compiler.emit import pages, search_index, templating

ROOT = default_root()
DOCS = ROOT / "generated" / "docs"
FAMILIES = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml") if not p.stem.startswith("_"))


@cache
def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@cache
def _atlas():  # type: ignore[no-untyped-def]
    return compile_atlas(ROOT / "specs", ROOT)


def _family(name: str):  # type: ignore[no-untyped-def]
    return next(f for f in _atlas().families if f.name == name)


# ---- the matrix, per load, against each family page's support() tables ----

ROW = re.compile(r'<tr id="v-[^"]+"(?: class="(conditional|missing)")?>\s*<td><code>(?:⚠︎)?([A-Za-z0-9_]+)</code></td>'
                 r'\s*<td>.*?</td>\s*<td>(.*?)</td>', re.S)


def _page_marks(name: str) -> tuple[bool, dict[str, tuple[str, ...]]]:
    """(whether the page names an image-text load, value → (text-only mark, image-text mark)) as the
    family page's own rows say it: a value that needs or is served by the image-text load is not served
    on a text-only one; one no load serves is ○; one that needs another load ⚠︎; the rest ●."""
    html = _text(f"{name}.html")
    support = html[html.index('<section id="support"'):html.index('<section id="notes"')]
    rows: dict[str, list[tuple[str, str]]] = {}
    image = False
    for cls, value, what in ROW.findall(support):
        if cls == "missing":
            continue
        what = unescape(re.sub(r"<[^>]+>", " ", what))
        if "image-text load" in what:
            image = True
            pair = ("○", "●")
        elif "not served under any load" in what:
            pair = ("○", "○")
        elif cls == "conditional":
            pair = ("⚠︎", "⚠︎")
        else:
            pair = ("●", "●")
        rows.setdefault(value, []).append(pair)
    rank = {"●": 0, "⚠︎": 1, "○": 2}
    best = {v: tuple(min((p[k] for p in pairs), key=rank.__getitem__) for k in (0, 1)) for v, pairs in rows.items()}
    return image, best


def _matrix_cells() -> dict[tuple[str, str], str]:
    html = _text("matrix.html")
    matrix = html[html.index('<section id="matrix"'):]
    cells = {}
    for value, row in re.findall(r"<tr><td><code>([A-Za-z0-9_]+)</code></td>(.*?)</tr>", matrix, re.S):
        for fam, cell in re.findall(r'<td data-col-family="([a-z0-9_]+)">(.*?)</td>', row):
            cells[(value, fam)] = cell
    return cells


def test_the_matrix_marks_each_load_as_the_family_page_says_for_every_family() -> None:
    cells = _matrix_cells()
    values = {v for v, _ in cells}
    for name in FAMILIES:
        image, marks = _page_marks(name)
        for value in values:
            cell = cells[(value, name)]
            if value not in marks:
                assert cell == "", (name, value, cell)
                continue
            spans = re.findall(r"<span data-load=\"([a-z-]+)\">", cell)
            if image:
                got = tuple(re.findall(r'<span data-load="[a-z-]+">([^<]*)</span>', cell))
                assert spans == ["text-only", "image-text"], (name, value, cell)
                assert got == marks[value], (name, value, cell, marks[value])
            else:
                mark = re.sub(r"<[^>]+>", "", cell)
                assert mark == marks[value][0], (name, value, cell, marks[value])
    # the issue's cases: the vision values are not served on a text-only load, on every family that has them
    for fam in ("qwen3_vl", "qwen3_5_text", "qwen2_vl", "llava", "gemma3"):
        for value in ("image_features", "patch_embeddings", "image_token_mask"):
            cell = cells[(value, fam)]
            assert '<span data-load="text-only">○</span><span data-load="image-text">●</span>' in cell, (fam, value)
    assert '<span class="mark none">○</span> not served on that load' in _text("matrix.html")


# ---- traits: a tooltip names only a mixer the family's own words name ----

MIXERS = ("DeltaNet", "Mamba", "short convolution", "short-convolution", "RG-LRU")


def test_trait_tooltips_name_only_the_mixers_the_family_has() -> None:
    for name in FAMILIES:
        f = _family(name)
        own = f"{f.title} {f.summary} {f.docstring}".lower()
        tips = re.findall(r'<li class="chip" tabindex="0">([^<]*)<span class="tip">([^<]*)</span>', _text(f"{name}.html"))
        assert [t for t, _ in tips] == [t for t, _ in f.traits], name
        for trait, tip in tips:
            for mixer in MIXERS:
                if mixer.lower() in unescape(tip).lower():
                    assert mixer.lower() in own, (name, trait, mixer)
    hybrid = dict(_family("bamba").traits)["Hybrid"]
    assert "DeltaNet" not in hybrid and "Gated DeltaNet" in dict(_family("qwen3_5_text").traits)


# ---- config cells: a value or "not served", never the exception a printout met ----

def test_no_page_shows_an_exception_in_place_of_a_config_value() -> None:
    pages = sorted(DOCS.glob("*.html")) + sorted(DOCS.glob("*.md"))
    assert len(pages) > 2 * len(FAMILIES)
    for page in pages:
        hit = re.search(r"error: [A-Z][A-Za-z]*", page.read_text(encoding="utf-8"))
        assert hit is None, (page.name, hit.group(0) if hit else "")
    vision = _text("qwen3_vl.html")
    row = re.search(r"<tr><td><code>model\.vision\.image_size</code></td><td><code>([^<]*)</code></td>(.*?)</tr>", vision)
    assert row is not None and "no one image size" in row.group(1)
    assert set(re.findall(r"<td>([^<]*)</td>", row.group(2))) == {"not served"}
    sizes = _text("index.html")
    mamba = re.search(r'<tr><td><a href="mamba\.html#sizes">mamba</a></td>(.*?)</tr>', sizes)
    assert mamba is not None and mamba.group(1).count("<td>not served</td>") == 3  # heads, kv heads, head_dim


def test_the_readout_note_names_nnatlas_own_call_not_another_librarys() -> None:
    # no page introduces nnterp: a stray mention of its project_on_vocab sat in qwen3_5_text's readout note
    for page in sorted(DOCS.glob("*.html")) + sorted(DOCS.glob("*.md")):
        assert "nnterp" not in page.read_text(encoding="utf-8"), page.name
    html = _text("qwen3_5_text.html")
    note = html.split("<h3>The readout is the plain projection</h3>", 1)[1].split("</article>", 1)[0]
    assert "model.unembed(x) is this projection" in " ".join(note.split())


# ---- a family that loads an image-text class draws its vision encoder and says so in its traits ----

VISION_TRAITS = ("Vision-language", "Packed vision encoder", "Variable resolution", "Pooled projector")


def test_every_image_text_family_has_its_vision_traits_and_its_vision_section() -> None:
    image_text = [name for name in FAMILIES if any(c.endswith("ForConditionalGeneration") for c in _family(name).classes)]
    assert "qwen3_5_moe_text" in image_text and "qwen3_5_text" in image_text
    for name in image_text:
        html = _text(f"{name}.html")
        assert "Vision-language" in dict(_family(name).traits), name
        assert '<section id="vision" class="stack" data-stack="vision.layers">' in html, name
        assert '<a href="#vision">the vision encoder</a>' in html, name
    moe, dense = dict(_family("qwen3_5_moe_text").traits), dict(_family("qwen3_5_text").traits)
    assert [t for t in VISION_TRAITS if t in moe] == [t for t in VISION_TRAITS if t in dense] == list(VISION_TRAITS)
    assert "Mixture of experts" in moe and "Gated DeltaNet" in moe
    hosts = {h.path: h.cls for h in _family("qwen3_5_moe_text").hosts}
    assert hosts["vision"] == "Qwen3_5MoeVisionModel" and hosts["vision.layers[i]"] == "Qwen3_5MoeVisionBlock"


# ---- the block diagrams against the block identities, every family and kind ----

def _kinds(name: str):  # type: ignore[no-untyped-def]
    """(stack, kind, the kind's hosts) of the family's page model, as the page draws them."""
    f = _family(name)
    printout = DOCS / "printouts" / f"{name}.txt"
    ctx = pages.page_context(f, _atlas(), printout.read_text(encoding="utf-8") if printout.exists() else None)
    for s in ctx["stacks"]:
        rows = ctx["model"].block_hosts(s.name)
        for kind in s.kinds:
            yield s, kind, [f.hosts[x] for x in rows[kind.blocks[0]]]


def test_every_block_drawing_agrees_with_its_identities() -> None:
    undrawn = {}  # dbrx's norms inside norm_attn_norm and zamba2's shared block were left out until the generator drew them
    for name in FAMILIES:
        for s, kind, hosts in _kinds(name):
            lay = [h for h in hosts if h.path == f"{s.name}[i]"]
            children = {h.path[len(s.name) + 4:].split(".")[0] for h in hosts if h.path.startswith(f"{s.name}[i].")}
            texts = [i.text for h in lay for i in h.identities]
            drawn = {c.name for p in kind.parts for c in [p.value, *p.others] if c is not None}
            names = {p.std for p in kind.parts}
            where = (name, s.name, kind.index)
            for p in kind.parts:
                if p.role == "mul":  # a product drawn is a factor of an identity of the block
                    assert p.value is not None and any(f"* {p.value.name}" in t for t in texts), where
                if p.role == "add" and p.value is not None and p.value.name != "layer_output":
                    assert any(p.value.name in t and "+" in t for t in texts), (where, p.value.name)
                if p.role == "add" and p.value is None and "+" in p.subtitle:  # a sum drawn is a side of an identity
                    assert any(p.subtitle in [x.strip() for x in t.split("==")] for t in texts), (where, p.subtitle)
            for t in texts:  # each child host a block identity names is drawn
                for head in re.findall(r"(?<![\w.])([a-z_]+)\.[a-z_]+", t.split("==")[0] + "==" + t.split("==")[-1]):
                    if head in children:
                        assert head in names, (where, head, t)
            left = {v.name for h in lay for v in h.values if v.missing is None} - drawn
            if left:
                undrawn[(name, kind.index)] = left
            if any("* layer_scalar" in t for t in texts):  # a block scaled at its end draws the product
                assert [p.std for p in kind.parts][-2:] == ["×", "out"], where
    assert undrawn == {}


def _drawn(name: str, kind: int) -> list[tuple[str, str]]:
    parts = next(k for s, k, _ in _kinds(name) if s.name == "layers" and k.index == kind).parts
    return [(p.std, p.value.name if p.value else p.subtitle) for p in parts]


def test_the_diagrams_the_issue_names() -> None:
    # jamba: pre_ff_layernorm drawn, the middle add is layer_mid
    for k in range(2):
        assert ("pre_ff_layernorm", "mlp_norm_output") in _drawn("jamba", k)
        assert ("+", "layer_mid") in _drawn("jamba", k) and ("+", "residual add") not in _drawn("jamba", k)
    # deepseek_v3 (and glm4_moe, ernie4_5_moe): the dense blocks draw their MLP, a kind of the mlp host
    for fam, cls in (("deepseek_v3", "DeepseekV3MLP"), ("glm4_moe", "Glm4MoeMLP"), ("ernie4_5_moe", "Ernie4_5_MoeMLP")):
        first = next(k for s, k, _ in _kinds(fam) if s.name == "layers" and 0 in k.blocks)
        assert ("mlp", "mlp_output") in [(p.std, p.value.name if p.value else "") for p in first.parts], fam
        assert f"mlp: {cls}" in first.label, fam
        assert "layer_input + self_attn.attention_output + mlp.mlp_output == layer_output" in first.identities, fam
    # gemma4_text: per_layer_input multiplies the branch, layer_scalar the block, before the output
    ple = _drawn("gemma4_text", 0)
    assert ple[-7:] == [("per_layer_input_gate", "no value served"), ("×", "per_layer_input"),
                        ("per_layer_projection", "no value served"), ("post_per_layer_input_norm", "per_layer_output"),
                        ("+", "residual add"), ("×", "layer_scalar"), ("out", "layer_output")]
    # opt: no MLP module, the block's own fc1, activation and fc2
    assert _drawn("opt", 0)[-4:] == [("up_proj", "mlp_input"), ("act_fn", "mlp_activation"),
                                     ("down_proj", "mlp_output"), ("+", "layer_output")]
    # dbrx: the first norm inside norm_attn_norm, the add that is layer_mid, the wrapper's element 1 the MLP's norm
    assert _drawn("dbrx", 0) == [("x", "layer_input"), ("norm_1", "attention_norm_output"), ("self_attn", "attention_output"),
                                 ("+", "layer_mid"), ("norm_attn_norm", "mlp_norm_output"), ("mlp", "mlp_output"),
                                 ("+", "layer_output")]
    # zamba2's hybrid block: the shared transformer through linear joins the mixer's input, not the residual
    assert _drawn("zamba2", 1) == [("x", "layer_input"), ("shared_transformer", ""), ("linear", "shared_block_output"),
                                   ("+", "layer_input + shared_block_output"), ("input_layernorm", "mixer_norm_output"),
                                   ("mamba", "mixer_output"), ("+", "layer_output")]
    assert _drawn("zamba2", 0) == [("x", "layer_input"), ("input_layernorm", "mixer_norm_output"), ("mamba", "mixer_output"),
                                   ("+", "layer_output")]
    # a Mamba block draws its norm and mixer (a host named mixer is a mixer)
    assert _drawn("mamba", 0) == [("x", "layer_input"), ("norm", "mixer_norm_output"), ("mixer", "mixer_output"),
                                  ("+", "layer_output")]


@pytest.mark.parametrize(("item", "message"), [
    ("mul:no_such_value", "'mul:no_such_value': 'no_such_value' is no value of layers\\[i\\]"),
    ("mlp if no_such_value", "'mlp if no_such_value': 'no_such_value' is no value of layers\\[i\\]"),
])
def test_a_diagram_product_or_condition_names_a_value_of_the_block(tmp_path, item: str, message: str) -> None:  # type: ignore[no-untyped-def]
    import shutil

    from nnatlas.compiler import SpecError

    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    text = (ROOT / "specs" / "llama.yaml").read_text(encoding="utf-8")
    block = f"[input_layernorm, mixer, add, post_attention_layernorm, mlp, add, '{item}']"
    (specs / "llama.yaml").write_text(text + f"\ndiagram:\n  block: {block}\n", encoding="utf-8")
    with pytest.raises(SpecError, match=message):
        compile_atlas(specs, tmp_path)


# ---- the search: real names resolve; its entries load on first use, not with the index ----

def _variants(q: str) -> list[str]:
    """The query as typed and with block indices made generic, as atlas.js's variants() makes them."""
    out = [q]
    for v in (re.sub(r"\.(\d+)(?=\.|$)", "[i]", re.sub(r"\[\d+\]", "[i]", q)),
              re.sub(r"\.(\d+)(?=\.|$)", ".{i}", re.sub(r"\[\d+\]", ".{i}", q))):
        if v not in out:
            out.append(v)
    return out


@cache
def _entries() -> list[dict[str, str]]:
    return search_index.read_search_script(_text("search.js"))


def _search(q: str) -> list[dict[str, str]]:
    entries = _entries()
    vs = _variants(q.lower())
    return [e for e in entries if any(v in e.get("text", e["name"]).lower() for v in vs)]


def test_the_search_resolves_concrete_names_to_the_family_and_the_standard_value() -> None:
    js = _text("atlas.js")
    assert 'q.replace(/\\[\\d+\\]/g, "[i]").replace(/\\.(\\d+)(?=\\.|$)/g, "[i]")' in js  # the variants _variants mirrors
    hits = _search("blocks.0.attn.hook_pattern")
    assert {"llama", "gpt2", "qwen3_5_text"} <= {e["family"] for e in hits}
    assert {e["kind"] for e in hits if e["family"] == "llama"} == {"is model.layers[i].self_attn.attention_probabilities"}
    hits = _search("model.model.layers[0].self_attn.o_proj")
    assert {"attention_premix"} <= {e["name"] for e in hits if e["family"] == "llama"}
    hits = _search("transformer.h[0].attn")
    assert ("gpt2", "GPT2Attention", "native class") in {(e["family"], e["name"], e["kind"]) for e in hits}
    assert "attention_output" in {e["name"] for e in hits if e["family"] == "gpt2"}
    for ckpt, fam in (("Qwen/Qwen3.5-0.8B", "qwen3_5_text"), ("openai-community/gpt2", "gpt2")):
        assert [(e["family"], e["kind"]) for e in _search(ckpt)] == [(fam, "checkpoint")]
    assert ("qwen3_5_text", "load class") in {(e["family"], e["kind"]) for e in _search("Qwen3_5ForConditionalGeneration")}
    assert "gpt2" in {e["family"] for e in _search("model.transformer.h.3.mlp")}  # a named_modules path


def test_the_index_loads_its_search_entries_on_first_use_and_links_its_matrix() -> None:
    index = _text("index.html")
    assert "nnatlasSearch" not in index and 'id="atlas-index"' not in index
    assert 'data-index="search.js"' in index
    assert len(index.encode()) < 300_000  # 1.8 MB with the search entries and the matrix inline
    # search.js packs its entries, each kept whole: about 10.5 KB a family packed (759,598 bytes at 72 families),
    # against about 21 KB as one object per entry (1.54 MB at 71); the budget grows with the families, not past it.
    # Beside them the manual's sections, each with its words once (about 50 KB for docs/ and the cookbook)
    search = _text("search.js")
    manual = [e for e in _entries() if e["family"] == "manual"]
    guide_bytes = len(templating.script_json(search_index.pack_search(manual), compact=True).encode())
    assert guide_bytes < 80_000 and manual
    assert len(search.encode()) - guide_bytes < 11_000 * len(FAMILIES) and '["x",' not in search
    assert len(_entries()) > 4000 and search_index.unpack_search(search_index.pack_search(_entries())) == _entries()
    assert '<a href="matrix.html">the matrix</a>' in index and '<table class="matrix"' not in index
    matrix = _text("matrix.html")
    assert '<select id="matrix-family">' in matrix and matrix.count('<option value="') == len(FAMILIES) + 1
    js = _text("atlas.js")
    assert 'script.src = search.getAttribute("data-index")' in js and "setTimeout(function () { timer = null; update(); }" in js


# ---- papers: specs/_papers.yaml names recorded checkpoints, with an arXiv id or {none: why} ----

def test_papers_cover_every_checkpoint_and_a_bad_entry_is_one_spec_error() -> None:
    from nnatlas.compiler import SpecError, compile_texts

    papers = dict(_atlas().papers)
    checkpoints = {c.name for f in _atlas().families for c in f.checkpoints}
    listed = set(re.findall(r"^([^#\s][^:]*):", (ROOT / "specs" / "_papers.yaml").read_text(encoding="utf-8"), re.M))
    assert listed == checkpoints  # each with its paper, or a note that none is known
    assert papers["mistralai/Mistral-7B-v0.1"] == "2310.06825" and "openai-community/gpt2" not in papers
    assert 'href="https://arxiv.org/abs/2310.06825"' in _text("mistral.html")
    assert 'href="https://huggingface.co/openai-community/gpt2"' in _text("gpt2.html")
    texts = {n: (ROOT / "specs" / n).read_text(encoding="utf-8") for n in ("_vocabulary.yaml", "llama.yaml")}
    texts["_papers.yaml"] = "meta-llama/Llama-3.2-1B: arxiv.org/abs/1\nnot/a-checkpoint: {none: 3}\n"
    with pytest.raises(SpecError) as e:
        compile_texts(texts)
    text = str(e.value)
    assert "specs/_papers.yaml:1:" in text and "an arXiv id" in text
    assert "specs/_papers.yaml:2:" in text and "'not/a-checkpoint': an arXiv id" in text
