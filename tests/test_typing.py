"""Typed models: what mypy (and so an editor) sees of a model loaded as its family.

``nnatlas.families.<family>.load`` / ``.wrap`` return the family's generated ``Model``, whose hosts
name every standard value: a value reads as ``Value``, an edit assigns, a misspelt name is an error.
At run time ``nnatlas.wrap`` returns an instance of that same class.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnatlas.compiler.typecheck import package_tree
from nnatlas.testing import build

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = '''\
from typing import Any

import nnatlas
from nnatlas.families import llama


def script(hf: Any) -> None:
    model = llama.wrap(hf)
    reveal_type(model)
    reveal_type(model.layers[0].self_attn.attention_queries)
    reveal_type(model.layers[0].mlp.output)
    reveal_type(model.num_layers)
    model.layers[0].self_attn.attention_querys
    model.layerz
    model.layers[1].mlp.mlp_output = lambda v: v * 2
    model.layers[1].mlp.mlp_output = model.layers[0].mlp.mlp_output * 0.5
    with model.trace("The Eiffel Tower is in"):
        saved = model.layers[0].layer_output.save()
    print(saved)
    reveal_type(llama.load("a/path", attn_implementation="eager"))
    reveal_type(nnatlas.wrap(hf))
'''

CONFIG = '''\
[mypy]
python_version = 3.11
ignore_missing_imports = True
follow_imports = silent
[mypy-torch.*]
follow_imports = skip
[mypy-transformers.*]
follow_imports = skip
'''


@pytest.fixture(scope="module")
def mypy_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[str]]:
    tmp = tmp_path_factory.mktemp("typing")
    (tmp / "sample.py").write_text(SAMPLE)
    config = CONFIG.replace("[mypy]\n", f"[mypy]\nmypy_path = {package_tree(tmp / 'site')}\n", 1)
    (tmp / "mypy.ini").write_text(config)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp / "mypy.ini"), "--cache-dir",
                           str(tmp / "cache"), "--no-error-summary", str(tmp / "sample.py")],
                          capture_output=True, text=True, cwd=tmp, timeout=600)
    out: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        m = re.match(r".*sample\.py:(\d+): (.*)", line)
        assert m, f"mypy said something unexpected: {line}\n{done.stderr}"
        out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def _line(text: str) -> int:
    return next(k for k, line in enumerate(SAMPLE.splitlines(), 1) if line.strip() == text)


def test_a_family_load_is_its_generated_model(mypy_lines: dict[int, list[str]]) -> None:
    assert mypy_lines[_line("reveal_type(model)")] == ['note: Revealed type is "nnatlas.families.llama.Model"']
    assert mypy_lines[_line('reveal_type(llama.load("a/path", attn_implementation="eager"))')] == [
        'note: Revealed type is "nnatlas.families.llama.Model"']
    assert mypy_lines[_line("reveal_type(nnatlas.wrap(hf))")] == ['note: Revealed type is "nnatlas.model.AtlasModel"']


def test_standard_values_read_as_values(mypy_lines: dict[int, list[str]]) -> None:
    for text in ("reveal_type(model.layers[0].self_attn.attention_queries)", "reveal_type(model.layers[0].mlp.output)"):
        assert mypy_lines[_line(text)] == ['note: Revealed type is "nnatlas.tree.values.Value"'], text
    assert mypy_lines[_line("reveal_type(model.num_layers)")] == ['note: Revealed type is "Any"']


def test_a_misspelt_name_is_an_error_and_edits_type_check(mypy_lines: dict[int, list[str]]) -> None:
    typo = mypy_lines[_line("model.layers[0].self_attn.attention_querys")]
    assert len(typo) == 1 and typo[0].startswith('error: "LayerSelfAttn" has no attribute "attention_querys"')
    assert 'maybe "attention_queries"' in typo[0]
    assert mypy_lines[_line("model.layerz")][0].startswith('error: "Model" has no attribute "layerz"')
    reported = {k for k, said in mypy_lines.items() if any(s.startswith("error") for s in said)}
    assert reported == {_line("model.layers[0].self_attn.attention_querys"), _line("model.layerz")}


def test_wrap_returns_the_familys_generated_class() -> None:
    import nnatlas
    from nnatlas.families import llama

    model = build("llama")
    assert type(model) is llama.Model and isinstance(model, nnatlas.AtlasModel)
    again = llama.wrap(model.native)
    assert type(again) is llama.Model and again.family == "llama"
    assert llama.wrap(again) is again
    assert type(nnatlas.wrap(model.native, family="llama")) is llama.Model


def test_a_family_load_returns_its_model_from_a_checkpoint(tmp_path: Path) -> None:
    """llama.load on a saved tiny llama: from_pretrained, the tokenizer beside it, the family's Model;
    and nnatlas.load picks the same class from the config."""
    import torch

    import nnatlas
    from nnatlas.families import llama

    built = build("llama")
    built.native.save_pretrained(tmp_path)
    built.tokenizer.save_pretrained(tmp_path)
    model = llama.load(str(tmp_path))
    assert type(model) is llama.Model and model.tokenizer is not None
    assert type(nnatlas.load(str(tmp_path))) is llama.Model
    with model.trace("the eiffel tower"):
        out = model.layers[0].layer_output.save()
    assert out.shape[-1] == model.hidden_size and isinstance(out, torch.Tensor)


def test_the_type_check_sees_every_module_as_installed(tmp_path: Path) -> None:
    """``make check`` type-checks the package laid out as installed: every module of runtime/, compiler/ and
    generated/families/ is in the tree under its import name, and mypy's paths map back to the checkout."""
    from nnatlas.compiler import typecheck

    from . import imports as I

    site = typecheck.package_tree(tmp_path)
    wanted = {name: path for pkg in I.PACKAGES for name, path in I.modules(pkg).items()}
    for name, path in wanted.items():
        parts = name.split(".")[1:]
        found = site.joinpath("nnatlas", *parts)
        found = found / "__init__.py" if path.name == "__init__.py" else found.with_suffix(".py")
        assert found.resolve() == path.resolve(), name
    shown = f"{site}/nnatlas/compiler/emit/emit.py:3: error\n{site}/nnatlas/model.py:1: note\n{site}/nnatlas/families/llama.py"
    assert typecheck.source_path(shown, site) == "compiler/emit/emit.py:3: error\nruntime/model.py:1: note\ngenerated/families/llama.py"
    assert typecheck.package_tree(tmp_path) == site  # made afresh over the last tree


def test_the_type_check_resolves_nnatlas_imports() -> None:
    """pyproject's mypy settings refuse an import of nnatlas that does not resolve (the check would silently
    see ``Any`` where the compiler or an adapter uses the runtime)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    overrides = [o for o in config.get("overrides", []) if "nnatlas.*" in o["module"]]
    assert overrides and overrides[0]["ignore_missing_imports"] is False
    assert "nnatlas.compiler.typecheck" in (ROOT / "Makefile").read_text()
