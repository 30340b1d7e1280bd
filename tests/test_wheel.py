"""nnatlas as a researcher installs it: the wheel (not editable) ships every subpackage, its templates and the
specs, so a pip-installed nnatlas drafts and compiles a spec, loads a model with a user's spec and runs `nnatlas
cache` without a checkout, and the commands that need a checkout say so in one line, naming --root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from nnatlas import testing

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_of_the_package_is_listed() -> None:
    """pyproject's packages name every folder with an __init__.py under the runtime, the compiler and the adapters
    (nnatlas.compiler.draft was missing: `nnatlas draft` failed from a wheel)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = tool["package-dir"]
    listed = set(tool["packages"])
    for package, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts]) if rel.parts else package
            if not any(name.startswith(other + ".") and other != package for other in dirs):
                assert name in listed, f"{name} ({init.parent}) is not in pyproject's packages"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, installed (its files, not a link) into a folder of its own."""
    top = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(top / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (top / "dist").glob("nnatlas-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("nnatlas/compiler/draft/__init__.py", "nnatlas/compiler/emit/templates/test_family.py.j2",
                   "nnatlas/specs/_vocabulary.yaml", "nnatlas/specs/parts/qwen_vit.yaml", "nnatlas/families/llama.py",
                   "nnatlas/testing/__init__.py", "nnatlas/families/version_status.json"):
        assert needed in names, needed
    subprocess.run([*pip, "install", "--no-deps", "--target", str(top / "site"), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    return top


def run(top: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with the installed wheel first on the path, in a folder that is no checkout."""
    env = {**os.environ, "PYTHONPATH": str(top / "site"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=top, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_is_what_runs(installed: Path) -> None:
    done = run(installed, "-c", "import nnatlas, nnatlas.compiler.draft; print(nnatlas.__file__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(installed / "site" / "nnatlas" / "__init__.py")


def test_the_wheel_carries_the_status_matrix(installed: Path) -> None:
    """The load-time version check reads the status shipped in the wheel, the one this checkout generated."""
    done = run(installed, "-c", "import json; from nnatlas.loading import version_status as v; "
                                "print(json.dumps(v.carried(), sort_keys=True))")
    assert done.returncode == 0, done.stderr
    shipped = json.loads(done.stdout)
    assert shipped == json.loads((ROOT / "generated" / "families" / "version_status.json").read_text())
    assert shipped["families"]["llama"]["5.24.0"]["result"] == "pass"


@pytest.mark.parametrize("command", ["generate", "docs", "status", "new foo --from llama", "draft helium"])
def test_commands_that_need_a_checkout_say_so(installed: Path, command: str) -> None:
    done = run(installed, "-m", "nnatlas", *command.split())
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a checkout of nnatlas" in lines[0] and "--root DIR" in lines[0], done.stderr
    assert not (installed / "site" / "nnatlas" / "generated").exists()


def test_draft_and_compile_without_a_checkout(installed: Path) -> None:
    out = installed / "helium.yaml"
    done = run(installed, "-m", "nnatlas", "draft", "helium", "--out", str(out), "--no-test")
    assert done.returncode == 0, done.stderr + done.stdout
    compiled = run(installed, "-c", "import sys; from nnatlas.compiler.draft.check import compile_draft; "
                   f"c = compile_draft(open({str(out)!r}).read(), 'helium'); print(c.error); "
                   "sys.exit(c.family is None)")
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr


def test_cache_from_the_wheel(installed: Path) -> None:
    model = testing.build("llama", seed=1)
    model.native.save_pretrained(installed / "ckpt")
    model.tokenizer.save_pretrained(installed / "ckpt")
    (installed / "corpus.txt").write_text("the eiffel tower is in paris\na big red city\nthe first one\n")
    done = run(installed, "-m", "nnatlas", "cache", "ckpt", "--data", "corpus.txt", "--values", "layer_output",
               "--layers", "0", "--out", "acts", "--batch-size", "2", "--seq-len", "16")
    assert done.returncode == 0, done.stderr
    # the same interpreter loads the checkpoint with a user's spec (llama's, as the wheel ships it, renamed), compiled
    # at load from the wheel: its values are what transformers computes
    shipped = (installed / "site" / "nnatlas" / "specs" / "llama.yaml").read_text()
    (installed / "my_llama.yaml").write_text(shipped.replace("family: llama", "family: my_llama", 1))
    read = run(installed, "-c", READ_AND_LOAD_WITH_A_SPEC)
    assert read.returncode == 0, read.stderr
    rows, where, family, compiled = read.stdout.split()
    assert int(rows) == 6 + 4 + 3 and where.startswith(str(installed / "site"))
    assert (family, compiled) == ("my_llama", "True")


READ_AND_LOAD_WITH_A_SPEC = """\
import sys, torch, nnatlas
c = nnatlas.Cache.load('acts', verify='content')
model = nnatlas.load('ckpt', spec='my_llama.yaml')
ids = torch.tensor([[2, 5, 9, 3, 7]])
with model.trace({"input_ids": ids}):
    outs = [model.layers[i].layer_output.save() for i in range(model.num_layers)]
    logits = model.logits.save()
with torch.no_grad():
    plain = model.native(input_ids=ids, output_hidden_states=True)
assert torch.equal(logits, plain.logits)
assert all(torch.equal(o, h) for o, h in zip(outs[:-1], plain.hidden_states[1:-1], strict=True))
print(c.rows, nnatlas.__file__, model.family, "nnatlas.compiler.userspec" in sys.modules)
"""
