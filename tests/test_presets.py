"""``presets: [no_attention]``: an attention-free family needs no ``{unavailable}`` line per head size."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from nnatlas.compiler import SpecError, compile_atlas
from nnatlas.compiler.emit import emit
from nnatlas.compiler.language.presets import PRESETS

from .conftest import drop_families


@pytest.fixture
def spec_root(spec_root: Path) -> Path:
    """The checkout's specs less mamba and the families that extend it: these tests write their own mamba."""
    drop_families(spec_root, "mamba")
    return spec_root


# an attention-free family, written the short way (a test fixture: the real mamba spec is the breadth issue's)
MAMBA = """\
family: mamba
title: Mamba
lines: [Mamba]
summary: A stack of selective state-space mixers; no attention anywhere.
traits: []
loads: {model_types: [mamba], classes: [MambaForCausalLM]}
presets: [no_attention]
rename:
  layers: backbone.layers
  embed_tokens: backbone.embeddings
  norm: backbone.norm_f
  lm_head: lm_head
config:
  num_layers: num_hidden_layers
  hidden_size: hidden_size
  vocab_size: vocab_size
  intermediate_size: intermediate_size
hosts:
  model:
    class: MambaForCausalLM
    values:
      input_ids: input.input_ids
      token_embeddings: embed_tokens.output
      logits: output.logits
  layers[i]:
    class: MambaBlock
    values:
      layer_input: input
      layer_output: output
tiny:
  model_class: MambaForCausalLM
  config_class: MambaConfig
  config: {vocab_size: 64, state_size: 4, expand: 2, conv_kernel: 3}
  draw:
    num_hidden_layers: [1, 2]
    hidden_size: [8, 16]
"""


def _family_module(root: Path, name: str) -> Any:
    atlas = compile_atlas(root / "specs", root)
    (fam,) = [f for f in atlas.families if f.name == name]
    path = root / f"{name}_adapter.py"
    path.write_text(emit.render_family(fam))
    spec = importlib.util.spec_from_file_location(f"_nnatlas_test_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_no_attention_preset_fills_the_head_sizes(spec_root: Path) -> None:
    from transformers import MambaConfig, MambaForCausalLM

    import nnatlas
    from nnatlas.model import AtlasModel

    (spec_root / "specs" / "mamba.yaml").write_text(MAMBA)
    module = _family_module(spec_root, "mamba")
    torch.manual_seed(0)
    hf = MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2))
    model = AtlasModel(hf, module.FAMILY)
    assert (model.num_layers, model.hidden_size, model.intermediate_size) == (2, 16, 32)
    for key in ("num_heads", "num_kv_heads", "head_dim", "qk_head_dim"):
        with pytest.raises(nnatlas.Unavailable) as info:
            getattr(model, key)
        assert str(info.value).startswith(f"model.{key}: Mamba has no attention (its mixer is a state-space scan")
    # the family still reads and runs: the stream around each block
    ids = torch.randint(0, 64, (2, 5))
    with model.trace(ids):
        embedded = model.token_embeddings.save()
        first = model.layers[0].layer_input.save()
    assert torch.equal(first, embedded)


def test_an_entry_the_spec_writes_wins_over_the_preset(spec_root: Path) -> None:
    (spec_root / "specs" / "mamba.yaml").write_text(MAMBA.replace("  intermediate_size: intermediate_size\n",
                                                                  "  intermediate_size: intermediate_size\n  head_dim: 7\n"))
    atlas = compile_atlas(spec_root / "specs", spec_root)
    (fam,) = [f for f in atlas.families if f.name == "mamba"]
    config = {k: text for k, _, text in fam.config}
    assert config["head_dim"] == "7"
    assert config["num_heads"].startswith("Unavailable: model.num_heads: Mamba has no attention")


def test_without_the_preset_the_error_names_it(spec_root: Path) -> None:
    (spec_root / "specs" / "mamba.yaml").write_text(MAMBA.replace("presets: [no_attention]\n", ""))
    with pytest.raises(SpecError) as info:
        compile_atlas(spec_root / "specs", spec_root)
    lines = str(info.value).splitlines()
    assert len(lines) == 4 and all(line.startswith("specs/mamba.yaml:") for line in lines)
    hint = " (an attention-free family takes them all with `presets: [no_attention]`)"
    assert sorted(line.split(": ", 1)[1] for line in lines) == [
        f"config: the normalized attribute '{key}' is required{hint}"
        for key in ("head_dim", "num_heads", "num_kv_heads", "qk_head_dim")]


def test_an_unknown_preset_is_refused(spec_root: Path) -> None:
    (spec_root / "specs" / "mamba.yaml").write_text(MAMBA.replace("presets: [no_attention]", "presets: [no_atention]"))
    with pytest.raises(SpecError) as info:
        compile_atlas(spec_root / "specs", spec_root)
    assert str(info.value).splitlines() == [
        f"specs/mamba.yaml:7:11: unknown preset 'no_atention' (presets: {', '.join(sorted(PRESETS))}); "
        "did you mean 'no_attention'?"]
