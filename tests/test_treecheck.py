"""make generate checks every spec against the module tree transformers builds on the meta device:
a misspelt class, child, rename target or method fails generate at its spec line, with the nearest
names, before any generated test runs; a read that leaves its host says how to read a sibling."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nnatlas import compiler
from nnatlas.compiler import SpecError, generate
from nnatlas.compiler.resolve import treecheck

ROOT = Path(__file__).resolve().parent.parent


def _root(tmp_path: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    for name, changes in edits.items():
        text = (ROOT / "specs" / name).read_text()
        for old, new in changes:
            assert old in text, old
            text = text.replace(old, new)
        (specs / name).write_text(text)
    return tmp_path


def _problems(root: Path) -> list[str]:
    with pytest.raises(SpecError) as e:
        generate(root)
    assert not (root / "generated").exists()  # a spec error writes nothing
    return str(e.value).splitlines()


def test_a_misspelt_class_fails_generate_at_its_line(tmp_path: Path) -> None:
    root = _root(tmp_path, {"llama.yaml": [("class: LlamaMLP", "class: LlamaMlp")]})
    assert _problems(root) == [
        "specs/llama.yaml:77:12: layers[i].mlp: class LlamaMlp: the module here is LlamaMLP "
        "(layers[0].mlp of the tiny model)"]


def test_every_miss_at_once_with_the_nearest_names(tmp_path: Path) -> None:
    root = _root(tmp_path, {"llama.yaml": [
        ("attention_premix: {read: o_proj.input", "attention_premix: {read: o_projj.input"),
        ("  norm: model.norm", "  norm: model.nrom"),
        ("      mlp_neurons: down_proj.input", "      mlp_neurons: down_projection.input"),
        ("mlp_neurons == mlp_activation * up_proj.output", "mlp_neurons == mlp_activation * upproj.output"),
    ]})
    assert _problems(root) == [
        "specs/llama.yaml:16:9: rename norm: model.nrom: model.model (LlamaModel) has no child module 'nrom' "
        "(its children: embed_tokens, layers, norm, rotary_emb); did you mean 'norm'?",
        "specs/llama.yaml:68:32: layers[i].self_attn: attention_premix: 'o_projj.input': layers[0].self_attn "
        "(LlamaAttention) has no child module 'o_projj' (its children: q_proj, k_proj, v_proj, o_proj); did you "
        "mean 'o_proj'? (layers[0].self_attn of the tiny model)",
        "specs/llama.yaml:80:20: layers[i].mlp: mlp_neurons: 'down_projection.input': layers[0].mlp (LlamaMLP) has "
        "no child module 'down_projection' (its children: gate_proj, up_proj, down_proj, act_fn); did you mean "
        "'down_proj'? (layers[0].mlp of the tiny model)",
        "specs/llama.yaml:83:9: layers[i].mlp: identity term 'upproj.output': layers[0].mlp (LlamaMLP) has no child "
        "module 'upproj' (its children: gate_proj, up_proj, down_proj, act_fn); did you mean 'up_proj'? "
        "(layers[0].mlp of the tiny model)",
    ]


def test_a_read_that_leaves_its_host_says_how_to_read_a_sibling(tmp_path: Path) -> None:
    root = _root(tmp_path, {"llama.yaml": [("      attention_output: output[0]",
                                            "      attention_output: post_attention_layernorm.output")]})
    assert _problems(root) == [
        "specs/llama.yaml:69:25: layers[i].self_attn: attention_output: 'post_attention_layernorm.output': "
        "'post_attention_layernorm' is not inside layers[0].self_attn (LlamaAttention): this read leaves the host. "
        "'post_attention_layernorm' is a sibling (a child of layers[0], LlamaDecoderLayer); a value read outside "
        "its host starts with ^. to climb to the parent: ^.post_attention_layernorm.output "
        "(layers[0].self_attn of the tiny model)"]


def test_a_host_with_no_module_and_a_missing_method(tmp_path: Path) -> None:
    root = _root(tmp_path, {"_vocabulary.yaml": [("modules:\n", "modules:\n  mlpp: a module no model has\n")],
                            "llama.yaml": [
        ("  layers[i].mlp:\n    class: LlamaMLP", "  layers[i].mlpp:\n    class: LlamaMLP"),
        ("      - layer_input + self_attn.attention_output + mlp.mlp_output == layer_output\n", ""),
        ("      attention_keys: call:attention.args[2]", "      attention_keys: method:rotate.output"),
    ]})
    problems = _problems(root)
    assert problems == [
        "specs/llama.yaml:62:23: layers[i].self_attn: attention_keys: 'method:rotate.output': LlamaAttention has "
        "no method 'rotate' (layers[0].self_attn of the tiny model)",
        "specs/llama.yaml:76:12: layers[i].mlpp: no module here in the tiny model or checkpoint "
        "meta-llama/Llama-3.2-1B: layers[0] (LlamaDecoderLayer) has no child 'mlpp' (its children: self_attn, mlp, "
        "input_layernorm, post_attention_layernorm); did you mean 'mlp'?"]


def test_the_check_runs_with_the_printouts_and_is_cached_with_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(tmp_path, {"llama.yaml": []})
    generate(root)
    calls: list[str] = []
    real = treecheck.check
    monkeypatch.setattr(treecheck, "check", lambda f, src: calls.append(f.name) or real(f, src))
    assert generate(root).changed == [] and calls == []  # fresh printout: the family passed, nothing built
    (root / "generated" / "docs" / "printouts" / "llama.txt").unlink()
    generate(root)
    assert calls == ["llama"]
    atlas = compiler.compile_atlas(root / "specs", root)
    assert compiler.plan_printouts(root, atlas, compute=False)[1] == []


def test_a_base_line_that_fails_in_every_family_extending_it_is_reported_once(tmp_path: Path) -> None:
    root = _root(tmp_path, {"llama.yaml": [("      mlp_neurons: down_proj.input", "      mlp_neurons: down_projection.input")],
                            "gemma2.yaml": []})
    assert _problems(root) == [  # gemma2 inherits the line too (its Gemma2MLP has the same children): said once
        "specs/llama.yaml:80:20: layers[i].mlp: mlp_neurons: 'down_projection.input': layers[0].mlp (Gemma2MLP) has "
        "no child module 'down_projection' (its children: gate_proj, up_proj, down_proj, act_fn); did you mean "
        "'down_proj'? (layers[0].mlp of the tiny model)"]


def _misspelt(tmp_path: Path, spec: str, old: str, bad: str) -> tuple[Path, int]:
    """A checkout whose ``spec`` (extending mixtral) writes ``bad`` for e_score_correction_bias in the line ``old``;
    the line it sits on."""
    root = _root(tmp_path, {"llama.yaml": [], "mixtral.yaml": [], spec: [
        (old, old.replace("e_score_correction_bias", bad))]})
    line = next(n for n, text in enumerate((root / "specs" / spec).read_text().splitlines(), 1) if bad in text)
    return root, line


def test_an_identity_term_naming_no_parameter_or_buffer_fails_generate(tmp_path: Path) -> None:
    old = "- sum(expert_indices, -1) == sum(grouped_topk_indices(sigmoid(router_logits) + router.e_score_correction_bias,"
    root, line = _misspelt(tmp_path, "glm4_moe.yaml", old, "e_score_correction_bais")
    assert _problems(root) == [
        f"specs/glm4_moe.yaml:{line}:13: layers[i].mlp (kind moe): identity term 'router.e_score_correction_bais': "
        "Glm4MoeTopkRouter has no parameter or buffer 'e_score_correction_bais', and layers[i].mlp.router no value of "
        "that name (its parameters and buffers: e_score_correction_bias, weight); did you mean "
        "'e_score_correction_bias'? (layers[1].mlp of the tiny model)"]


def test_a_one_word_term_naming_no_buffer_of_the_host_fails_generate(tmp_path: Path) -> None:
    """A one-word term that is no value's name a letter or two off is taken as the host's own parameter or buffer (MiniMax-M2's
    e_score_correction_bias, a buffer of the mixture block) and checked on the tree: a wrong one fails generate."""
    old = "- sum(expert_indices, -1) == sum(topk_indices(sigmoid(router_logits) + e_score_correction_bias,"
    root, line = _misspelt(tmp_path, "minimax_m2.yaml", old, "correction_bais")
    assert _problems(root) == [
        f"specs/minimax_m2.yaml:{line}:9: layers[i].mlp: identity term 'correction_bais': MiniMaxM2SparseMoeBlock has "
        "no parameter or buffer 'correction_bais', and layers[i].mlp no value of that name (its parameters and "
        "buffers: e_score_correction_bias); did you mean 'e_score_correction_bias'? (layers[0].mlp of the tiny model)"]
