"""nnatlas draft: the drafter against the hand-written specs (its answer key), the spec text it
writes, the command, and one draft taken through its generated tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from nnatlas.compiler import OWNED, compile_atlas, default_root
from nnatlas.compiler import draft_sweep as sweep
from nnatlas.compiler.cli import main
from nnatlas.compiler.draft import DraftError, draft, recorder, tiny, writer
from nnatlas.compiler.draft.check import compare, compile_draft, parse_summary, run_tests
from nnatlas.compiler.draft.proposal import Proposal
from nnatlas.compiler.emit import files

ATLAS = compile_atlas(default_root() / "specs")


@pytest.fixture(scope="module")
def drafts() -> dict[str, object]:
    return {}


def _draft(cache: dict[str, object], model_type: str):  # type: ignore[no-untyped-def]
    if model_type not in cache:
        cache[model_type] = draft(model_type)
    return cache[model_type]


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3_next"])
def test_draft_finds_the_hand_written_values(family: str, drafts: dict[str, object]) -> None:
    d = _draft(drafts, family)
    compiled = compile_draft(d.text, family)  # type: ignore[attr-defined]
    assert compiled.family is not None, compiled.error
    hand = next(f for f in ATLAS.families if f.name == family)
    cmp = compare(compiled.family, hand)
    assert cmp.missing == {}, f"the draft lacks {cmp.missing}"
    assert cmp.differ == {}, f"the draft reads these elsewhere: {cmp.differ}"
    assert cmp.share == 1.0
    assert sum(len(v) for v in cmp.matched.values()) == sum(len(h.values) for h in hand.hosts
                                                             if not h.path.startswith("vision")) or family == "qwen3_next"


def test_draft_of_a_hybrid_mixture(drafts: dict[str, object]) -> None:
    """qwen3_next: block kinds from layer_types, the delta-rule group with its token-by-token route,
    the mixture's identities (each held on the tiny model), the experts implementations."""
    p = _draft(drafts, "qwen3_next").proposal  # type: ignore[attr-defined]
    kinds = p.hosts["layers[i]"].kinds
    assert set(kinds) == {"linear_attention", "attention"}
    assert kinds["attention"].when == "layer_types[i] == 'full_attention'"
    assert p.functions["delta_rule"].names == ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"]
    assert p.functions["delta_rule"].route["torch"] == "torch_recurrent_gated_delta_rule"
    checks = [x.check for x in p.hosts["layers[i].mlp"].identities]
    assert "routed_output + shared_expert_output == mlp_output" in checks
    assert len(checks) == len(set(checks))
    assert p.experts == ["eager", "batched_mm", "grouped_mm"]
    assert p.hosts["layers[i].mlp.shared_experts"].dims == {"intermediate_size": "shared_expert_intermediate_size"}


def test_the_spec_text_is_commented(drafts: dict[str, object]) -> None:
    d = _draft(drafts, "gpt2")
    text = d.text  # type: ignore[attr-defined]
    data = yaml.safe_load(text)
    assert data["family"] == "gpt2" and data["rename"]["layers[i].self_attn"] == "attn"
    assert data["rename"]["layers[i].mlp.up_proj"] == "c_fc"
    assert "# sure: the nn.Embedding called with input_ids" in text
    assert "# held on the tiny model" in text
    # what the drafter could not settle is a TODO comment, named
    assert "# TODO: config.intermediate_size: n_inner is None by default" in text
    assert data["tiny"]["draw"]["n_head" if "n_head" in data["tiny"]["draw"] else "num_attention_heads"] == [2, 4]


def test_scalars_read_back() -> None:
    for x in (1e-6, 1.0e-5, 0.0, 2.5, 1e-12, "a: b # c", True, None, 7):
        assert yaml.safe_load(writer.scalar(x)) == x
    assert writer.scalar(1e-6) == "1.0e-6"
    assert yaml.safe_load(writer.flow({"a": [1, "x"], "b": {"c": 1e-5}})) == {"a": [1, "x"], "b": {"c": 1e-5}}


def test_recorder_puts_everything_back() -> None:
    plan = tiny.plan("llama")
    model = tiny.build(plan)
    ns = sys.modules[type(model.model.layers[0].self_attn).__module__].__dict__
    before = dict(ns)
    ids = torch.randint(4, 96, (1, 5))
    rec = recorder.record(model, {"input_ids": ids})
    assert rec.call("model.layers.0.self_attn") is not None
    assert any(f.name == "eager_attention_forward" for f in rec.fns)
    assert any(o.name == "softmax" for o in rec.ops)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert all(ns[k] is v for k, v in before.items())
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, rec.output["logits"])


