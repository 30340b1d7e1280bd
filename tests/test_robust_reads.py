"""Robust read points: a value read by its position among the calls of a forward (op:add#5,
op:unsqueeze#2, method:f#i) must be pinned by an identity, which catches a shift; the pages'
read-point prose says ordinals in words."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nnatlas import testing as T
from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.language import readpoint

ROOT = Path(__file__).resolve().parent.parent


def test_an_uncovered_positional_read_is_refused(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    text = (ROOT / "specs" / "llama.yaml").read_text().replace(
        "      mlp_activation: act_fn.output", "      mlp_activation: op:mul#0.input[0]")
    text = text.replace("      - mlp_activation == silu(gate_proj.output)\n", "")
    (specs / "llama.yaml").write_text(text.replace("      - mlp_neurons == mlp_activation * up_proj.output\n",
                                                   "      - mlp_output == mlp_output\n"))
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert str(e.value) == (
        "specs/llama.yaml:79:23: layers[i].mlp: mlp_activation: 'op:mul#0.input[0]' is read by its position among "
        "the calls of the forward, and no identity names mlp_activation: a transformers release that adds or removes "
        "one such call would shift the read onto another tensor unnoticed. Add an identity that pins it (to a child's "
        "boundary, a parameter or another value), or read it by name (a child's .input/.output, "
        "call:attention.args[N], fn:NAME.args.PARAM)")


def test_every_positional_read_of_the_atlas_is_pinned() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    positional = [(f.name, h.path, v.name) for f in atlas.families for h in f.hosts for v in h.values
                  if v.read is not None and v.read.by_position]
    assert ("qwen3_vl", "vision.layers[i].self_attn", "attention_queries") in positional
    # 5 vision reads in each of the two families with the Qwen3 ViT, deepstack_output: each pinned (families
    # added since have their own; the compiler refuses any that no identity pins)
    assert len([p for p in positional if p[0] in ("qwen3_vl", "qwen3_5_text")]) == 11


def test_the_vision_qkv_identities_catch_a_shift() -> None:
    """Reading the keys (the 4th unsqueeze) where the queries are (the 3rd) fails the queries' identity."""
    model = T.build("qwen3_vl")
    inputs = T.image_prompt_inputs(model.processor, 5, T.FIXED_SIZES, seed=1)
    attn = model.vision.layers[0].self_attn
    with model.trace(inputs, order="any"):
        q = attn.attention_queries.save()
        k = attn.attention_keys.save()
        v = attn.attention_values.save()
        qkv = attn.qkv.output.save()
    spec = next(h for h in model._family.hosts if h.path == "vision.layers[i].self_attn")
    config = model.normalized_config
    by_text = {i.text.split("(")[1].split("[")[0] if i.text.startswith("vnorm") else i.text.split("[")[0]: i
               for i in spec.identities[1:]}
    values = {"qkv.output": qkv, **{n: config[n] for n in ("vision_num_heads", "vision_head_dim")}}
    for name, right, wrong in (("attention_queries", q, k), ("attention_keys", k, q), ("attention_values", v, q)):
        ident = by_text[name]
        T.assert_identity(ident, *ident.check({**values, name: right}), name)  # the read as written holds
        with pytest.raises(AssertionError):  # shifted by one call, it does not
            T.assert_identity(ident, *ident.check({**values, name: wrong}), name)
    assert not torch.equal(q, k)


def test_read_point_prose_says_ordinals_in_words() -> None:
    assert readpoint.parse("op:add#5.input[1]").words == "the input of add (sixth call) inside the forward, element 1"
    assert readpoint.parse("op:cat#2.output").words == "the output of cat (third call) inside the forward"
    assert readpoint.parse("op:mul#11.output").words == "the output of mul (12th call) inside the forward"
    assert readpoint.parse("op:mul#21.output").words == "the output of mul (22nd call) inside the forward"
    pages = "".join(p.read_text() for p in (ROOT / "generated" / "docs").glob("*.md"))
    assert "call call" not in pages and "(call " not in pages
