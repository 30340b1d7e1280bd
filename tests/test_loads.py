"""Loads a family supports: the attention implementations its class accepts, declared in the spec
(``loads.attention``) or read from the class; the generated tests run exactly those."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.testing import suite as T

ROOT = Path(__file__).resolve().parent.parent


def test_gemma2_declares_no_sdpa_and_its_tests_skip_it() -> None:
    assert T.adapter_module("gemma2").FAMILY.attention == ("eager", "flex_attention", "flash_attention_2")
    assert T.attention_loads("gemma2") == ("eager",)
    generated = (ROOT / "generated" / "tests" / "test_gemma2.py").read_text()
    assert "ATTENTION = T.attention_loads(FAMILY)" in generated and "(declared)" in generated
    assert '"sdpa"' not in generated


def test_undeclared_loads_are_read_from_the_class() -> None:
    assert T.adapter_module("llama").FAMILY.attention is None
    assert T.attention_loads("llama") == ("eager", "sdpa")


def test_a_declaration_the_class_refuses_fails_its_test(monkeypatch: pytest.MonkeyPatch) -> None:
    module = T.adapter_module("gemma2")
    monkeypatch.setattr(module, "FAMILY", dataclasses.replace(module.FAMILY, attention=("eager", "sdpa")))
    with pytest.raises(AssertionError, match="loads.attention lists 'sdpa', but the class refuses it"):
        T.check_attention_loads("gemma2")


def test_a_declaration_that_misses_a_load_fails_its_test(monkeypatch: pytest.MonkeyPatch) -> None:
    module = T.adapter_module("llama")
    monkeypatch.setattr(module, "FAMILY", dataclasses.replace(module.FAMILY, attention=("eager",)))
    with pytest.raises(AssertionError, match="the class builds under 'sdpa'"):
        T.check_attention_loads("llama")


def test_loads_attention_must_list_eager(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("_vocabulary.yaml", "llama.yaml"):
        (specs / name).write_text((ROOT / "specs" / name).read_text())
    text = (ROOT / "specs" / "llama.yaml").read_text().replace(
        "  classes: [LlamaForCausalLM]\n", "  classes: [LlamaForCausalLM]\n  attention: [sdpa, sdpaa]\n")
    (specs / "llama.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert "loads.attention.1: Input should be 'eager', 'sdpa'" in str(e.value)


def test_loads_attention_without_eager_is_refused(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "_vocabulary.yaml").write_text((ROOT / "specs" / "_vocabulary.yaml").read_text())
    text = (ROOT / "specs" / "llama.yaml").read_text().replace(
        "  classes: [LlamaForCausalLM]\n", "  classes: [LlamaForCausalLM]\n  attention: [sdpa]\n")
    (specs / "llama.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert str(e.value) == ("specs/llama.yaml:12:14: loads.attention: every class accepts 'eager' "
                            "(the reference the tests run); list it")
