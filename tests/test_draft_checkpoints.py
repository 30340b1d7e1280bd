"""The drafter on models laid out as released checkpoints are (issue 37): its tiny sizes are the checkpoint twins'
(one table, nnatlas.testing.shrink), ``nnatlas draft TYPE --config PATH`` drafts the given layout, and a draft
that cannot serve says what it could not place, where the draft is, and the one next step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from nnatlas.testing.shrink import AT_MOST, GROUPS, SIZES, WINDOWS, shrink

DENSE_FIRST_TYPE = "glm_moe_dsa"  # no shipped family: draft=True drafts it (first_k_dense_replace on its checkpoints)


@pytest.fixture(autouse=True)
def _no_drafts_left() -> Any:
    """No drafted family in the lookup before or after a test (a draft one test added would serve the next)."""
    from nnatlas import registry

    registry.remove_user(DENSE_FIRST_TYPE)
    yield
    registry.remove_user(DENSE_FIRST_TYPE)


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe", "gemma2", "jamba", "glm4_moe"])
def test_the_drafter_takes_the_twins_tiny_sizes(family: str, tmp_path: Path) -> None:
    """For a recorded checkpoint's config, every size the drafter does not draw is the twin's: one shrink rule."""
    from nnatlas.compiler.draft import tiny
    from nnatlas.testing.twins import recorded, twin_params

    _, config = recorded(family)
    config_class = getattr(transformers, tiny_class(family))
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": config_class.model_type}))
    plan = tiny.plan(config_class.model_type, str(tmp_path))
    twin = twin_params(family)
    names = (set(SIZES) | set(WINDOWS) | set(GROUPS) | set(AT_MOST)) - tiny.DRAWN
    compared = {k for k in names if k in plan.config and k in twin}
    assert compared, "no size to compare"
    assert {k: plan.config[k] for k in compared} == {k: twin[k] for k in compared}


def tiny_class(family: str) -> str:
    from nnatlas.testing.suite import tiny_of

    return str(tiny_of(family)["config_class"])


def _dense_first(model_type: str = DENSE_FIRST_TYPE, **layout: Any) -> Any:
    """A tiny random model of ``model_type`` laid out dense-first (``layout``), its sizes shrunk by the twins' rule."""
    config_class = transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]
    recorded = {k: v for k, v in config_class().to_dict().items() if k not in ("mlp_layer_types", "layer_types",
                                                                             "indexer_types", "transformers_version")}
    config = config_class(**shrink(config_class, {**recorded, **(layout or {"first_k_dense_replace": 1,
                                                                            "num_hidden_layers": 3})}))
    torch.manual_seed(0)
    cls = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    return getattr(transformers, cls)(config).eval()


@pytest.mark.parametrize("given", ["config.json", "checkpoint folder"])
def test_draft_config_drafts_the_given_dense_first_layout(given: str, tmp_path: Path) -> None:
    """``nnatlas draft TYPE --config PATH`` (the CLI's entry point) on a config.json and on a checkpoint folder
    (save_pretrained) of a model whose first block is dense: the written draft maps both kinds of MLP."""
    from nnatlas.compiler.cli import main

    hf = _dense_first()
    dense, sparse = type(hf.model.layers[0].mlp).__name__, type(hf.model.layers[1].mlp).__name__
    assert dense != sparse
    folder = tmp_path / "checkpoint"
    if given == "config.json":
        hf.config.save_pretrained(folder)
        path = folder / "config.json"
    else:
        hf.save_pretrained(folder)
        assert any(folder.glob("*.safetensors"))
        path = folder
    out = tmp_path / "draft.yaml"
    assert main(["draft", DENSE_FIRST_TYPE, "--config", str(path), "--out", str(out), "--no-test"]) == 0
    text = out.read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  layers[i].mlp:"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))
    mlp = "\n".join(lines[start:end])  # the host's entry: one class per kind of block
    assert "    kinds:" in mlp and f"class: {dense}" in mlp and f"class: {sparse}" in mlp, mlp
    assert "when: \"mlp_layer_types[i] == 'dense'\"" in mlp, mlp
    assert "first_k_dense_replace: 1" in text and "mlp_layer_types: [\"dense\", \"sparse\", \"sparse\"]" in text


