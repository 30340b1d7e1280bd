"""Checkpoint twins (nnatlas.testing.twin) and the one shrink rule they share with the drafter
(nnatlas.testing.shrink): layouts kept, sizes shrunk, a twin that cannot be built names the option, a twin
catches a spec the default tiny model does not, and draw=True serves dense-first models exactly."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from nnatlas.testing import suite as T
from nnatlas.testing import twins
from nnatlas.testing.identities import identities_checked
from nnatlas.testing.shrink import ShrinkError, cut, shrink


def test_cut_keeps_every_kind_in_order() -> None:
    assert cut(["s", "s", "s", "f"] * 6) == ["s", "s", "s", "f"]  # a period, whole
    # runs in order, each at most two blocks (the first at most the cut dense-first count)
    assert cut(["dense"] * 3 + ["sparse"] * 40, first=2) == ["dense", "dense", "sparse", "sparse"]
    assert cut(["dense"] * 3 + ["sparse"] * 40, first=1) == ["dense", "sparse", "sparse"]
    assert cut(["a", "b", "b", "b", "c", "a"]) == ["a", "b", "b", "c"]  # every kind seen: stop


def test_shrink_keeps_the_layout_and_shrinks_the_sizes() -> None:
    recorded = dict(twins.recorded("deepseek_v3")[1])
    params = shrink(transformers.DeepseekV3Config, recorded)
    assert params["first_k_dense_replace"] == 2  # 3 on the checkpoint: kept up to two, mixtures after it
    assert params["num_hidden_layers"] >= 3
    assert params["hidden_size"] == 64 and params["vocab_size"] == 96
    assert params["num_key_value_heads"] == params["num_attention_heads"]  # 128 of 128: the grouping kept
    assert params["rope_parameters"]["rope_type"] == "yarn" and params["tie_word_embeddings"] is False
    assert params["routed_scaling_factor"] == 2.5 and params["n_group"] == 1


def test_the_twin_is_laid_out_as_the_checkpoint() -> None:
    model = T.twin("deepseek_v3")
    classes = [type(layer.mlp).__name__ for layer in model.native.model.layers]
    assert classes[:2] == ["DeepseekV3MLP"] * 2 and set(classes[2:]) == {"DeepseekV3MoE"}
    assert model.native.config.num_key_value_heads == model.native.config.num_attention_heads


def test_a_twin_that_cannot_be_built_names_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    name, recorded = twins.recorded("llama")
    bad = [[k, v] for k, v in recorded.items()] + [["hidden_act", "no_such_activation"]]
    monkeypatch.setattr(T.adapter_module("llama"), "CHECKPOINTS", {"x/bad": bad})
    with pytest.raises(ShrinkError, match=r"llama: the twin of x/bad cannot be built: LlamaForCausalLM does not "
                                          r"build .*\(option hidden_act='no_such_activation'\)"):
        T.twin_params("llama", "x/bad")
    with pytest.raises(ValueError, match="no recorded checkpoint 'nope'"):
        T.twin_params("llama", "nope")


def test_gemma4_kv_shared_blocks_keep_one_shared_block() -> None:
    params = T.twin_params("gemma4_text", "google/gemma-4-E2B")  # 20 of 35 blocks reuse keys and values
    assert params["num_kv_shared_layers"] == 1
    kinds = params["layer_types"][:-1]
    assert set(kinds) == set(params["layer_types"])  # every kind produced before the shared block


def _one_mlp_class(family: str) -> Any:
    """``family``'s adapter as a spec that names one MLP class for every block would compile (the mixture's: the
    dense kind dropped, the mixture kind on every block), whose tiny stack has no dense block. Built from the
    adapter, not compiled: the compiler's own tree check, on the checkpoint's meta model, refuses such a spec."""
    import dataclasses
    import types

    shipped = T.adapter_module(family)
    hosts = [dataclasses.replace(h, when=None, when_text=None, kind=None) if h.path.startswith("layers[i].mlp")
             and h.cls.endswith("MoE") else h for h in shipped.FAMILY.hosts
             if not (h.path == "layers[i].mlp" and not h.cls.endswith("MoE"))]
    module = types.ModuleType(f"nnatlas.families.one_mlp_{family}")
    module.__dict__.update({k: v for k, v in vars(shipped).items() if not k.startswith("__")})
    module.FAMILY = dataclasses.replace(shipped.FAMILY, name=f"one_mlp_{family}", hosts=tuple(hosts))
    draw = tuple((n, (0,), c) if n == "first_k_dense_replace" else (n, o, c) for n, o, c in shipped.TINY["draw"])
    module.TINY = {**shipped.TINY, "draw": draw}
    return module


def test_a_twin_catches_one_mlp_class_for_every_block() -> None:
    """The mutation check: a spec naming the mixture's class on every block passes the default tiny model (all
    blocks mixtures) and fails the twin of GLM-4.5-Air (its first block dense)."""
    from nnatlas import registry

    module = _one_mlp_class("glm4_moe")
    name = module.FAMILY.name
    registry.add_user(module)
    try:
        T.check_native_class(name, "layers[i].mlp")  # the default tiny model misses it
        with pytest.raises(AssertionError, match=r"layers\[0\]\.mlp: native class Glm4MoeMLP"):
            T.check_twin_builds(name, "zai-org/GLM-4.5-Air")
    finally:
        registry.remove_user(name)
    T.check_twin_builds("glm4_moe", "zai-org/GLM-4.5-Air")  # the family's own spec holds on it


@pytest.fixture(autouse=True)
def _no_drafts_left() -> Any:
    """Each test starts and ends with no drafted family in the lookup (a draft one test added would serve the next)."""
    from nnatlas import registry

    for name in ("draft_exaone_moe", "glm_moe_dsa", "hy_v3"):
        registry.remove_user(name)
    yield
    for name in ("draft_exaone_moe", "glm_moe_dsa", "hy_v3"):
        registry.remove_user(name)


def _dense_first_folder(model_type: str, **layout: Any) -> tuple[str, Any]:
    """A tiny random checkpoint of ``model_type`` laid out as released (``layout``), saved to a folder."""
    config_class = transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]
    recorded = {k: v for k, v in config_class().to_dict().items() if k not in ("mlp_layer_types", "layer_types",
                                                                             "indexer_types", "transformers_version")}
    config = config_class(**shrink(config_class, {**recorded, **layout}))
    torch.manual_seed(0)
    cls = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    hf = getattr(transformers, cls)(config).eval()
    folder = tempfile.mkdtemp(prefix=f"nnatlas-{model_type}-")
    hf.save_pretrained(folder)
    return folder, hf


@pytest.mark.parametrize("model_type,layout", [
    ("exaone_moe", {"mlp_layer_types": ["dense", "sparse", "sparse"], "num_hidden_layers": 3}),
    ("hy_v3", {"mlp_layer_types": ["dense", "sparse", "sparse"], "num_hidden_layers": 3}),
    ("glm_moe_dsa", {"first_k_dense_replace": 1, "num_hidden_layers": 3}),
])
def test_draft_serves_a_dense_first_model_exactly(model_type: str, layout: dict[str, Any], tmp_path: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """draft=True on a model whose first block is dense: load(path, draft=True) for a type no shipped family covers;
    exaone_moe, which has a hand-written spec now, through the drafter itself (what draft=True runs), then wrapped
    as the draft with its tree checked."""
    import nnatlas
    from nnatlas.loading import user_specs

    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path))
    folder, hf = _dense_first_folder(model_type, **layout)
    assert type(hf.model.layers[0].mlp) is not type(hf.model.layers[1].mlp)  # dense first, a mixture after
    if nnatlas.registry.find(hf) is None:
        model = nnatlas.load(folder, draft=True)
    else:
        model = nnatlas.wrap(hf, family=user_specs.drafted(hf), check=True)
    assert "drafted" in nnatlas.registry.origin(model._family)
    ids = torch.randint(4, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.native(input_ids=ids, output_hidden_states=True)
    outs, mlp = [], []
    with model.trace(ids):
        for i in range(hf.config.num_hidden_layers):  # (in the forward's order)
            mlp.append(model.layers[i].mlp.mlp_output.save())
            outs.append(model.layers[i].layer_output.save())
        logits = model.logits.save()
    assert torch.equal(logits, ref.logits)
    for i in range(hf.config.num_hidden_layers - 1):
        assert torch.equal(outs[i], ref.hidden_states[i + 1]), i
    assert all(m.shape == outs[0].shape for m in mlp)


def test_a_layout_the_first_draft_did_not_see_is_drafted_again(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft made on an all-mixture hy_v3, then a dense-first one of the same type: drafted again on its
    layout and served, not refused as a mismatch."""
    import nnatlas

    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path))
    sparse, _ = _dense_first_folder("hy_v3", mlp_layer_types=["sparse"] * 2, num_hidden_layers=2)
    first = nnatlas.load(sparse, draft=True)
    dense, hf = _dense_first_folder("hy_v3", mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3)
    model = nnatlas.load(dense, draft=True)
    assert first._family is not model._family
    ids = torch.randint(4, 90, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), model.trace(ids):
        logits = model.logits.save()
    assert torch.equal(logits, hf(input_ids=ids).logits)


