"""Errors a newcomer understands: each says what is wrong, where (the spec line) and what to write.

(The module-tree check's messages, a read that leaves its host among them, are in test_treecheck.)
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import pytest
import transformers

from nnatlas import testing as T
from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.emit import emit
from nnatlas.errors import NnatlasError, UnknownName
from nnatlas.model import AtlasModel

ROOT = Path(__file__).resolve().parent.parent


def _specs(tmp_path: Path, old: str, new: str, name: str = "llama.yaml") -> Path:
    specs = tmp_path / "specs"
    (specs / "parts").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    text = (ROOT / "specs" / name).read_text()
    assert old in text
    (specs / name).write_text(text.replace(old, new, 1))
    return specs


def _error(specs: Path) -> str:
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, specs.parent)
    return str(e.value)


def test_meaning_in_a_family_says_it_belongs_in_the_vocabulary(tmp_path: Path) -> None:
    specs = _specs(tmp_path, "      mlp_output: output\n",
                   "      mlp_output: {read: output, meaning: what the MLP adds}\n")
    assert _error(specs) == (
        "specs/llama.yaml:81:34: 'meaning' does not belong in a family: a value's meaning and layout are written "
        "once, in specs/_vocabulary.yaml (under values:, or streams.<stream>: for a host with a stream), so every "
        "page says the same; here say only where it is read (read, view, needs ...)")


def test_an_unknown_value_says_where_to_declare_it(tmp_path: Path) -> None:
    specs = _specs(tmp_path, "      mlp_output: output\n", "      mlp_output: output\n      feed_forward_gate: gate_proj.output\n")
    assert _error(specs) == (
        "specs/llama.yaml:82:7: unknown value 'feed_forward_gate'. A new standard value is declared once in "
        "specs/_vocabulary.yaml, under values:, with its layout and its one-line meaning")


def test_an_unknown_value_on_a_stream_host_names_the_stream(tmp_path: Path) -> None:
    specs = _specs(tmp_path, "      mlp_output: {read: output, view: unsqueeze(0)}\n",
                   "      mlp_outptu: {read: output, view: unsqueeze(0)}\n", "parts/qwen_vit.yaml")
    shutil.copy(ROOT / "specs" / "qwen3_vl.yaml", specs)
    shutil.copy(ROOT / "specs" / "llama.yaml", specs)
    shutil.copy(ROOT / "specs" / "_notes.yaml", specs)
    line = next(i for i, text in enumerate((specs / "parts" / "qwen_vit.yaml").read_text().splitlines(), 1)
                if "mlp_outptu" in text)
    assert _error(specs) == (
        f"specs/parts/qwen_vit.yaml:{line}:7: unknown value 'mlp_outptu'; did you mean 'mlp_output'? A new standard "
        "value is declared once in specs/_vocabulary.yaml, under streams.vision: (this host's stream) or values:, "
        "with its layout and its one-line meaning")


def test_a_view_that_does_not_fit_names_the_spec_line(tmp_path: Path) -> None:
    specs = _specs(tmp_path, 'view: "unflatten(-1, [num_heads, head_dim])"', 'view: "unflatten(-1, [num_heads, num_heads])"')
    family = next(f for f in compile_atlas(specs, tmp_path).families if f.name == "llama")
    module = types.ModuleType("bad_view_llama")
    exec(compile(emit.render_family(family), "<bad view>", "exec"), module.__dict__)
    params = T.first_params("llama")  # num_heads 2, head_dim 4: [2, 2] cannot cover 8 features
    config = transformers.LlamaConfig(**params)
    model = AtlasModel(transformers.LlamaForCausalLM(config).eval(), module.FAMILY)
    with pytest.raises(NnatlasError) as e:
        with model.trace(T.draw_inputs(96, 1, 4, [0])):
            model.layers[0].self_attn.attention_premix.save()
    assert str(e.value) == (
        "layers[0].self_attn.attention_premix: the view unflatten(-1, [2, 2]) (the view of specs/llama.yaml:68:32) "
        "does not fit the tensor it reads, of shape [1, 4, 8]: unflatten: Provided sizes [2, 2] don't multiply up "
        "to the size of dim 2 (8) in the input tensor")


def test_a_runtime_read_that_leaves_its_host_says_how_to_read_the_sibling() -> None:
    model = T.build("llama")
    host = model.layers[0].self_attn
    with pytest.raises(UnknownName) as e:
        host._resolve_module(("post_attention_layernorm",), "layers[0].self_attn.attention_output")
    assert str(e.value) == (
        "layers[0].self_attn.attention_output: 'post_attention_layernorm' is not inside layers[0].self_attn "
        "(LlamaAttention): the read leaves its host; 'post_attention_layernorm' is a sibling (a child of layers[0]): "
        "read it as ^.post_attention_layernorm...")
