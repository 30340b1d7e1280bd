"""extends without surprises: identities appended (identities+:) or replaced (identities=:) by
saying so, notes and checkpoints never inherited silently, draws ordered by their dependencies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.language.ir import FamilyIR

ROOT = Path(__file__).resolve().parent.parent
HEAD = """family: child
extends: llama
title: Child
lines: [Child]
summary: Llama with a change.
"""


def _compile(tmp_path: Path, body: str) -> FamilyIR:
    specs = tmp_path / "specs"
    specs.mkdir(exist_ok=True)
    for name in ("_vocabulary.yaml", "llama.yaml"):
        shutil.copy(ROOT / "specs" / name, specs)
    (specs / "child.yaml").write_text(HEAD + body)
    atlas = compile_atlas(specs, tmp_path)
    return next(f for f in atlas.families if f.name == "child")


def _error(tmp_path: Path, body: str) -> str:
    with pytest.raises(SpecError) as e:
        _compile(tmp_path, body)
    return str(e.value)


def _identities(f: FamilyIR, path: str) -> list[str]:
    return [i.text for h in f.hosts_at(path) for i in h.identities]


NEW = "mlp_neurons == mlp_neurons"


def test_identities_plus_appends(tmp_path: Path) -> None:
    f = _compile(tmp_path, f"hosts:\n  layers[i].mlp:\n    identities+:\n      - {NEW}\n")
    assert _identities(f, "layers[i].mlp") == ["mlp_neurons == mlp_activation * up_proj.output",
                                               "mlp_activation == silu(gate_proj.output)", NEW]
    assert _identities(f, "layers[i]")[0] == "layer_input + self_attn.attention_output + mlp.mlp_output == layer_output"


def test_identities_equals_replaces(tmp_path: Path) -> None:
    f = _compile(tmp_path, f"hosts:\n  layers[i].mlp:\n    identities=:\n      - {NEW}\n")
    assert _identities(f, "layers[i].mlp") == [NEW]


def test_plain_identities_over_inherited_ones_must_say_which(tmp_path: Path) -> None:
    assert _error(tmp_path, f"hosts:\n  layers[i].mlp:\n    identities:\n      - {NEW}\n") == (
        "specs/child.yaml:8:5: layers[i].mlp: 2 identities are inherited here (from specs/llama.yaml); write "
        "'identities+:' to add to them or 'identities=:' to replace them")


def test_append_and_replace_forms_are_checked(tmp_path: Path) -> None:
    text = _error(tmp_path, f"traits+: Gated MLP\nhosts:\n  layers[i].mlp:\n    identities: []\n    identities+:\n"
                            f"      - {NEW}\n")
    assert text.splitlines() == [
        "specs/child.yaml:6:1: 'traits+' takes a list (traits+ appends to the inherited traits)",
        "specs/child.yaml:9:5: layers[i].mlp: 2 identities are inherited here (from specs/llama.yaml); write "
        "'identities+:' to add to them or 'identities=:' to replace them",
        "specs/child.yaml:10:5: 'identities+' and 'identities' in one mapping: give one"]


def test_lists_append_with_plus_anywhere(tmp_path: Path) -> None:
    f = _compile(tmp_path, "traits+: [Tied embeddings]\n")
    assert [t for t, _ in f.traits][-2:] == ["Gated MLP", "Tied embeddings"]


def test_notes_and_checkpoints_are_never_inherited_silently(tmp_path: Path) -> None:
    f = _compile(tmp_path, "")
    assert f.checkpoints == ()  # not llama's Llama-3.2-1B printout, nor its notes: only the note every page ends with
    assert [n.title for n in f.notes] == ["Gradients"]


def test_notes_plus_keeps_the_bases_and_adds(tmp_path: Path) -> None:
    f = _compile(tmp_path, "notes+:\n  - title: Mine\n    body: only words\ncheckpoints+: []\n")
    assert [n.title for n in f.notes] == ["The block, in order", "The pattern under sdpa", "Mine", "Gradients"]
    assert [c.name for c in f.checkpoints] == ["meta-llama/Llama-3.2-1B"]


def test_draws_follow_their_dependencies_not_the_merged_key_order(tmp_path: Path) -> None:
    # llama draws num_key_value_heads from num_attention_heads // _groups; a child that sizes heads from
    # a new draw (appended after every base key by the merge) still draws it first
    f = _compile(tmp_path, "tiny:\n  draw:\n    num_attention_heads: _heads * 2\n    _heads: [1, 2]\n")
    names = [d.name for d in f.tiny.draw]
    assert names.index("_heads") < names.index("num_attention_heads") < names.index("num_key_value_heads")


def test_a_draw_cycle_is_refused(tmp_path: Path) -> None:
    text = _error(tmp_path, "tiny:\n  draw:\n    _a: _b + 1\n    _b: _a + 1\n")
    assert "tiny.draw: these draws depend on each other in a cycle: _a (needs _b), _b (needs _a)" in text
