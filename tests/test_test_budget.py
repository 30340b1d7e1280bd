"""What each family's generated tests cost: hypothesis draws at least 3 examples per test (default 3,
a reference family asks for more), and an identity runs under every experts implementation only on
the hosts read at the experts (the others' values do not depend on it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas

ROOT = Path(__file__).resolve().parent.parent


def _specs_with(tmp_path: Path, old: str, new: str) -> Path:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "_vocabulary.yaml").write_text((ROOT / "specs" / "_vocabulary.yaml").read_text())
    text = (ROOT / "specs" / "llama.yaml").read_text()
    assert old in text
    (specs / "llama.yaml").write_text(text.replace(old, new))
    return specs


@pytest.mark.parametrize("n", [0, 2])
def test_fewer_than_three_examples_are_refused_with_their_place(tmp_path: Path, n: int) -> None:
    specs = _specs_with(tmp_path, "  examples: 12", f"  examples: {n}")
    line = next(i for i, t in enumerate((specs / "llama.yaml").read_text().splitlines(), 1) if t.startswith("  examples:"))
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert f"llama.yaml:{line}:" in str(e.value)
    assert "tiny.examples: between 3 and 1000" in str(e.value)


def test_the_default_is_three(tmp_path: Path) -> None:
    specs = _specs_with(tmp_path, "  examples: 12", "")
    (family,) = (f for f in compile_atlas(specs, tmp_path).families if f.name == "llama")
    assert family.tiny.examples == 3


def _assigned(module: ast.Module, name: str) -> ast.expr:
    return next(n.value for n in module.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets))


def test_identities_run_under_each_experts_implementation_only_where_the_experts_are_read() -> None:
    tree = ast.parse((ROOT / "generated" / "tests" / "test_qwen3_next.py").read_text())
    experts = ast.literal_eval(_assigned(tree, "EXPERTS"))
    assert experts == ("eager", "batched_mm", "grouped_mm")
    assert ast.literal_eval(_assigned(tree, "EXPERT_PATHS")) == ("layers[i].mlp",)
    identities = ast.literal_eval(_assigned(tree, "IDENTITIES"))
    namespace = {"IDENTITIES": identities, "EXPERTS": experts, "EXPERT_PATHS": ("layers[i].mlp",)}
    cases = eval(compile(ast.Expression(_assigned(tree, "IDENTITY_CASES")), "IDENTITY_CASES", "eval"), namespace)
    for path, index in identities:
        run = [e for p, k, e in cases if (p, k) == (path, index)]
        assert run == (list(experts) if path == "layers[i].mlp" else ["eager"]), (path, index, run)
