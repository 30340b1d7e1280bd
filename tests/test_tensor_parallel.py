"""Tensor parallel (transformers' ``tp_plan="auto"`` under torchrun, gloo on CPU): every value a trace saves is
the full tensor on every rank, equal to one process's, and so are an edit's logits and the gradients
(``nnatlas.testing.tp_oracle``, one torchrun launch over a dense, a mixture, a hybrid and an image-text family,
with generate's per-step edits and model.cache);
a family transformers cannot shard says so before anything loads; a model that is not sharded pays nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nnatlas
from nnatlas.requests import Target
from nnatlas.testing import shared_build

# a dense, a mixture (experts inside moe_tp_experts: partial sums), a hybrid (Mamba and attention blocks, a mixture
# on some), an image-text family traced with images (LLaVA: CLIP and a llama)
FAMILIES = ("llama", "qwen3_moe", "jamba", "llava")


@pytest.mark.torchrun
def test_two_gloo_ranks_serve_the_values_edits_and_gradients_of_one_process(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "nnatlas.testing.tp_oracle",
                           ",".join(FAMILIES), "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    report = json.loads((tmp_path / "tp_oracle.json").read_text()) if (tmp_path / "tp_oracle.json").exists() else {}
    failed = {f: r["error"] for f, r in report.items() if isinstance(r, dict) and "error" in r}
    assert done.returncode == 0 and not failed, failed or done.stderr[-3000:]
    assert report["world_size"] == 2
    for family in FAMILIES:
        r = report[family]
        assert r["values"] > 30 and r["grads"], (family, r)
        assert r["max_value_diff"] < 1e-5 and r["max_grad_diff"] < 1e-4, (family, r)
        assert r["max_cache_diff"] < 1e-5 and (r["max_generate_diff"] or 0) < 1e-5, (family, r)
    # the values a rank holds a shard of: the heads of every attention, the neurons of a dense MLP
    assert any("attention_queries: num_heads" in v for v in report["llama"]["sharded_values"])
    assert any("mlp_neurons: intermediate_size" in v for v in report["llama"]["sharded_values"])
    assert "layers[0].mlp.expert_outputs" in report["qwen3_moe"]["edits"]
    assert report["jamba"]["edits"] and report["llava"]["edits"]
    assert report["llama"]["max_generate_diff"] is not None  # generate, with an edit at every step


def test_a_config_without_a_tp_plan_is_refused_before_anything_loads(tmp_path: Path) -> None:
    """gpt2's config class has no base_model_tp_plan: one Unavailable naming it, before from_pretrained
    (no process group is needed to say so)."""
    shared_build("gpt2").config.save_pretrained(tmp_path)  # (the config is all the check reads)
    with pytest.raises(nnatlas.Unavailable, match="no tensor-parallel plan"):
        nnatlas.load(str(tmp_path), tp_plan="auto", tokenizer=None)


def test_a_family_transformers_cannot_shard_says_so(tmp_path: Path) -> None:
    """qwen3_5_text / qwen3_next fail inside transformers' own tensor parallel (the gated DeltaNet path): refused
    before loading, and at wrap when the user sharded the model."""
    shared_build("qwen3_5_text").config.save_pretrained(tmp_path)
    with pytest.raises(nnatlas.Unavailable, match="cannot run under tensor parallel"):
        nnatlas.load(str(tmp_path), tp_plan="auto", tokenizer=None)
    hf = shared_build("qwen3_next").native
    hf.__dict__["_tp_size"] = 2  # (what transformers' tp_plan leaves on a sharded model)
    try:
        with pytest.raises(nnatlas.Unavailable, match="qwen3_next cannot run under tensor parallel"):
            nnatlas.wrap(hf)
    finally:
        del hf.__dict__["_tp_size"]


def test_a_model_that_is_not_sharded_serves_plain_targets() -> None:
    """The one check is at wrap (an attribute read): an unsharded model's targets are the plain ones, and a
    save with local=True is the whole value."""
    model = shared_build("llama")
    assert model._tp is None
    handle = model.layers[0].self_attn.attention_queries
    assert type(model._target(handle)) is Target
    with model.trace("a b c"):
        q = handle.save()
        ql = model.layers[0].self_attn.attention_queries.save(local=True)
    assert q.shape == ql.shape and bool((q == ql).all())
    assert "tensor parallel" not in repr(model.support())