def test_bad_model_types_say_why() -> None:
    with pytest.raises(DraftError, match="no model type 'nope'"):
        draft("nope")
    with pytest.raises(DraftError, match="no causal-LM class"):
        draft("vit")  # an image encoder: no causal-LM class


def test_cli_writes_the_draft(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.yaml"
    assert main(["draft", "llama", "--out", str(out), "--no-test"]) == 0
    assert yaml.safe_load(out.read_text())["loads"]["classes"] == ["LlamaForCausalLM"]
    assert "0 TODO" in capsys.readouterr().out
    assert main(["draft", "llama", "--out", str(out), "--no-test"]) == 2  # never over a spec unasked
    assert "exists; give another --out, or --force" in capsys.readouterr().err
    assert main(["draft", "llama", "--out", str(out), "--no-test", "--force"]) == 0
    assert main(["draft", "nope", "--out", str(tmp_path / "y.yaml"), "--no-test"]) == 2
    assert "no model type 'nope'" in capsys.readouterr().err


def test_a_failing_draft_never_lands_in_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft whose generated tests fail is written beside the specs folder (generate reads every spec there), with
    its failures at the top; one that does not compile too."""
    from nnatlas.compiler import cli
    from nnatlas.compiler.draft import check

    specs = tmp_path / "specs"
    specs.mkdir()
    failed = check.TestRun(3, 1, 0, "FAILED test_llama.py::test_identity[layers[i]-0]\n1 failed, 3 passed",
                           ["test_llama.py::test_identity[layers[i]-0]"])
    monkeypatch.setattr(check, "run_tests", lambda *a, **k: failed)
    assert main(["draft", "llama", "--out", str(specs / "my_llama.yaml")]) == 1
    assert list(specs.iterdir()) == []
    beside = tmp_path / "drafts" / "my_llama.failing.yaml"
    text = beside.read_text()
    assert text.startswith(f"# FAILING DRAFT: not written to {specs / 'my_llama.yaml'} (1 failure); fix these")
    assert "#   generated test failed: test_llama.py::test_identity[layers[i]-0]\n" in text
    assert f"wrote it to {beside} with its failures at the top" in capsys.readouterr().out
    monkeypatch.setattr(check, "compile_draft", lambda *a, **k: check.Compiled(None, None, "x.yaml:3:1: broken"))
    assert main(["draft", "llama", "--out", str(tmp_path / "mine.yaml")]) == 1
    assert not (tmp_path / "mine.yaml").exists()
    assert "#   generate: x.yaml:3:1: broken" in (tmp_path / "mine.failing.yaml").read_text()
    assert cli.failing_path(Path("a/specs/x.yaml")) == Path("a/drafts/x.failing.yaml")


def test_a_draft_passes_its_generated_tests(drafts: dict[str, object]) -> None:
    """mistral has no hand-written spec: its draft, unedited, generates and passes its tests."""
    d = _draft(drafts, "mistral")
    compiled = compile_draft(d.text, "mistral")  # type: ignore[attr-defined]
    assert compiled.family is not None, compiled.error
    run = run_tests(compiled.family, timeout=300)
    assert run.ok, run.output[-3000:]
    assert run.passed >= 30


def test_summary_parsing() -> None:
    run = parse_summary("FAILED test_x.py::test_a - boom\n1 failed, 38 passed, 1 skipped in 12.69s\n")
    assert (run.passed, run.failed, run.ok, run.failures) == (38, 1, False, ["test_x.py::test_a"])
    assert not parse_summary("ImportError: nothing ran").ok


def test_generate_keeps_the_sweep_table(tmp_path: Path) -> None:
    """generated/docs/draft_sweep.md is written by make draft-sweep: generate must neither delete nor flag it."""
    page = tmp_path / sweep.OUT
    page.parent.mkdir(parents=True)
    rows = [{"type": "mistral", "built": True, "drafted": True, "generate": True, "tests": True, "values": 25,
             "todos": 0, "share": None, "why": ""},
            {"type": "llama", "built": True, "drafted": True, "generate": True, "tests": False, "values": 25,
             "todos": 1, "share": 1.0, "hand": "llama", "why": "tests: test_llama.py::test_x"}]
    page.write_text(sweep.table(rows, 3, "now"), encoding="utf-8")
    text = page.read_text()
    assert "2 of 3 types swept; 2 build; 1 verified by load(draft=True)" in text
    assert "| llama | yes | yes | yes | no | 25 | 1 | 100% (llama) |" in text
    assert files.stale(tmp_path, {}, OWNED) == ([], [])


def test_sweep_types() -> None:
    types = sweep.model_types()
    assert {"mistral", "llama", "gpt2", "qwen3_next"} <= set(types)
    assert not {"bert", "bert-generation", "whisper", "bart", "roberta"} & set(types)


def test_draft_from_a_local_config(tmp_path: Path) -> None:
    """--model PATH: the checkpoint's own choices (not its sizes) stay in the tiny config."""
    from transformers import MistralConfig

    MistralConfig(hidden_act="gelu", rms_norm_eps=1e-5, hidden_size=64, num_attention_heads=4).save_pretrained(tmp_path)
    d = draft("mistral", model_path=str(tmp_path))
    assert d.proposal.tiny.config["hidden_act"] == "gelu"
    assert d.proposal.tiny.config["rms_norm_eps"] == 1e-5
    assert "hidden_size" not in d.proposal.tiny.config  # drawn, not copied
    assert compile_draft(d.text, "mistral").family is not None


def test_the_sweep_table_is_its_own_state() -> None:
    """A rerun reads the rows the table has (swept time and hand share too) and sweeps first the
    types it lacks, then the rows of a type whose hand-written spec is newer, then the named ones."""
    rows: list[dict[str, Any]] = [{"type": "llama", "built": True, "drafted": True, "generate": True, "tests": True, "values": 25, "todos": 0,
             "share": 1.0, "hand": "llama", "why": "", "swept": "12-01 13:00"},
            {"type": "bamba", "built": True, "drafted": False, "generate": False, "tests": None, "values": 0, "todos": 0,
             "share": 0.0, "hand": "bamba", "why": "forward failed: a | b", "swept": "12-01 13:01"},
            {"type": "opt", "built": True, "drafted": True, "generate": True, "tests": False, "values": 20, "todos": 1,
             "share": None, "why": "tests: test_opt.py::test_value_shapes"}]
    text = sweep.table(rows, 5, "now")
    back = sweep.read_table(text)
    assert back == sorted(rows, key=lambda r: r["type"])  # sorted by type, each row whole
    assert "| bamba | yes | no | — | — |  |  | 0% (bamba) | forward failed: a \\| b | 12-01 13:01 |" in text
    assert "rows swept from 12-01 13:00 to 12-01 13:01 UTC" in text
    assert "3 of 5 types swept; 3 build; 1 verified by load(draft=True)" in text and "2 have a hand-written spec" in text
    kept = {r["type"]: r for r in back}
    types = ["bamba", "gpt2", "llama", "mistral", "opt"]
    assert sweep.order(types, kept, [], None, {"opt", "llama"}) == ["gpt2", "mistral", "opt"]
    assert sweep.order(types, kept, ["llama"], None) == ["gpt2", "mistral", "llama"]
    assert sweep.order(types, kept, [], "failing") == ["gpt2", "mistral", "bamba", "opt"]
    assert sweep.order(types, kept, ["opt"], "failing") == ["gpt2", "mistral", "opt", "bamba"]


def test_the_sweep_kills_a_type_at_its_timeout() -> None:
    row = sweep.sweep_one("llama", timeout=0.5)
    assert row["why"] == "timed out after 0 s" and row["built"] is None and row["tests"] is None


def test_tiny_configs_keep_their_own_invariants() -> None:
    """Sizes shrunk without breaking what the config or the model requires of them."""
    assert tiny.plan("lfm2").config["block_auto_adjust_ff_dim"] is False  # the MLP width stays the drawn one
    assert tiny.plan("jamba").config["expert_layer_period"] == 1  # every block a mixture
    bamba = tiny.plan("bamba")  # a hybrid whose default stack is all Mamba: one attention block
    assert bamba.config["attn_layer_indices"] == [1]
    assert bamba.draw["mamba_d_head"] == "2 * hidden_size // 4"  # heads * head width == expand * hidden
    model = tiny.build(bamba)
    assert hasattr(model.model.layers[1], "self_attn") and not hasattr(model.model.layers[0], "self_attn")
    mla = tiny.plan("deepseek_v3")  # latent attention: keys and values per query head
    assert mla.draw["num_key_value_heads"] == "num_attention_heads"
    assert (mla.config["head_dim"], mla.config["qk_head_dim"]) == (4, 12)
    assert mla.first()["hidden_size"] == 2 * 16  # a head width unlike v_head_dim's 8
    granite = tiny.plan("granitemoehybrid")  # a hybrid whose default stack is all Mamba, by layer_types
    assert granite.config["layer_types"] == ["linear_attention", "full_attention", "linear_attention"]
    assert granite.draw["num_hidden_layers"] == [3]
    neo = tiny.plan("gpt_neo")  # [[kinds, repeats]] of the default's 24 blocks: each kind once
    assert neo.config["attention_types"] == [[["global", "local"], 1]] and neo.draw["num_hidden_layers"] == [2]
    mamba2 = tiny.plan("mamba2")  # its only heads are its mixer's: heads * head width == expand * hidden
    assert "heads" not in mamba2.names and mamba2.config["num_heads"] == 4
    assert mamba2.draw["head_dim"] == "2 * hidden_size // 4"
    assert "v_head_dim" not in tiny.plan("xlstm").config  # a property of the config class, derived
    assert tiny.plan("gemma3n_text").config["num_kv_shared_layers"] == 0  # (15 of 35 blocks share: none of 5 can)
    zamba2 = tiny.plan("zamba2")  # layer_types given at the default stack's length: one block per kind
    assert zamba2.config["layers_block_type"] == ["linear_attention", "hybrid"]
    assert zamba2.draw["num_hidden_layers"] == [2]


def test_tiny_layer_types_under_the_field_an_alias_names() -> None:
    """Zamba 2's layer_types is an alias (attribute_map) of layers_block_type, set after __post_init__ derived
    hybrid_layer_ids from the field's default (54 blocks): its shared blocks looked up block 1 in [6, 12, ...] and the
    tiny forward failed (KeyError: 1). The tiny config sets the field itself."""
    import transformers

    plan = tiny.plan("zamba2")
    assert "layer_types" not in plan.config
    assert getattr(transformers, plan.config_class)(**plan.first()).hybrid_layer_ids == [1]


def test_sizes_are_no_factors_to_perturb() -> None:
    """A width given as a fraction of another is a size, not a factor of the forward: drawn away from its default,
    DeepSeek-V4's partial_rotary_factor (1 on its tiny heads) gave a rotary wider than the heads, xLSTM's qk_dim_factor
    widths its layers and its cache round apart; both tiny forwards failed."""
    import transformers

    from nnatlas.testing.suite import config_factors

    assert "partial_rotary_factor" not in config_factors(transformers.DeepseekV4Config())
    xlstm = config_factors(transformers.xLSTMConfig())
    assert not {"qk_dim_factor", "v_dim_factor", "ffn_proj_factor"} & set(xlstm) and "gate_soft_cap" in xlstm


def test_a_stack_in_sections_and_blocks_that_run_in_a_loop() -> None:
    """Dory: n_input_layers + n_recurrent_layers + n_output_layers == num_hidden_layers (8 + 20 + 8); left at their
    defaults on a 4-block stack, the recurrent section was -12 blocks and the forward failed. Shrunk, it runs: its
    recurrent section twice (n_recurrent_loops), which no spec reads (one call per block), so no draft, saying why."""
    plan = tiny.plan("dory")
    sections = [plan.config[n] for n in ("n_input_layers", "n_recurrent_layers", "n_output_layers")]
    assert sections == [1, 2, 1] and sum(sections) == plan.first()["num_hidden_layers"]
    with pytest.raises(DraftError, match=r"blocks run in a loop \(model.layers.1 runs 2 times") as e:
        draft("dory")
    assert e.value.built


def test_a_stream_longer_than_the_input_is_not_drafted() -> None:
    """CPM-Ant prepends its prompt tokens to the stream (its hidden states drop them): no draft, saying why."""
    with pytest.raises(DraftError, match="prepended tokens: the blocks' stream has 39 positions for 7 input") as e:
        draft("cpmant")
    assert e.value.built


def test_other_tiny_sizes_when_the_first_fail_the_forward() -> None:
    """MiMo-V2-Flash doubles the key/value heads of its sliding blocks (with as many as the query heads, a head group
    is empty); xLSTM's cache rounds its widths up to a multiple of 64, its layers do not. Their tiny forwards failed
    at the first sizes; the drafter tries others, and the spec's tiny says which and why."""
    mimo = draft("mimo_v2_flash").proposal.tiny
    assert mimo.draw["_groups"] == [2] and any(n.startswith("_groups: [2]") and "size of tensor" in n for n in mimo.notes)
    xlstm = draft("xlstm").proposal.tiny
    assert xlstm.draw["_head_dim"] == [64] and any("matC_old has wrong shape" in n for n in xlstm.notes)


def test_a_final_norm_that_runs_before_the_blocks_too() -> None:
    """NanoChat calls its final norm on the embeddings too: norm.output reads that first call, which failed the
    oracle; final_norm_output is what the prediction head reads."""
    p = draft("nanochat").proposal
    assert p.hosts["model"].values["final_norm_output"].read == "lm_head.input"


def test_composite_parts_a_text_forward_does_not_run_are_shrunk() -> None:
    """GIT's (as Phi-4-multimodal's) causal-LM class builds its vision tower from the whole config: at its default
    size (Phi-4-multimodal's vision and audio: 870M parameters) the sweep ran out of time."""
    vision = tiny.plan("git").config["vision_config"]
    assert (vision["num_hidden_layers"], vision["hidden_size"], vision["intermediate_size"]) == (1, 32, 32)


def test_positions_per_sequence() -> None:
    """OPT counts each sequence's real tokens: its learned positions are one row per sequence."""
    p = draft("opt").proposal
    values = p.hosts["model"].values
    assert "token_position_embeddings" in values and "position_embeddings" not in values
    assert any(x.check == "token_embeddings + token_position_embeddings == layers[0].layer_input"
               for x in p.hosts["model"].identities)


def test_reads_of_modules_that_return_more_or_are_shared() -> None:
    """openai-gpt: the attention returns a list (its first element read), one activation module
    shared by every block (not read: it runs once per block); phimoe: a router that is a Linear
    returning (logits, weights, experts), routing in its own forward (its logits not editable there)."""
    gpt = draft("openai-gpt").proposal
    assert gpt.hosts["layers[i].self_attn"].values["attention_output"].read == "output[0]"
    assert "mlp_activation" not in gpt.hosts["layers[i].mlp"].values
    assert gpt.hosts["layers[i].mlp"].values["mlp_neurons"].read == "down_proj.input"
    router = draft("phimoe").proposal.hosts["layers[i].mlp"].values["router_logits"]
    assert (router.read, router.edit) == ("router.output[0]", "none")


def test_a_composite_config_drafts_its_text_model() -> None:
    """qwen3_5_moe's config holds a text and a vision config; its causal-LM class takes the text one:
    the draft is of that, loaded by both model types."""
    plan = tiny.plan("qwen3_5_moe")
    assert (plan.model_type, plan.config_class, plan.also) == ("qwen3_5_moe_text", "Qwen3_5MoeTextConfig", ["qwen3_5_moe"])
    text = writer.write(Proposal("qwen3_5_moe_text", plan.model_type, plan.model_class, "Qwen3.5 MoE", plan), "5.24.0")
    assert yaml.safe_load(text)["loads"]["model_types"] == ["qwen3_5_moe_text", "qwen3_5_moe"]


def test_multi_query_attention_has_one_key_head() -> None:
    """gpt_bigcode: the config says multi_query, not a key-head count; as the hand-written spec says (n_head is num_attention_heads)."""
    assert draft("gpt_bigcode").proposal.config["num_kv_heads"] == "1 if multi_query else num_attention_heads"


def test_a_state_space_stack() -> None:
    """mamba: no attention heads in the config (presets: [no_attention]); each block a norm and a
    mixer whose output is added to the stream, both checked on the tiny model."""
    d = draft("mamba")
    assert "heads" not in d.proposal.tiny.names and "num_heads" not in d.proposal.config
    assert yaml.safe_load(d.text)["presets"] == ["no_attention"]
    block = d.proposal.hosts["layers[i]"]
    assert block.values["mixer_norm_output"].read == "norm.output"
    assert [x.check for x in block.identities] == ["layer_input + mixer.mixer_output == layer_output",
                                                   "mixer_norm_output == mixer.input"]
    assert d.proposal.hosts["layers[i].mixer"].values["mixer_output"].read == "output"
    assert compile_draft(d.text, "mamba").family is not None


def test_a_per_layer_config() -> None:
    """gemma4_text: the full blocks' head width is a per-layer override (per_layer_config), which the config refuses
    to read globally (AmbiguousGlobalPerLayerAttributeError): the tiny config keeps the override, shrunk; the global
    sizes are read on block 0, and the full blocks, a kind of their own, size their hosts by their own entry."""
    from nnatlas.trace.expressions import cfg

    d = draft("gemma4_text")
    assert d.proposal.tiny.config["per_layer_config"] == {1: {"head_dim": 16}}  # 512 / 256 times the tiny 8
    config = d.proposal.config
    assert config["head_dim"].startswith("per_layer_config[0].head_dim")
    assert config["head_dim_attention"].startswith("per_layer_config['full_attention'].head_dim")
    kinds = d.proposal.hosts["layers[i].self_attn"].kinds
    assert kinds["attention"].dims == {"head_dim": "head_dim_attention", "qk_head_dim": "qk_head_dim_attention"}
    assert not kinds["sliding_attention"].dims
    # (a view is sized by the global entries: the head width is inferred, as the full blocks' differs)
    assert d.proposal.hosts["layers[i].self_attn"].values["attention_premix"].view == "unflatten(-1, [num_heads, -1])"
    assert compile_draft(d.text, d.proposal.family).family is not None
    import transformers

    built = transformers.Gemma4TextConfig(**d.proposal.tiny.first())
    # dots3_note_text: a kind's sizes shrink by one factor, so that their relations hold (the sliding blocks' head
    # width is their query's: qk_nope_head_dim + qk_rope_head_dim, 192 + 64 of 256)
    sliding = next(iter(tiny.plan("dots3_note_text").config["per_layer_config"].values()))
    assert (sliding["head_dim"], sliding["qk_nope_head_dim"]) == (16, 12)
    assert (cfg(built, "per_layer_config[0].head_dim"), cfg(built, "per_layer_config['full_attention'].head_dim")) == (8, 16)


def test_every_hand_written_family_is_scored() -> None:
    """A hand-written family none of whose model types is a causal-LM one (LLaVA, a multimodal wrapper with no
    causal-LM class) is swept for its hand score: drafted through its text model's causal-LM class; its row is
    listed apart and left out of the swept types' counts."""
    extra = sweep.scored_only(["llama", "qwen2"], ATLAS.families)  # (the families that load neither)
    assert {"llava", "qwen2_vl", "gpt2"} <= set(extra) and not {"llama", "qwen2"} & set(extra)
    plan = tiny.plan("llava")
    assert (plan.model_type, plan.model_class, plan.also) == ("llama", "LlamaForCausalLM", ["llava"])
    rows: list[dict[str, Any]] = [
        {"type": "llama", "built": True, "drafted": True, "generate": True, "tests": True, "values": 25, "todos": 0,
         "share": 1.0, "hand": "llama", "why": ""},
        {"type": "llava", "built": True, "drafted": True, "generate": True, "tests": None, "values": 25, "todos": 0,
         "share": 0.5, "hand": "llava", "why": "scored only"}]
    text = sweep.table(rows, 1, "now", {"llava"})
    assert "1 of 1 types swept; 1 build; 1 verified" in text and "2 have a hand-written spec: their drafts find 75%" in text
    assert text.index("| llama |") < text.index("multimodal wrappers") < text.index("| llava |")
    assert sweep.read_table(text) == rows


def test_module_names_are_matched_without_the_models_own() -> None:
    """granitemoehybrid: the 'Moe' of the model's name made its Mamba layer (GraniteMoeHybridMambaLayer) the blocks'
    MLP on the Mamba blocks, unlike the mixture of experts on the others (load(draft=True) refused the class)."""
    mlp = draft("granitemoehybrid").proposal.hosts["layers[i].mlp"]
    assert mlp.cls == "GraniteMoeHybridMoE" and not mlp.kind and all(k.cls is None for k in mlp.kinds.values())


def test_items_of_a_module_list_in_a_block() -> None:
    """longcat_flash: each block holds its attentions and norms in ModuleLists (self_attn.0, input_layernorm.0); a read
    point names a module by one word, so each item mapped is renamed to one (the draft did not compile)."""
    d = draft("longcat_flash")
    assert d.proposal.rename["layers[i].input_layernorm_0"] == "input_layernorm.0"
    assert d.proposal.hosts["layers[i]"].values["attention_norm_output"].read == "input_layernorm_0.output"
    assert compile_draft(d.text, d.proposal.family).family is not None


def test_hidden_states_after_each_block_are_known() -> None:
    """RWKV appends the stream to output_hidden_states after each block, as the Mamba models do (its embeddings are
    not in it): the oracle compares block i's output with hidden_states[i] there (rwkv's draft failed the oracle)."""
    from nnatlas.testing.suite import HIDDEN_STATES_AFTER_BLOCKS

    model = tiny.build(tiny.plan("rwkv"))
    seen: list[torch.Tensor] = []
    model.rwkv.blocks[0].register_forward_hook(lambda m, a, out: seen.append(out[0]))
    with torch.no_grad():
        hs = model(torch.tensor([[5, 6, 7]]), output_hidden_states=True).hidden_states
    assert len(hs) == len(model.rwkv.blocks) + 1 and torch.equal(hs[0], seen[0])
    assert type(model).__name__ in HIDDEN_STATES_AFTER_BLOCKS


def test_the_final_norm_before_a_prediction_head() -> None:
    """modernbert-decoder: the output embeddings read a prediction head (dense, activation, its own norm); the final
    norm is the model's, which that head reads (the draft took the head's norm, and failed the oracle's hidden_states)."""
    p = draft("modernbert-decoder").proposal
    assert (p.rename["norm"], p.rename["lm_head"]) == ("model.final_norm", "decoder")
    assert any("lm_head (ModernBertDecoderPredictionHead)" in t for t in p.todos)


def test_a_count_smaller_than_the_tiny_one_is_kept() -> None:
    """zaya routes each token to one expert (its config refuses num_experts_per_tok=2, the tiny value): the tiny
    config keeps the class's 1 (shrink's rule, as the twins': a count in AT_MOST is kept when smaller), which the
    draft's mixture sizes top_k by."""
    d = draft("zaya")
    assert d.proposal.tiny.config["num_experts_per_tok"] == 1
    assert d.proposal.config["top_k"] == "num_experts_per_tok"


@pytest.mark.parametrize(("model_type", "key", "value"), [
    ("dots1", "n_shared_experts", 1),  # every block a mixture, its expert counts None by default
    ("qwen4_exp_text", "indexer_budget", 8),  # the token indexer on every attention block, its sizes None
    ("lfm2_moe", "layer_types", ["conv", "full_attention"]),  # layer_types None, not derived
    ("cohere_compass_text", "rope_parameters", {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    ("zamba", "num_hidden_layers", 8),  # one hybrid block ties its shared block's weights to nothing
])
def test_what_the_config_class_leaves_unset_is_set(model_type: str, key: str, value: object) -> None:
    """The tiny models of config classes whose defaults leave unset what their model needs (a checkpoint's config
    sets it) build: the tiny config sets it, and says so in a note."""
    plan = tiny.plan(model_type)
    assert plan.first()[key] == value
    assert any(key in note for note in plan.notes)
    tiny.build(plan)


def test_a_config_with_sub_configs_of_its_own() -> None:
    """DBRX: its attention and mixture sizes sit in attn_config and ffn_config (shrunk there); __post_init__ copies
    d_model into ffn_config before an alias (hidden_size) given as a keyword is set (the sizes are drawn by their
    fields); its attention reads attn_config.rope_theta, which the class no longer declares, and clamps by clip_qkv
    unguarded (None by default): both set."""
    plan = tiny.plan("dbrx")
    params = plan.first()
    assert (plan.names["hidden"], params["ffn_config"]["ffn_hidden_size"]) == ("d_model", 24)
    assert params["attn_config"]["rope_theta"] == 10000.0 and params["attn_config"]["clip_qkv"] == 0.5
    model = tiny.build(plan)
    assert model.transformer.blocks[0].ffn.router.layer.in_features == params["d_model"]
    model(input_ids=torch.tensor([[4, 5, 6]]))


def test_a_mixture_sized_in_a_sub_config() -> None:
    """DBRX's expert count and top-k are ffn_config's entries (its spec's config names them by their path), and its
    experts loop over the experts in their own forward, not behind transformers' experts interface: the draft lists
    no experts implementation but eager (its generated tests failed at batched_mm and grouped_mm)."""
    p = draft("dbrx").proposal
    assert (p.config["num_experts"], p.config["top_k"]) == ("ffn_config.moe_num_experts", "ffn_config.moe_top_k")
    assert p.experts == []
    assert draft("qwen3_moe").proposal.experts == ["eager", "batched_mm", "grouped_mm"]


def test_types_the_drafter_cannot_shrink_say_why() -> None:
    with pytest.raises(DraftError, match=r"Gemma4AssistantConfig\(\) fails its own validation: .*"
                                         "hidden_size_per_layer_input must be 0"):
        tiny.plan("gemma4_assistant")  # its default text config is gemma4_text's, which its validator refuses
    with pytest.raises(DraftError, match=r"several stacks, one per sub-config \(patcher_config, encoder_config, "
                                         r"decoder_config, global_config\)"):
        tiny.plan("blt")


def test_the_oracle_where_the_last_hidden_state_is_the_last_blocks() -> None:
    """Gemma 3n carries the stream as four copies, merged after the blocks, then normed: transformers' last hidden
    state is the last block's output (four copies), not the final norm's. The oracle compares it with the last
    block's output, and final_norm_output with what the prediction head reads (it asserted the shapes equal)."""
    import contextlib
    from types import SimpleNamespace

    from nnatlas.testing.suite import _oracle_hidden_states

    native = tiny.build(tiny.plan("gemma3n_text"))
    inputs = {"input_ids": torch.tensor([[5, 6, 7, 8]])}
    heads: list[torch.Tensor] = []
    hook = native.lm_head.register_forward_pre_hook(lambda m, args: heads.append(args[0]))
    with torch.no_grad():
        hs = native(**inputs, output_hidden_states=True).hidden_states
    hook.remove()
    n = len(hs) - 1
    assert hs[n].shape[0] == 4 and hs[n].shape[1:] == heads[0].shape  # (the four copies)

    def served(final: torch.Tensor) -> Any:
        value = SimpleNamespace(name="final_norm_output", read=SimpleNamespace(kind="module"), needs=None)
        return SimpleNamespace(
            num_layers=n, _family=SimpleNamespace(hosts=[SimpleNamespace(values=[value])]),
            layers=[SimpleNamespace(layer_input=SimpleNamespace(save=lambda t=hs[i]: t),
                                    layer_output=SimpleNamespace(save=lambda t=hs[i + 1]: t)) for i in range(n)],
            final_norm_output=SimpleNamespace(save=lambda: final), trace=lambda *a, **k: contextlib.nullcontext())

    with torch.no_grad():
        _oracle_hidden_states(served(heads[0]), native, inputs, "gemma3n_text", False)
        with pytest.raises(AssertionError, match="final_norm_output vs what the prediction head reads"):
            _oracle_hidden_states(served(heads[0] + 1), native, inputs, "gemma3n_text", False)


def test_a_forward_that_takes_no_attention_mask() -> None:
    """xLSTM's forward takes no attention_mask (nnatlas refuses it as an input): the draft proposes none and reads the
    next token's probabilities at the last position; the checks' inputs leave the mask out, and the padding (without a
    mask its ids are tokens, which nnatlas warns of)."""
    from types import SimpleNamespace

    from nnatlas.testing.suite import Case, _fixed_inputs

    values = draft("xlstm").proposal.hosts["model"].values
    assert "attention_mask" not in values and values["next_token_probs"].derived == "softmax(logits[:, -1], -1)"
    model = SimpleNamespace(processor=None, normalized_config={"vocab_size": 96},
                            native=tiny.build(tiny.plan("xlstm")))
    inputs = _fixed_inputs(model)  # type: ignore[arg-type]
    assert set(inputs) == {"input_ids"} and inputs["input_ids"].shape == (3, 6) and bool((inputs["input_ids"] > 0).all())
    assert "inputs (3, 6), left padding [0, 0, 0]" in repr(Case("xlstm", {}, inputs, 0))


def test_a_type_drafted_through_its_text_model_is_a_multimodal_wrapper_of_it() -> None:
    """Gemma 4 Unified Assistant's config holds a text config, and its causal-LM class runs on a target model's
    states (shared_kv_states): it is no multimodal wrapper, and a draft of its text model (which its sweep row once
    verified in its place) would not fit it. Gemma 3's wrapper takes images only beside its text model's inputs."""
    with pytest.raises(DraftError, match=r"Gemma4UnifiedAssistantForCausalLM is no multimodal wrapper of "
                                         r"Gemma4UnifiedForCausalLM: its forward also takes shared_kv_states"):
        tiny.plan("gemma4_unified_assistant")
    assert tiny.plan("gemma3").model_class == "Gemma3ForCausalLM"


def test_a_stack_whose_blocks_loop_keeps_the_looped_blocks() -> None:
    """Inkling 2 Loop runs blocks 6 to 17 three times: a tiny stack cut to fewer blocks never looped, and its draft
    verified a model no checkpoint is. The tiny stack now holds the loop, and the drafter says it cannot draft it."""
    plan = tiny.plan("inkling2_loop_text")
    assert plan.draw["num_hidden_layers"] == [18] and any("loop_layer_index_end" in n for n in plan.notes)
    with pytest.raises(DraftError, match=r"its blocks run in a loop \(model\.layers\.6 runs 3 times per forward\)"):
        draft("inkling2_loop_text")


def test_a_checkpoints_own_sub_configs_are_no_other_parts(tmp_path: Path) -> None:
    """From a checkpoint (load(draft=True)), DBRX's ffn_config and attn_config are parts its text forward runs (no
    model type of their own), not other parts to shrink to 32 wide: its expert count and top-k stay (they were
    dropped, and the draft's expert_indices named a top_k no config entry gave)."""
    tiny.build(tiny.plan("dbrx")).config.save_pretrained(tmp_path)
    ffn = tiny.plan("dbrx", str(tmp_path)).config["ffn_config"]
    assert (ffn["ffn_hidden_size"], ffn["moe_num_experts"], ffn["moe_top_k"]) == (24, 4, 2)


def test_a_draft_pins_the_layout_options_it_has_no_kinds_along(drafts: dict[str, object]) -> None:
    """qwen3_next drafted on its uniform tiny stack (every block a mixture): no MLP kinds, so its perturbed tests
    must not draw mlp_only_layers [0] or decoder_sparse_step 2 (a dense block the draft does not describe: its tests
    failed so, e.g. `nnatlas draft glm4_moe` on a drawn first_k_dense_replace of 2); the block kinds it has
    (layer_types) are drawn as any layout is."""
    d = _draft(drafts, "qwen3_next")
    layouts = yaml.safe_load(d.text)["tiny"]["layouts"]  # type: ignore[attr-defined]
    assert layouts["decoder_sparse_step"]["pin"] == 1 and layouts["mlp_only_layers"]["pin"] == []
    assert "drafted again on its layout" in layouts["mlp_only_layers"]["reason"]
    assert "layer_types" not in layouts
