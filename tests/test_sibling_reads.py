"""Values that live outside their host: ``^.`` reads a sibling's or the parent's boundary.

Gemma 2 norms the attention's and the MLP's outputs before the residual adds (sandwich norms):
its ``attention_output`` is read at ``^.post_attention_layernorm.output``, a sibling of the mixer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from nnatlas import testing as T
from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.language import readpoint
from nnatlas.compiler.language.expr import ExprError

ROOT = Path(__file__).resolve().parent.parent


def test_parse_sibling_and_parent_reads() -> None:
    r = readpoint.parse("^.post_attention_layernorm.output")
    assert (r.kind, r.module, r.side, r.up) == ("module", ("post_attention_layernorm",), "output", 1)
    assert r.words == "the sibling module post_attention_layernorm's output"
    r = readpoint.parse("^.output")
    assert (r.module, r.up, r.words) == ((), 1, "the parent module's own output")
    r = readpoint.parse("^.^.norm.input[0]")
    assert (r.module, r.up, r.access) == (("norm",), 2, (0,))
    r = readpoint.parse("^.mlp > op:mul.output")
    assert (r.kind, r.module, r.up, r.op) == ("op", ("mlp",), 1, "mul")
    assert r.words.startswith("inside the sibling mlp's forward")
    r = readpoint.parse("^.op:mul#1.output")  # an operation of the parent's own forward
    assert (r.kind, r.module, r.up, r.op, r.occurrence) == ("op", (), 1, "mul", 1)
    assert r.words == "the output of mul (second call) inside the parent's own forward"


@pytest.mark.parametrize("text,says", [("^post.output", "write ^. before"), ("^.fn:f.output", "^. names a module"),
                                       ("^.call:attention.output[0]", "^. names a module"),
                                       ("^.method:_f.output", "^. names a module")])
def test_parse_refuses_malformed_climbs(text: str, says: str) -> None:
    with pytest.raises(ExprError, match=re.escape(says)):
        readpoint.parse(text)


def test_a_climb_above_the_root_is_a_spec_error(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        (specs / name).write_text((ROOT / "specs" / name).read_text())
    (specs / "llama.yaml").write_text((ROOT / "specs" / "llama.yaml").read_text().replace(
        "      logits: output.logits", "      logits: ^.output"))
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert "logits: '^.output' climbs 1 host(s) up, but model has no parent" in str(e.value)
    assert str(e.value).startswith("specs/llama.yaml:")


def test_gemma2_reads_what_the_stream_receives_at_the_post_norm() -> None:
    model = T.build("gemma2")
    inputs = T.draw_inputs(96, 2, 6, [0, 2])
    with model.trace(inputs):
        x = model.layers[1].layer_input.save()
        raw = model.layers[1].self_attn.attention_raw_output.save()
        attn = model.layers[1].self_attn.attention_output.save()
        mid = model.layers[1].layer_mid.save()
        mlp_raw = model.layers[1].mlp.mlp_raw_output.save()
        mlp = model.layers[1].mlp.mlp_output.save()
        out = model.layers[1].layer_output.save()
    layer = model.layers[1]._module
    torch.testing.assert_close(attn, layer.post_attention_layernorm(raw), atol=0, rtol=0)
    torch.testing.assert_close(mlp, layer.post_feedforward_layernorm(mlp_raw), atol=0, rtol=0)
    assert not torch.allclose(attn, raw)  # the raw output is not what the stream receives
    assert (x + attn - mid).abs().max().item() == 0.0
    assert (x + attn + mlp - out).abs().max().item() == 0.0  # the block identity, exact in float32
    assert (x + raw + mlp_raw - out).abs().max().item() > 1e-3  # Llama's reading would be wrong here


def test_an_edit_at_the_sibling_reaches_the_stream() -> None:
    model = T.build("gemma2")
    inputs = T.draw_inputs(96, 1, 5, [0])
    with model.trace(inputs):
        x = model.layers[0].layer_input.save()
        model.layers[0].self_attn.attention_output[:] = 0
        mid = model.layers[0].layer_mid.save()
    torch.testing.assert_close(mid, x, atol=0, rtol=0)


def test_a_climb_from_a_host_without_a_parent_says_so() -> None:
    from nnatlas.errors import NnatlasError

    model = T.build("gemma2")
    host = model.layers[0]
    host.__dict__["_parent"] = None  # as a host made by hand, not reached from the model, would be
    with pytest.raises(NnatlasError, match="has no parent host"):
        host._up(1, "layers[0].x")


def test_a_parent_op_read_serves_what_the_parent_makes_of_the_host_output(tmp_path: Path) -> None:
    """``^.op:mul#0.output``: granitemoehybrid's attention block multiplies the attention's output by
    residual_multiplier in the block's forward; read from the attention host, that product is its
    attention_output (the same tensor as the block's), and an edit there reaches the logits as the
    block-level edit does."""
    import types

    import transformers

    from nnatlas.compiler.emit import emit
    from nnatlas.model import AtlasModel

    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        (specs / name).write_text((ROOT / "specs" / name).read_text())
    old = ("      attention_output: {missing: \"the block scales the attention's output by residual_multiplier before "
           "adding it: read layers[i].attention_output\"}\n    identities+:\n")
    text = (ROOT / "specs" / "granitemoehybrid.yaml").read_text()
    assert old in text
    (specs / "granitemoehybrid.yaml").write_text(text.replace(old, (
        "      attention_output: ^.op:mul#0.output\n    identities+:\n"
        "      - attention_output == o_proj.output * residual_multiplier\n")))
    family = next(f for f in compile_atlas(specs, tmp_path).families if f.name == "granitemoehybrid")
    module = types.ModuleType("parent_op_granitemoehybrid")
    exec(compile(emit.render_family(family), "<parent op>", "exec"), module.__dict__)
    config = transformers.GraniteMoeHybridConfig(**T.first_params("granitemoehybrid"))
    model = AtlasModel(transformers.GraniteMoeHybridForCausalLM(config).eval(), module.FAMILY)
    i = model.attention_layers[0]
    inputs = T.draw_inputs(96, 2, 5, [0, 1])
    with model.trace(inputs):
        proj = model.layers[i].self_attn.o_proj.output.save()
        mine = model.layers[i].self_attn.attention_output.save()
        block = model.layers[i].attention_output.save()
        base = model.logits.save()
    torch.testing.assert_close(mine, block, atol=0, rtol=0)
    torch.testing.assert_close(mine, proj * model.residual_multiplier, atol=0, rtol=0)
    with model.trace(inputs):
        model.layers[i].self_attn.attention_output[:] = 0
        edited = model.logits.save()
    with model.trace(inputs):
        model.layers[i].attention_output[:] = 0
        edited_block = model.logits.save()
    assert not torch.equal(edited, base)
    torch.testing.assert_close(edited, edited_block, atol=0, rtol=0)


# ---- a read into a list child: a ModuleList's module by its index (LongCat-Flash's norms) ----------

def test_a_read_into_a_list_child_names_its_index() -> None:
    """``layers.0.input`` reads the first module of the list child ``layers`` (the path LongCat-Flash's two norms
    per block need: ``input_layernorm.0.output``); an index past the list's end is one error at the read, naming
    the indices there are."""
    import torch

    from nnatlas import registry
    from nnatlas import testing as T
    from nnatlas.compiler import SpecError
    from nnatlas.compiler.userspec import compile_text

    text = ('family: listed_llama\nextends: llama\nhosts:\n  model:\n    values:\n'
            '      token_embeddings: "layers.0.input"\n')
    module = compile_text(text.encode(), "listed_llama.yaml")
    registry.add_user(module)
    try:
        model = T.build("listed_llama")
        ids = torch.tensor([[2, 5, 9, 4]])
        with model.trace({"input_ids": ids}):
            embedded = model.embed_tokens.output.save()
            read = model.token_embeddings.save()  # block 0's input: computed after the embedding
        assert torch.equal(read, embedded)
    finally:
        registry.remove_user("listed_llama")
    with pytest.raises(SpecError) as info:
        compile_text(text.replace("layers.0.input", "layers.9.input").encode(), "listed_llama.yaml")
    assert "listed_llama.yaml:6:" in str(info.value) and "has no child module '9'" in str(info.value), str(info.value)


# ---- hosts at list items: LongCat-Flash's two attentions and two MLPs a block ------------------

def test_a_host_at_a_list_item_is_that_item_in_its_block() -> None:
    """``layers[i].self_attn[1]`` is a host of its own (LongCat-Flash): ``model.layers[1].self_attn[1]`` is the second
    attention of block 1 (its specs are that path's, its block 1, not 1 taken for a block index); an index past the
    list's end says how many there are."""
    model = T.build("longcat_flash")
    item = model.layers[1].self_attn[1]
    assert (item._pattern, item._block_index(), item._label) == ("layers[i].self_attn[1]", 1, "layers[1].self_attn[1]")
    assert item._module is model.native.model.layers[1].self_attn[1]
    assert [s.path for s in item._specs()] == ["layers[i].self_attn[1]"]
    assert [label for label, _ in model.live_hosts("layers[i].mlps[0]")] == ["layers[0].mlps[0]", "layers[1].mlps[0]"]
    with pytest.raises(IndexError, match=re.escape("layers[0].self_attn[2]: there are 2")):
        model.layers[0].self_attn[2]
    shown = str(model)  # the printed tree shows each item's values (it showed none under a list in a block)
    attn = shown[shown.index("(self_attn): ModuleList("):shown.index("(mlps): ModuleList(")]
    assert "2 x LongcatFlashMLA(" in attn and "(attention_output) -> Residual" in attn, attn


@pytest.mark.parametrize("host,said", [
    ("layers[i].self_attn[2]", ":5:12: layers[i].self_attn[2]: no module here in the tiny model: layers[0].self_attn "
                               "is a list of 2 modules: index it with a number from 0 to 1"),
    ("layers[i].mlp[0]", ":5:12: layers[i].mlp[0]: no module here in the tiny model: layers[0].mlp (LongcatFlashMoE) "
                         "is no list of modules: name it without an index"),
    ("layers[i].self_atn[0]", ":4:3: host 'layers[i].self_atn[0]': 'self_atn' is not a standard module name; did you "
                              "mean 'self_attn'?"),
    ("layers.self_attn[0]", ":4:3: host 'layers.self_attn[0]': a list item [0] is an item of a list child inside a "
                            "block (layers[i].self_attn[0]); a stack of blocks is indexed [i]"),
    ("embed_tokens[0]", ":4:3: host path 'embed_tokens[0]' is not 'model' or a dotted path like layers[i].self_attn"),
])
def test_a_host_at_a_list_item_that_is_not_one_is_one_error_at_its_line(host: str, said: str) -> None:
    from nnatlas.compiler.userspec import compile_text

    text = (f"family: listed_longcat\nextends: longcat_flash\nhosts:\n  {host}:\n    class: LongcatFlashMLA\n"
            "    values:\n      attention_output: \"output[0]\"\n")
    with pytest.raises(SpecError) as info:
        compile_text(text.encode(), "listed_longcat.yaml")
    assert f"listed_longcat.yaml{said}" in str(info.value), str(info.value)
