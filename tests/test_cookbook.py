"""Every block of docs/cookbook.md runs, in order, as a researcher would run it: on a tiny dense (llama), hybrid
(qwen3_5_text) and mixture (qwen3_moe) checkpoint saved with save_pretrained and loaded with nnatlas.load, the
```sh blocks through the `nnatlas` command's own entry point. A few checks the page does not show follow each
recipe, so that a recipe that silently stopped doing its job fails."""

from __future__ import annotations

import random
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from nnatlas import testing
from nnatlas.compiler.cli import main as nnatlas_main
from nnatlas.compiler.emit import cookbook

ROOT = Path(__file__).resolve().parent.parent
TITLE, INTRO, RECIPES = cookbook.parse((ROOT / cookbook.SOURCE).read_text())
FAMILIES = ("llama", "qwen3_5_text", "qwen3_moe")


def test_the_cookbook_has_the_five_workflows() -> None:
    assert [r.anchor for r in RECIPES] == ["logit-lens", "activation-patching", "attribution-patching",
                                           "steering-during-generate", "caching-a-corpus-then-training-a-probe-and-an-sae"]
    assert all(any(lang == "python" for lang, _ in cookbook.code_blocks(r.body)) for r in RECIPES)


def checkpoint(family: str, folder: Path) -> Path:
    model = testing.build(family, seed=3)
    model.native.save_pretrained(folder / "ckpt")
    model.tokenizer.save_pretrained(folder / "ckpt")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(testing.WORDS) for _ in range(rng.randint(3, 12))) for _ in range(40)]
    (folder / "corpus.txt").write_text("\n".join(lines) + "\n")
    return folder / "ckpt"


def run_block(lang: str, code: str, ns: dict[str, Any], where: str) -> None:
    if lang == "python":
        exec(compile(code, where, "exec"), ns)  # noqa: S102 - the page's own code, as a reader runs it
        return
    assert lang == "sh", where
    for line in code.strip().splitlines():
        args = shlex.split(line.replace("CHECKPOINT", ns["CHECKPOINT"]))
        assert args[0] == "nnatlas", where
        assert nnatlas_main(args[1:]) == 0, f"{where}: {line}"


def checks(anchor: str, ns: dict[str, Any]) -> None:
    """What each recipe must have done, beyond the asserts it shows."""
    model = ns["model"]
    if anchor == "logit-lens":
        assert len(ns["lens"]) == model.num_layers and len(ns["guesses"]) == model.num_layers
    elif anchor == "activation-patching":
        assert len(ns["recovered"]) == model.num_layers
        clean = float(ns["clean_logits"][0, -1].log_softmax(-1)[ns["answer"]])
        assert ns["recovered"][-1] == pytest.approx(clean, abs=1e-5)
    elif anchor == "attribution-patching":
        assert any(abs(a) > 0 for a in ns["attribution"])
    elif anchor == "steering-during-generate":
        with model.generate("the eiffel tower is", max_new_tokens=6) as plain:
            for _ in plain.iter[:]:
                last = model.logits.save()
        assert not torch.equal(last, ns["logits"])  # the edit reached the model on the steps
    else:
        assert ns["stored"].rows > 0 and len(ns["losses"]) > 20


@pytest.mark.parametrize("family", FAMILIES)
def test_every_recipe_runs(family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = checkpoint(family, tmp_path)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    ns: dict[str, Any] = {"CHECKPOINT": str(ckpt)}
    for recipe in RECIPES:
        for n, (lang, code) in enumerate(cookbook.code_blocks(recipe.body)):
            run_block(lang, code, ns, f"{cookbook.SOURCE}: {recipe.title}, block {n} ({family})")
        checks(recipe.anchor, ns)
