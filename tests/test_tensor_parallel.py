"""Tensor parallel (transformers' ``tp_plan="auto"`` under torchrun, gloo on CPU): every value a trace saves is
the full tensor on every rank, equal to one process's, and so are an edit's logits and the gradients
(``nnatlas.testing.tp_oracle``, one torchrun launch over a dense, a mixture, a hybrid and an image-text family,
with generate's per-step edits and model.cache, then ``nnatlas cache --tp 2`` in the same launch);
a family transformers cannot shard says so before anything loads; a model that is not sharded pays nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nnatlas
from nnatlas.cli import cache as cache_cli
from nnatlas.testing import WORDS, shared_build
from nnatlas.trace.requests import Target

# a dense, a mixture (experts inside moe_tp_experts: partial sums), a hybrid (Mamba and attention blocks, a mixture
# on some), a second hybrid whose delta-rule state is a Box (Kimi Linear's initial state, None on one call: a
# rank's save(local=True) of it once raised), an image-text family traced with images (LLaVA: CLIP and a llama)
FAMILIES = ("llama", "qwen3_moe", "jamba", "kimi_linear", "llava")


@pytest.mark.torchrun
def test_two_gloo_ranks_serve_the_values_edits_and_gradients_of_one_process(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    data = tmp_path / "corpus.txt"
    data.write_text("".join(" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(1 + i % 9)) + "\n"
                            for i in range(12)))
    cache = [str(tmp_path / "llama"), "--data", str(data), "--values", "layer_output,mlp.mlp_neurons", "--layers",
             "0,1", "--batch-size", "4", "--seq-len", "10", "--shard-size", "0.004", "--no-progress"]
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "nnatlas.testing.tp_oracle",
                           ",".join(FAMILIES), "--out", str(tmp_path),
                           "--cache", " ".join([*cache, "--out", str(tmp_path / "cache-tp"), "--tp", "2"])],
                          env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "tp_oracle.json").read_text()) if (tmp_path / "tp_oracle.json").exists() else {}
    failed = {f: r["error"] for f, r in report.items() if isinstance(r, dict) and "error" in r}
    assert done.returncode == 0 and not failed, failed or done.stderr[-3000:]
    assert report["world_size"] == 2
    for family in FAMILIES:
        r = report[family]
        assert r["values"] > 30 and r["grads"], (family, r)
        # gradients relative to the largest (float32 sums in another order: 0.7-3.7e-7 of it here; the perturbed
        # kimi_linear's reach 3434, where 9.8e-4 is 2.8e-7 of it)
        assert r["max_value_diff"] < 1e-5 and r["max_grad_diff"] < 2e-6 * r["max_grad"], (family, r)
        assert r["max_cache_diff"] < 1e-5 and (r["max_generate_diff"] or 0) < 1e-5, (family, r)
    # the values a rank holds a shard of: the heads of every attention, the neurons of a dense MLP
    assert any("attention_queries: num_heads" in v for v in report["llama"]["sharded_values"])
    assert any("mlp_neurons: intermediate_size" in v for v in report["llama"]["sharded_values"])
    # the tiny qwen3_moe keeps a dense block first (mlp_only_layers [0]): its neurons, then the mixture's experts
    assert {"layers[0].mlp.mlp_neurons", "layers[1].mlp.expert_outputs"} <= set(report["qwen3_moe"]["edits"])
    assert report["jamba"]["edits"] and report["llava"]["edits"]
    assert report["llama"]["max_generate_diff"] is not None  # generate, with an edit at every step
    # nnatlas cache --tp 2: one copy of the model over the 2 ranks writes the rows of one process
    assert report["cache"]["exit"] == 0
    assert cache_cli.main([*cache, "--out", str(tmp_path / "cache-one")]) == 0
    one, tp = nnatlas.Cache.load(tmp_path / "cache-one"), nnatlas.Cache.load(tmp_path / "cache-tp")
    assert (tp.manifest["world_size"], tp.schema.tp_size, one.schema.tp_size) == (1, 2, 1)
    assert "tp_size" not in one.manifest  # (a run without --tp has the settings, and the run id, it had before)
    assert (one.rows, one.values, len(one.manifest["shards"])) == (tp.rows, tp.values, len(tp.manifest["shards"]))
    for key in ("meta.doc", "meta.position", "meta.token"):
        assert torch.equal(one[key], tp[key])
    for label in one.values:  # mlp_neurons: each rank computes half of them, gathered
        torch.testing.assert_close(tp[label], one[label], atol=1e-6, rtol=1e-5)


def test_a_config_without_a_tp_plan_is_refused_before_anything_loads(tmp_path: Path) -> None:
    """gpt2's config class has no base_model_tp_plan: one Unavailable naming it, before from_pretrained
    (no process group is needed to say so)."""
    shared_build("gpt2").config.save_pretrained(tmp_path)  # (the config is all the check reads)
    with pytest.raises(nnatlas.Unavailable, match="no tensor-parallel plan"):
        nnatlas.load(str(tmp_path), tp_plan="auto", tokenizer=None)


def test_cache_tp_bad_values_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``nnatlas cache --tp``: without torchrun, a count that does not divide the ranks, a family without a TP plan
    or one transformers cannot shard: one line, exit 2, before any process group (every rank says the same)."""
    gpt2, qwen = tmp_path / "gpt2", tmp_path / "qwen3_5_text"
    shared_build("gpt2").config.save_pretrained(gpt2)
    shared_build("qwen3_5_text").config.save_pretrained(qwen)
    data = tmp_path / "corpus.txt"
    data.write_text("a b c\n")

    def said(model: Path, world: int, *extra: str) -> str:
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("RANK", "0")
        assert cache_cli.main([str(model), "--data", str(data), "--out", str(tmp_path / "out"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("nnatlas cache: error: ") and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()
        return err

    assert "--tp 2 shards the model over torchrun's ranks, and this is one process" in said(gpt2, 1, "--tp", "2")
    assert "--tp 3 does not divide the 4 ranks torchrun started" in said(gpt2, 4, "--tp", "3")
    assert "--tp 0: the ranks per copy of the model are at least 1" in said(gpt2, 1, "--tp", "0")
    assert "GPT2Config has no tensor-parallel plan" in said(gpt2, 2, "--tp", "2")
    assert "family qwen3_5_text cannot run under tensor parallel" in said(qwen, 2, "--tp", "2")


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


def test_each_family_page_says_how_its_values_are_served_under_tensor_parallel() -> None:
    """A page's tensor-parallel section is what support() says on 2 ranks from the model's own TP plan
    (tensor_parallel.planned, recorded with the printout): the tiny llama gives the lines recorded from its
    checkpoint; a family without a TP plan, one transformers cannot shard and one whose backward it cannot run say
    why."""
    from nnatlas.compiler.emit import printouts
    from nnatlas.parallel.tensor_parallel import planned

    root = Path(__file__).resolve().parents[1]
    head = printouts.parse_header((root / printouts.path_for("llama")).read_text())
    assert head is not None and head.facts["tensor_parallel"]["values"] == planned(shared_build("llama"))["values"]
    page = {f: (root / "generated" / "docs" / f"{f}.md").read_text() for f in ("llama", "gpt2", "qwen3_next",
                                                                              "llama4_text")}
    assert "| sharded (rowwise input): all-gathered on its intermediate_size axis | `layers[i].mlp.mlp_neurons` |" \
        in page["llama"]
    assert "cannot be sharded by transformers' tensor parallel: GPT2Config has no tensor-parallel plan" in page["gpt2"]
    assert "cannot be sharded by transformers' tensor parallel: transformers' tensor parallel fails in its gated " \
        "DeltaNet path" in page["qwen3_next"]
    assert "`trace(grad=True)` is refused under tensor parallel" in page["llama4_text"]


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
