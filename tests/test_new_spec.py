"""`nnatlas new FAMILY --from BASE`: a starting spec that compiles, whose generated tests collect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nnatlas.compiler import compile_atlas
from nnatlas.compiler.cli import main
from nnatlas.compiler.emit import emit

from .conftest import drop_families


@pytest.fixture
def spec_root(spec_root: Path) -> Path:
    """The checkout's specs less mistral and the families that extend it: these tests write mistral anew."""
    drop_families(spec_root, "mistral")
    return spec_root


def _new(root: Path, *args: str) -> int:
    return main(["new", *args, "--root", str(root)])


def test_new_from_llama_compiles_and_its_generated_tests_collect(spec_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _new(spec_root, "mistral", "--from", "llama") == 0
    assert "wrote" in capsys.readouterr().out
    text = (spec_root / "specs" / "mistral.yaml").read_text()
    data = yaml.safe_load(text)
    assert data["extends"] == "llama" and data["checkpoints"] == [] and data["notes"] == []
    assert text.count("\n#") >= 8  # commented: how extends merges, where the reference is, what to fill in
    atlas = compile_atlas(spec_root / "specs", spec_root)
    (fam,) = [f for f in atlas.families if f.name == "mistral"]
    # transformers' own names for the new family's classes, the tiny load included
    assert {h.path: h.cls for h in fam.hosts} == {
        "model": "MistralForCausalLM", "layers[i]": "MistralDecoderLayer", "layers[i].self_attn": "MistralAttention",
        "layers[i].mlp": "MistralMLP"}
    assert (fam.tiny.model_class, fam.tiny.config_class) == ("MistralForCausalLM", "MistralConfig")
    assert fam.model_types == ("mistral",) and fam.classes == ("MistralForCausalLM",)
    assert fam.checkpoints == () and [n.title for n in fam.notes] == ["Gradients"]  # llama's describe llama; every family has Gradients
    llama = next(f for f in atlas.families if f.name == "llama")
    assert [i.text for h in fam.hosts for i in h.identities] == [i.text for h in llama.hosts for i in h.identities]

    # its generated adapter and tests, importable as nnatlas.families.mistral: pytest collects every test
    out = _collect_dir(spec_root, fam)
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(out), str(out / "test_mistral.py")],
                          capture_output=True, text=True, cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert any("test_identities[" in c for c in collected) and any("test_edit_reaches_logits[" in c for c in collected)
    assert any("test_native_classes[layers[i].self_attn]" in c for c in collected)


SLIDING = """
config:
  sliding_window: sliding_window
tiny:
  model_class: MistralForCausalLM
  config_class: MistralConfig
  draw:
    sliding_window: [2, 3]   # shorter than the drawn sequences (up to 7), so the window hides keys
"""


def _collect_dir(root: Path, fam: object) -> Path:
    """The family's generated adapter and tests in a folder whose conftest registers the adapter."""
    out = root / "collect"
    (out / "families").mkdir(parents=True)
    (out / "families" / f"{fam.name}.py").write_text(emit.render_family(fam))  # type: ignore[attr-defined]
    (out / f"test_{fam.name}.py").write_text(emit.render_tests(fam))  # type: ignore[attr-defined]
    (out / "conftest.py").write_text(
        "import importlib\n\nimport nnatlas.families\nfrom nnatlas import registry\n\n"
        f"nnatlas.families.__path__.append({str(out / 'families')!r})\n"
        f"registry.all_families()[{fam.name!r}] = importlib.import_module('nnatlas.families.{fam.name}').FAMILY\n")  # type: ignore[attr-defined]
    return out


def test_a_new_family_with_a_sliding_window_passes_its_generated_attention_identities(spec_root: Path) -> None:
    """masked(..., window=sliding_window) in a spec, checked by the generated tests on tiny Mistral models
    (left padding drawn too): the new spec plus a sliding-window identity, end to end."""
    assert _new(spec_root, "mistral", "--from", "llama") == 0
    path = spec_root / "specs" / "mistral.yaml"
    text = path.read_text()
    text = text.replace("  layers[i].self_attn: {class: MistralAttention}\n", """  layers[i].self_attn:
    class: MistralAttention
    identities=:
      - attention_premix == attention_head_outputs
      - {check: "sum(attention_probabilities, -1) == 1", atol: 1.0e-5}
      - masked(attention_probabilities, window=sliding_window) == 0
""")
    text = text.replace("tiny:\n  model_class: MistralForCausalLM\n  config_class: MistralConfig\n", SLIDING)
    path.write_text(text)
    (fam,) = [f for f in compile_atlas(spec_root / "specs", spec_root).families if f.name == "mistral"]
    assert any("window=sliding_window" in i.text for h in fam.hosts for i in h.identities)
    out = _collect_dir(spec_root, fam)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(out),
                           "-k", "test_identities and self_attn", str(out / "test_mistral.py")],
                          capture_output=True, text=True, cwd=out, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout  # the self_attn identities, one group (its kind)


def test_a_family_transformers_does_not_know_keeps_the_base_classes_marked_todo(spec_root: Path) -> None:
    assert _new(spec_root, "labnet", "--from", "llama") == 0
    text = (spec_root / "specs" / "labnet.yaml").read_text()
    assert "  layers[i].mlp: {class: LlamaMLP}  # TODO: llama's class; name labnet's" in text
    assert "title: Labnet" in text and "model_types: [labnet]" in text
    (fam,) = [f for f in compile_atlas(spec_root / "specs", spec_root).families if f.name == "labnet"]
    assert fam.tiny.model_class == "LlamaForCausalLM"


def test_new_from_a_hybrid_base_compiles(spec_root: Path) -> None:
    assert _new(spec_root, "qwen3_5_moe", "--from", "qwen3_5_text") == 0
    names = {f.name for f in compile_atlas(spec_root / "specs", spec_root).families}
    assert "qwen3_5_moe" in names


@pytest.mark.parametrize("args,message", [
    (("Mistral", "--from", "llama"), "new: 'Mistral' is not a family name"),
    (("mistral", "--from", "lama"), "new: no family 'lama' to start from; did you mean 'llama'?"),
    (("gpt2", "--from", "llama"), "new: family 'gpt2' exists already (specs/gpt2.yaml)"),
])
def test_bad_requests_say_why(spec_root: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                              message: str) -> None:
    assert _new(spec_root, *args) == 2
    assert message in capsys.readouterr().err
    assert not (spec_root / "specs" / "mistral.yaml").exists()


def test_out_writes_elsewhere_and_refuses_to_overwrite(spec_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = spec_root / "drafts" / "mistral.yaml"
    assert _new(spec_root, "mistral", "--from", "llama", "--out", str(target)) == 0 and target.exists()
    assert _new(spec_root, "mistral", "--from", "llama", "--out", str(target)) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert _new(spec_root, "mistral", "--from", "llama", "--out", str(target), "--force") == 0
    assert _new(spec_root, "mistral", "--from", "llama", "--out", str(spec_root / "x.yaml")) == 2
    assert "a family lives in <specs>/mistral.yaml, not x.yaml" in capsys.readouterr().err