def test_a_draft_that_cannot_place_a_module_says_which_where_the_draft_is_and_spec_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wrap(model, draft=True) on a model one of whose blocks holds a module of a class the drafter never saw (its
    tiny model, built from the config, has the class transformers builds): the draft verifies on its twin, does not
    fit the model, and the one error names the module and its block, the file the draft is written to and
    ``spec=FILE``; never the command that just ran."""
    import nnatlas
    from nnatlas.errors import NnatlasError

    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path))
    hf = _dense_first()
    mlp = hf.model.layers[1].mlp
    own: dict[str, Any] = {}  # (the same methods, on a class no spec names and that is no subclass of the one built)
    for cls in reversed(type(mlp).__mro__[:type(mlp).__mro__.index(torch.nn.Module)]):
        own.update({k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")})
    mlp.__class__ = type("PatchedSparseBlock", (torch.nn.Module,), own)
    with pytest.raises(NnatlasError) as e:
        nnatlas.wrap(hf, draft=True)
    message = str(e.value)
    file = tmp_path / "drafts" / f"{DENSE_FIRST_TYPE}.draft.yaml"
    assert file.is_file() and "family:" in file.read_text()
    assert "PatchedSparseBlock" in message and "layers[1].mlp" in message, message
    assert f"spec={file}" in message and f"The draft is in {file}" in message, message
    assert "nnatlas draft" not in message and "--out" not in message, message
    assert message.count("spec=") == 1, message



def test_token_id_lists_are_no_per_block_list() -> None:
    """GLM's three eos ids on a three-block stack: the layout rule does not cut them as each block's kind."""
    from nnatlas.testing.shrink import layout

    given = {"num_hidden_layers": 3, "eos_token_id": [151329, 151336, 151338],
             "layer_types": ["full_attention", "sliding_attention", "full_attention"]}
    laid, _ = layout(given, given, "num_hidden_layers")
    assert "eos_token_id" not in laid and laid["layer_types"] == ["full_attention", "sliding_attention"]


def test_blocks_two_lists_tell_apart_are_kinds_of_both(tmp_path: Path) -> None:
    """Bailing-Hybrid laid out dense-first beside its linear and full attention blocks: no one list tells its three
    kinds of block apart (block 0 linear and dense, 1 full and a mixture, 2 linear and a mixture); the draft gives
    each list's host its own kinds: layers[i] the mixers' by layer_types, layers[i].mlp the MLPs' by mlp_layer_types
    (each block's MLP class the one its kind says)."""
    from nnatlas.compiler.draft import draft, tiny

    base = transformers.BailingHybridConfig()
    recorded = {k: v for k, v in base.to_dict().items() if k not in ("layer_types", "mlp_layer_types",
                                                                     "transformers_version")}
    types = ["linear_attention", "full_attention", "linear_attention"]
    config = transformers.BailingHybridConfig(**shrink(transformers.BailingHybridConfig, {
        **recorded, "num_hidden_layers": 3, "layer_types": types, "first_k_dense_replace": 1}))
    assert config.mlp_layer_types == ["dense", "sparse", "sparse"]
    config.save_pretrained(tmp_path)
    text = draft("bailing_hybrid", str(tmp_path)).text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  layers[i].mlp:"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))
    mlp, rest = "\n".join(lines[start:end]), "\n".join(lines[:start] + lines[end:])
    for x, y in zip(types, config.mlp_layer_types):
        assert f"when: \"layer_types[i] == '{x}'\"" in rest and f"when: \"mlp_layer_types[i] == '{y}'\"" in mlp
    assert "layer_types[i] ==" not in mlp.replace("mlp_layer_types", ""), mlp
    assert tiny.plan("bailing_hybrid", str(tmp_path)).config["layer_types"] == types


@pytest.mark.parametrize("model_type", ["zamba", "zamba2", "nemotron_h"])
def test_a_given_hybrid_layout_is_drafted_as_given(model_type: str, tmp_path: Path) -> None:
    """A hybrid stack given laid out off its class's defaults (its kinds' list rotated, as the sweep does): the
    drafter's tiny stack keeps the given kinds in order and runs, where a cut of it would not build (Zamba: one hybrid
    block ties its shared block to nothing), the list is under its alias (Zamba 2's layers_block_type) or the block
    count is derived from it (NemotronH)."""
    from nnatlas.compiler.draft import tiny
    from nnatlas.compiler.draft_sweep import checkpoint_like

    plan = tiny.plan(model_type)
    model = tiny.build(plan, checkpoint_like(plan))
    given = list(model.config.layers_block_type)
    assert given != list(tiny.build(plan).config.layers_block_type)  # (off the tiny config's own layout)
    model.config.save_pretrained(tmp_path)
    built = tiny.build(tiny.plan(model_type, str(tmp_path)))
    kinds = list(built.config.layers_block_type)
    assert set(kinds) == set(given) and kinds[0] == given[0], (kinds, given)
    with torch.no_grad():
        built(input_ids=torch.randint(4, 90, (1, 5)))

def _released(family: str, **layout: Any) -> Any:
    """A tiny random model of ``family``'s first recorded checkpoint, laid out as it is (``layout``: options changed
    as another released checkpoint has them), its sizes shrunk by the twins' rule."""
    from nnatlas.testing.twins import recorded

    _, config = recorded(family)
    config_class = transformers.models.auto.configuration_auto.CONFIG_MAPPING[config["model_type"]]
    config = config_class(**shrink(config_class, {**config, **layout}))
    torch.manual_seed(0)
    cls = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]
    return getattr(transformers, cls)(config).eval()


