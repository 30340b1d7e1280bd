"""Block kinds with their own class per host path: a hybrid stack whose kinds are different modules at
one path (jamba: JambaAttentionDecoderLayer / JambaMambaDecoderLayer at layers[i], JambaSparseMoeBlock /
JambaMLP at layers[i].mlp), hosts that exist on one kind's blocks (``kind: NAME``), kinds whose ``when``
comes from an enclosing host's kind of the same name. A good spec compiles into one host spec per kind;
a broken one fails at its file:line:col, at compile time or at the module-tree check of generate."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas, generate

ROOT = Path(__file__).resolve().parent.parent


def _root(tmp_path: Path, edits: list[tuple[str, str]] = ()) -> Path:  # type: ignore[assignment]
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        shutil.copy(ROOT / "specs" / name, specs)
    text = (ROOT / "specs" / "jamba.yaml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (specs / "jamba.yaml").write_text(text)
    return tmp_path


def _at(root: Path, needle: str, nth: int = 0) -> tuple[int, int]:
    """Line and column (1-based) of the nth line holding needle in the tmp jamba.yaml, at the needle."""
    hits = [(n, line.index(needle) + 1) for n, line in enumerate((root / "specs" / "jamba.yaml").read_text()
                                                                 .splitlines(), 1) if needle in line]
    return hits[nth]


def _errors(root: Path, check_tree: bool = False) -> list[str]:
    with pytest.raises(SpecError) as e:
        generate(root) if check_tree else compile_atlas(root / "specs", root)
    return str(e.value).splitlines()


def test_each_kind_is_a_host_spec_with_its_own_class(tmp_path: Path) -> None:
    atlas = compile_atlas(_root(tmp_path) / "specs", tmp_path)
    f = next(f for f in atlas.families if f.name == "jamba")
    by_kind = {(h.path, h.kind): h for h in f.hosts}
    assert by_kind[("layers[i]", "attention")].cls == "JambaAttentionDecoderLayer"
    assert by_kind[("layers[i]", "mamba")].cls == "JambaMambaDecoderLayer"
    moe, dense = by_kind[("layers[i].mlp", "moe")], by_kind[("layers[i].mlp", "dense")]
    assert (moe.cls, dense.cls) == ("JambaSparseMoeBlock", "JambaMLP")
    # the kind's values beside the host's: mlp_output on both, the router's only on moe blocks
    assert {"mlp_output", "router_logits"} <= {v.name for v in moe.values}
    assert "router_logits" not in {v.name for v in dense.values}
    assert next(v for v in moe.values if v.name == "mlp_activation").missing
    assert next(v for v in dense.values if v.name == "mlp_activation").read is not None
    # `kind: mamba` on layers[i].mamba: the when of layers[i]'s kind mamba, and the stream of its own
    mamba = by_kind[("layers[i].mamba", "mamba")]
    assert mamba.when_text == "layers_block_type[i] == 'mamba'"
    # the class's position is the kind's class line (the tree check names it)
    assert moe.at is not None and moe.at[1] == _at(tmp_path, "class: JambaSparseMoeBlock")[0]


def test_a_kind_without_when_takes_the_enclosing_kind_of_the_same_name(tmp_path: Path) -> None:
    root = _root(tmp_path, [("  layers[i].mamba:\n    kind: mamba\n    class: JambaMambaMixer\n",
                             "  layers[i].mamba:\n    kinds:\n      mamba: {class: JambaMambaMixer}\n")])
    f = next(f for f in compile_atlas(root / "specs", root).families if f.name == "jamba")
    (mamba,) = f.hosts_at("layers[i].mamba")
    assert (mamba.kind, mamba.cls, mamba.when_text) == ("mamba", "JambaMambaMixer", "layers_block_type[i] == 'mamba'")


def test_a_kind_with_no_when_and_no_enclosing_kind(tmp_path: Path) -> None:
    root = _root(tmp_path, [("        when: layers_num_experts[i] == 1\n", "")])
    line, col = _at(root, "dense:")
    assert _errors(root) == [
        f"specs/jamba.yaml:{line}:{col}: host 'layers[i].mlp': kind 'dense' has no when, and no host enclosing it "
        "declares a kind 'dense' to take it from (their kinds: attention, mamba): give when: here, or declare the "
        "kind on the host whose blocks it selects (layers[i])"]


def test_kind_names_an_unknown_kind_with_the_nearest(tmp_path: Path) -> None:
    root = _root(tmp_path, [("    kind: mamba\n", "    kind: mambaa\n")])
    line, col = _at(root, "kind: mambaa")
    assert _errors(root) == [
        f"specs/jamba.yaml:{line}:{col + 6}: host 'layers[i].mamba': kind 'mambaa' has no when, and no host "
        "enclosing it declares a kind 'mambaa' to take it from (their kinds: attention, mamba): give when: here, or "
        "declare the kind on the host whose blocks it selects (layers[i]); did you mean 'mamba'?"]


def test_kind_and_when_on_one_host(tmp_path: Path) -> None:
    root = _root(tmp_path, [("    kind: mamba\n", "    kind: mamba\n    when: i > 0\n")])
    line, col = _at(root, "kind: mamba")
    assert _errors(root) == [f"specs/jamba.yaml:{line}:{col + 6}: host 'layers[i].mamba': give either 'kind' (the "
                             "blocks of a kind of an enclosing host) or 'when'"]


def test_one_kind_name_with_two_whens(tmp_path: Path) -> None:
    root = _root(tmp_path, [("    kind: mamba\n    class: JambaMambaMixer\n",
                             "    kinds:\n      mamba:\n        when: i > 0\n        class: JambaMambaMixer\n")])
    line, col = _at(root, "class: JambaMambaMixer")
    first = _at(root, "class: JambaMambaDecoderLayer")[0]
    assert _errors(root) == [
        f"specs/jamba.yaml:{line}:{col + 7}: layers[i].mamba: kind 'mamba' selects the blocks where i > 0, but on "
        f"layers[i] (specs/jamba.yaml:{first}) kind 'mamba' selects those where layers_block_type[i] == 'mamba': "
        "model.mamba_layers lists one set of blocks. Give the kind one when (leave when out below layers[i] to take "
        "its), or name the kinds apart"]


def test_a_class_on_neither_the_host_nor_every_kind(tmp_path: Path) -> None:
    root = _root(tmp_path, [("        class: JambaMLP\n", "")])
    line, col = _at(root, "layers[i].mlp:", 1)
    assert _errors(root) == [f"specs/jamba.yaml:{line}:{col}: host 'layers[i].mlp': 'class' (the native class) is "
                             "required (here, or on every one of its kinds)"]


def test_a_kind_class_that_is_not_a_name_and_an_unknown_kind_stream(tmp_path: Path) -> None:
    root = _root(tmp_path, [("        class: JambaMLP\n", "        class: \"JambaMLP; import os\"\n        stream: ssmm\n")])
    line, col = _at(root, "class: \"JambaMLP")
    sline, scol = _at(root, "stream: ssmm")
    errors = _errors(root)
    assert errors[0].startswith(f"specs/jamba.yaml:{line}:{col + 7}: class 'JambaMLP; import os' is not a name")
    assert f"specs/jamba.yaml:{sline}:{scol + 8}: unknown stream 'ssmm'; did you mean 'ssm'?" in errors


def test_a_kind_drops_a_host_value_with_null(tmp_path: Path) -> None:
    root = _root(tmp_path, [("          mlp_activation: act_fn.output\n",
                             "          mlp_activation: act_fn.output\n          mlp_output: null\n")])
    f = next(f for f in compile_atlas(root / "specs", root).families if f.name == "jamba")
    dense = next(h for h in f.hosts_at("layers[i].mlp") if h.kind == "dense")
    moe = next(h for h in f.hosts_at("layers[i].mlp") if h.kind == "moe")
    assert "mlp_output" not in {v.name for v in dense.values} and "mlp_output" in {v.name for v in moe.values}


def test_the_tree_check_checks_each_kind_at_its_own_line(tmp_path: Path) -> None:
    """A wrong class on one kind and a read that only one kind's module lacks: each at its spec line,
    naming the kind."""
    root = _root(tmp_path, [
        ("        class: JambaMLP\n", "        class: JambaMlp\n"),
        ("          mlp_neurons: down_proj.input\n", "          mlp_neurons: down_projj.input\n"),
    ])
    cls_line, cls_col = _at(root, "class: JambaMlp")
    read_line, read_col = _at(root, "mlp_neurons: down_projj.input")
    assert _errors(root, check_tree=True) == [
        f"specs/jamba.yaml:{cls_line}:{cls_col + 7}: layers[i].mlp (kind dense): class JambaMlp: the module here is "
        "JambaMLP (layers[0].mlp of the tiny model)",
        f"specs/jamba.yaml:{read_line}:{read_col + 13}: layers[i].mlp (kind dense): mlp_neurons: 'down_projj.input': "
        "layers[0].mlp (JambaMLP) has no child module 'down_projj' (its children: gate_proj, up_proj, down_proj, "
        "act_fn); did you mean 'down_proj'? (layers[0].mlp of the tiny model)",
    ]
    assert not (root / "generated").exists()


def test_the_tree_check_says_when_a_kind_selects_no_block(tmp_path: Path) -> None:
    root = _root(tmp_path, [("        when: layers_num_experts[i] == 1\n", "        when: layers_num_experts[i] == 7\n")])
    line, col = _at(root, "class: JambaMLP")
    assert _errors(root, check_tree=True) == [
        f"specs/jamba.yaml:{line}:{col + 7}: layers[i].mlp (kind dense): no block of the tiny model or checkpoint "
        "ai21labs/Jamba-v0.1 is one where layers_num_experts[i] == 7, so its class and reads are checked on none: "
        "draw a tiny config whose first draw has such a block (or record a checkpoint that has one)"]