def test_a_draft_that_cannot_serve_says_where_it_is_and_what_to_load(tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import nnatlas
    from nnatlas.compiler import userspec
    from nnatlas.errors import NnatlasError

    def failing(model_type: str, *args: Any, **kwargs: Any) -> Any:
        raise userspec.DraftFailed(model_type, ["oracle logits [eager]"], ["identity layers[i].mlp: on layers[0].mlp: "
                                                                         "AssertionError"], "family: x\n")

    monkeypatch.setenv("NNATLAS_CACHE", str(tmp_path))
    monkeypatch.setattr(userspec, "draft_verified", failing)
    folder, _ = _dense_first_folder("glm_moe_dsa", first_k_dense_replace=1, num_hidden_layers=2)
    with pytest.raises(NnatlasError) as e:
        nnatlas.load(folder, draft=True)
    file = tmp_path / "drafts" / "glm_moe_dsa.draft.yaml"
    assert file.read_text() == "family: x\n"
    message = str(e.value)
    assert f"spec={file}" in message and "layers[0].mlp" in message and "nnatlas draft" not in message


# ---- structural perturbation (nnatlas.testing.layouts) ----


def test_structural_options_are_found_from_the_config_class() -> None:
    from nnatlas.testing.layouts import structural_options

    llama = structural_options(transformers.LlamaConfig(**T.first_params("llama")))
    assert {"tie_word_embeddings", "attention_bias", "mlp_bias"} <= set(llama)
    dsv3 = structural_options(transformers.DeepseekV3Config(**T.first_params("deepseek_v3")))
    assert dsv3["first_k_dense_replace"][0] == T.first_params("deepseek_v3")["first_k_dense_replace"]
    assert set(dsv3["first_k_dense_replace"]) == {0, 1, 2}
    gemma2 = structural_options(transformers.Gemma2Config(**T.first_params("gemma2")))
    for kinds in gemma2["layer_types"]:  # rearranged, every kind still there
        assert sorted(set(kinds)) == sorted(set(gemma2["layer_types"][0]))


def test_a_pinned_layout_holds_and_an_unknown_one_is_refused() -> None:
    from nnatlas.testing.layouts import draw_layout

    params = T.first_params("llama")
    last = draw_layout(transformers.LlamaConfig, params, lambda label, options: options[-1],
                       {"tie_word_embeddings": {"pin": False, "reason": "untied"}}, "llama")
    assert last["tie_word_embeddings"] is False and last["attention_bias"] is not params.get("attention_bias", False)
    with pytest.raises(ValueError, match="tiny.layouts names no_such_option, which is no structural option"):
        draw_layout(transformers.LlamaConfig, params, lambda label, options: options[0],
                    {"no_such_option": {"pin": 1, "reason": "x"}}, "llama")


def test_a_drawn_dense_first_count_catches_one_mlp_class_for_every_block() -> None:
    """The mutation of the twin test above, caught by the hypothesis draws: a drawn first_k_dense_replace of 1 puts a
    dense block where the mutated spec reads a mixture; the family's own spec holds on the same case."""
    from nnatlas import registry
    from nnatlas.testing.layouts import draw_layout

    module = _one_mlp_class("glm4_moe")
    name = module.FAMILY.name
    registry.add_user(module)
    try:
        params = draw_layout(transformers.Glm4MoeConfig, T.first_params(name),
                             lambda label, options: 1 if "first_k_dense" in label else options[0], None, name)
        assert params["first_k_dense_replace"] == 1
        model = T.shared_build(name, params, perturbed=True)
        case = T.Case(name, params, T._fixed_inputs(model, text_only=True), 0, perturbed=True)
        with pytest.raises(Exception, match=r"layers\[0\]\.mlp \(Glm4MoeMLP\) has no value or module 'router'"):
            T.check_identities(case, "layers[i].mlp", tuple(range(6)))
    finally:
        registry.remove_user(name)
    own = T.Case("glm4_moe", params, case.inputs, 0, perturbed=True)
    T.check_identities(own, "layers[i].mlp", tuple(range(6)))


def test_a_twin_without_a_block_kind_passes_its_identities_without_hypothesis() -> None:
    """Nemotron-H's dense 9B has no mixture block: its twin checks none of the mixer's expert identities and passes,
    calling no hypothesis function outside a property test (``assume`` there is deprecated); ``check_identities``
    called outside one on such a case fails, saying nothing was checked."""
    checkpoint, path, indices = "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "layers[i].mixer.shared_experts", (0, 1)
    case = twins.twin_case("nemotron_h", checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # hypothesis' deprecation included
        assert identities_checked(case, path, indices) == 0
        T.check_twin_identities("nemotron_h", checkpoint, path, indices)
        with pytest.raises(AssertionError, match=r"no host at layers\[i\]\.mixer\.shared_experts .* nothing was checked"):
            T.check_identities(case, path, indices)
    assert identities_checked(case, "layers[i].mixer", (0,)) > 0  # (the twin has mixers: of the other kinds)

def test_a_layout_rule_without_its_reason_is_an_error_at_its_line() -> None:
    from nnatlas.compiler import SpecError
    from nnatlas.compiler.userspec import compile_text

    root = Path(__file__).resolve().parents[1]
    text = (root / "specs" / "llama.yaml").read_text().replace("family: llama\n", "family: layouts_llama\n", 1)
    text = text.replace("tiny:\n", "tiny:\n  layouts:\n    tie_word_embeddings: {pin: false}\n", 1)
    line = text.splitlines().index("    tie_word_embeddings: {pin: false}") + 1
    with pytest.raises(SpecError, match=rf"layouts_llama.yaml:{line}:\d+: tiny.layouts.tie_word_embeddings: a narrowed "
                                        "or pinned structural option says why"):
        compile_text(text.encode(), "layouts_llama.yaml")
