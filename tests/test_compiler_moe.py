"""The spec language's mixture-of-experts parts: child-scoped read points, the experts interface,
call dims in views, host dims, missing values and tiny.experts; each problem at file:line:col."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.language import readpoint
from nnatlas.compiler.language.expr import ExprError

SPECS = Path(__file__).resolve().parent.parent / "specs"


def test_child_scoped_read_points() -> None:
    r = readpoint.parse("router > op:linear.output")
    assert (r.kind, r.module, r.op, r.call, r.side) == ("op", ("router",), "linear", None, "output")
    assert r.words == "inside router's forward: the output of linear (first call)"
    r = readpoint.parse("experts > call:experts > op:view#1.output")
    assert (r.kind, r.module, r.call, r.op, r.occurrence) == ("op", ("experts",), "experts", "view", 1)
    r = readpoint.parse("mlp.experts > call:experts.args[2]")
    assert (r.kind, r.module, r.call, r.access) == ("call", ("mlp", "experts"), "experts", (2,))
    for bad in ("router > output", "router[0] > op:linear.output", "experts > call:nope.args[1]"):
        with pytest.raises(ExprError):
            readpoint.parse(bad)


def _atlas_with(tmp_path: Path, text: str) -> SpecError:
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "_notes.yaml", "llama.yaml", "qwen3_5_text.yaml", "qwen3_next.yaml"):
        shutil.copy(SPECS / name, specs / name)
    shutil.copytree(SPECS / "parts", specs / "parts")  # qwen3_5_text includes the Qwen ViT part
    (specs / "broken.yaml").write_text(text)
    with pytest.raises(SpecError) as err:
        compile_atlas(specs, tmp_path)
    return err.value


def test_moe_spec_problems_have_positions(tmp_path: Path) -> None:
    err = _atlas_with(tmp_path, """family: broken
extends: qwen3_next
tiny:
  model_class: Qwen3NextForCausalLM
  config_class: Qwen3NextConfig
  experts: [eager, fused]
hosts:
  layers[i].mlp:
    class: Qwen3NextSparseMoeBlock
    kinds: null  # qwen3_next's two (moe and dense) dropped: one class on every block
    dims: {intermedate_size: moe_intermediate_size, hidden_size: nope}
    values:
      mlp_activation: {missing: "   "}
      mlp_neurons: {missing: "no such thing", read: output}
      router_logits: {read: "router > op:linear.output", view: "unflatten(0, [batch, tokens])"}
  layers[i].mlp.shared_experts: {kind: null}  # on every block
""")
    text = str(err)
    assert "specs/broken.yaml:6:" in text and "unknown experts implementation 'fused'" in text
    assert "specs/broken.yaml:11:" in text and "unknown dim 'intermedate_size'" in text
    assert "dim hidden_size sized by 'nope', which is not a config entry" in text
    assert "specs/broken.yaml:13:" in text and "say why the family has no mlp_activation" in text
    assert "specs/broken.yaml:14:" in text and "a missing value has only its reason" in text
    assert "specs/broken.yaml:15:" in text and "view names 'tokens'" in text
    assert all(p.file == "specs/broken.yaml" for p in err.problems)


def test_the_qwen3_next_spec_compiles_its_mixture() -> None:
    atlas = compile_atlas(SPECS, SPECS.parent)
    fam = next(f for f in atlas.families if f.name == "qwen3_next")
    mlp = next(h for h in fam.hosts if h.path == "layers[i].mlp")
    values = {v.name: v for v in mlp.values}
    assert values["mlp_activation"].missing and values["mlp_neurons"].missing
    assert values["expert_outputs"].needs is not None and values["expert_outputs"].needs.values == ("grouped_mm",
                                                                                                    "batched_mm")
    shared = next(h for h in fam.hosts if h.path == "layers[i].mlp.shared_experts")
    assert shared.dims == (("intermediate_size", "shared_expert_intermediate_size"),)
    assert fam.tiny.experts == ("eager", "batched_mm", "grouped_mm")


def _atlas_files(tmp_path: Path, files: dict[str, str]) -> SpecError | None:
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        shutil.copy(SPECS / name, specs / name)
    for name, text in files.items():
        (specs / name).write_text(text)
    try:
        compile_atlas(specs, tmp_path)
    except SpecError as e:
        return e
    return None


def test_extends_a_list_merges_left_to_right(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    err = _atlas_files(tmp_path, {
        "a.yaml": "family: a\nextends: llama\ntitle: A\nlines: [A]\n",
        "b.yaml": "family: b\nextends: llama\ntitle: B\nsummary: from b\n",
        "c.yaml": "family: c\nextends: [a, b]\nlines: [C]\n",
    })
    assert err is None
    atlas = compile_atlas(specs, tmp_path)
    c = next(f for f in atlas.families if f.name == "c")
    assert c.extends == ("a", "b")
    assert c.title == "B"  # b, the later base, overrides a
    assert c.summary == "from b"
    assert c.lines == ("C",)  # the family's own file overrides every base


def test_extends_problems_are_reported_where_the_base_is_named(tmp_path: Path) -> None:
    err = _atlas_files(tmp_path, {
        "a.yaml": "family: a\nextends:\n  - llama\n  - b\n",
        "b.yaml": "family: b\nextends: [llama, a]\n",
        "d.yaml": "family: d\nextends: [llama, nope, llama]\n",
    })
    assert err is not None
    text = str(err)
    assert "extends cycle: a -> b -> a" in text or "extends cycle: b -> a -> b" in text
    cycle = next(p for p in err.problems if "cycle" in p.message)
    assert (cycle.file, cycle.line) in (("specs/b.yaml", 2), ("specs/a.yaml", 4))
    assert "specs/d.yaml:2:" in text and "extends unknown family 'nope'" in text
    assert "extends names 'llama' twice" in text