def _served_by_its_draft(hf: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``load(folder, draft=True)`` as for a type no shipped family loads (the shipped one is left out of the lookup):
    the drafter drafts it from the checkpoint's config; each block's output and the logits exactly transformers'."""
    import nnatlas
    from nnatlas import registry

    monkeypatch.setenv("NNATLAS_CACHE", str(folder.parent / "cache"))
    real = registry.find
    monkeypatch.setattr(registry, "find", lambda m: None if m.config.model_type == hf.config.model_type else real(m))
    hf.save_pretrained(folder)
    model = nnatlas.load(str(folder), draft=True)
    name = model.family if isinstance(model.family, str) else model.family.name
    try:
        assert name.startswith("draft_"), name
        ids = torch.randint(3, hf.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
        outs: dict[int, torch.Tensor] = {}
        hooks = [block.register_forward_hook(lambda m, a, out, i=i: outs.__setitem__(
            i, (out[0] if isinstance(out, tuple) else out).detach().clone()))
            for i, block in enumerate(hf.model.layers)]
        with torch.no_grad():
            logits = hf(ids).logits
        for h in hooks:
            h.remove()
        n = len(hf.model.layers)
        with model.trace(ids):
            blocks = [model.layers[i].layer_output.save() for i in range(n)]
            got = model.logits.save()
        for i in range(n):
            assert torch.equal(blocks[i], outs[i]), i
        assert torch.equal(got, logits)
    finally:
        registry.remove_user(name)
    return model


def test_jamba_laid_out_as_released_serves_its_draft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Jamba-v0.1's layout (attention every 8th block at offset 4, a mixture every other block at offset 1: the
    blocks differ along two options at once): the draft gives layers[i] its mixer kinds by the block-type list and
    layers[i].mlp its own kinds by the expert period, and serves the model exactly."""
    from nnatlas.compiler.draft import draft

    hf = _released("jamba")
    assert (hf.config.attn_layer_period, hf.config.attn_layer_offset) == (8, 4)
    assert (hf.config.expert_layer_period, hf.config.expert_layer_offset) == (2, 1)
    mlps = {type(layer.feed_forward).__name__ for layer in hf.model.layers}
    mixers = {type(layer).__name__ for layer in hf.model.layers}
    assert len(mlps) == len(mixers) == 2
    _served_by_its_draft(hf, tmp_path / "checkpoint", monkeypatch)
    text = draft("jamba", str(tmp_path / "checkpoint")).text
    assert "when: \"i % expert_layer_period == expert_layer_offset\"" in text, text
    assert "when: \"i % expert_layer_period != expert_layer_offset\"" in text, text
    lines = text.splitlines()
    start = lines.index("  layers[i].mlp:  # one class per kind of block: each kind says its own")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))
    assert "expert_layer_period" in "\n".join(lines[start:end]) and "layer_types" not in "\n".join(lines[start:end])


@pytest.mark.parametrize(("family", "layout", "when"), [
    ("qwen2_moe", {"decoder_sparse_step": 2}, "(i + 1) % decoder_sparse_step == 0"),
    ("llama4_text", {"interleave_moe_layer_step": 2}, "count(moe_layers, i) > 0"),
])
def test_a_mixture_every_other_block_serves_its_draft(family: str, layout: dict[str, Any], when: str,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixture every other block (Qwen2-MoE's decoder_sparse_step, Llama 4 Maverick's interleave_moe_layer_step):
    the draft's kinds are the blocks' dense and mixture MLPs, told apart by the period (or the block indices the
    config derives from it), and it serves the model exactly."""
    from nnatlas.compiler.draft import draft

    hf = _released(family, **layout)
    mlp = "feed_forward" if family == "llama4_text" else "mlp"
    assert len({type(getattr(layer, mlp)).__name__ for layer in hf.model.layers}) == 2
    _served_by_its_draft(hf, tmp_path / "checkpoint", monkeypatch)
    assert f"when: \"{when}\"" in draft(family, str(tmp_path / "checkpoint")).text


def test_the_sweep_lays_periods_out_as_released() -> None:
    """``checkpoint_like`` sets a period of the stack that is 1 to 2, its offset under it (Jamba's expert period,
    Qwen2-MoE's sparse step, Llama 4's interleave step, none of them in the drafter's tiny config at 2), and the
    table's header says so."""
    from nnatlas.compiler.draft import tiny
    from nnatlas.compiler.draft_sweep import checkpoint_like, moved, table

    for model_type, entry in (("jamba", "expert_layer_period"), ("qwen2_moe", "decoder_sparse_step"),
                              ("llama4_text", "interleave_moe_layer_step")):
        plan = tiny.plan(model_type)
        params = checkpoint_like(plan)
        assert params[entry] == 2 and f"{entry}=2" in moved(plan.first(), params), (model_type, params)
        config = getattr(transformers, plan.config_class)(**params)
        assert all(getattr(config, k) < 2 for k in params if k.endswith("_offset")), params
    assert "each period of the stack at 1 set to 2" in table([], 0, "now")
    plan = tiny.plan("dots3_note")  # (its class refuses the rotated layer_types: its own layout, periods or not)
    assert checkpoint_like(plan) == plan.first()
