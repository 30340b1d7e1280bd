"""The tree check written once (``nnatlas.tree.fit``): the runtime's walker finds how a model's module tree differs
from its family's spec, ``wrap`` says each misfit as a line with its blocks, and ``make generate``'s check says the
same misfit at its spec line with the nearest names. A spec item broken once is found by both, from the one walk."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

import nnatlas
from nnatlas import testing
from nnatlas.compiler import SpecError, generate
from nnatlas.families import llama
from nnatlas.spec import Family, HostSpec
from nnatlas.tree import fit

ROOT = Path(__file__).resolve().parent.parent


def _with_host(family: Family, path: str, **change: object) -> Family:
    hosts = tuple(dataclasses.replace(h, **change) if h.path == path else h for h in family.hosts)  # type: ignore[arg-type]
    return dataclasses.replace(family, hosts=hosts)


def _value(host: HostSpec, name: str, **read: object) -> HostSpec:
    values = tuple(dataclasses.replace(v, read=dataclasses.replace(v.read, **read)) if v.name == name else v  # type: ignore[arg-type]
                   for v in host.values)
    return dataclasses.replace(host, values=values)


@pytest.fixture(scope="module")
def model() -> nnatlas.AtlasModel:
    return testing.build("llama")


def test_a_misspelt_class_is_one_misfit_said_by_both(model: nnatlas.AtlasModel, tmp_path: Path) -> None:
    broken = _with_host(llama.FAMILY, "layers[i].mlp", cls="LlamaMlp")
    found = [m for m in fit.misfits(nnatlas.wrap(model.native, family=broken, check=False))]
    assert [(m.kind, m.path, m.found, m.accepted) for m in found] == \
        [("class", "layers[i].mlp", "LlamaMLP", ("LlamaMlp",))] * model.num_layers
    # the runtime's words: one line, the blocks it occurs on
    with pytest.raises(nnatlas.NnatlasError) as e:
        nnatlas.wrap(model.native, family=broken, check=True)
    blocks = ", ".join(str(i) for i in range(model.num_layers))
    assert f"  layers[i].mlp: the spec names class LlamaMlp, the module is LlamaMLP (on blocks {blocks})" in \
        str(e.value).splitlines()
    # the compiler's: the same misfit, at the spec's line
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    (specs / "llama.yaml").write_text((ROOT / "specs" / "llama.yaml").read_text().replace("class: LlamaMLP", "class: LlamaMlp"))
    with pytest.raises(SpecError) as spec_error:
        generate(tmp_path)
    assert str(spec_error.value).splitlines() == [
        "specs/llama.yaml:77:12: layers[i].mlp: class LlamaMlp: the module here is LlamaMLP (layers[0].mlp of the tiny model)"]


def test_a_climb_to_a_sibling_that_is_not_there_is_a_misfit_at_wrap_too(model: nnatlas.AtlasModel) -> None:
    """The union of the two checks that were: a read that climbs (``^.``) was held against the tree only at generate;
    the walker holds it at wrap as well."""
    attn = next(h for h in llama.FAMILY.hosts if h.path == "layers[i].self_attn")
    broken = dataclasses.replace(llama.FAMILY, hosts=tuple(
        _value(h, "attention_output", up=1, module=("post_attn_norm",)) if h is attn else h for h in llama.FAMILY.hosts))
    with pytest.raises(nnatlas.NnatlasError) as e:
        nnatlas.wrap(model.native, family=broken, check=True)
    line = next(t for t in str(e.value).splitlines() if "attention_output" in t)
    assert line.startswith("  layers[i].self_attn.attention_output (")
    assert "layers[i] (LlamaDecoderLayer) has no child module 'post_attn_norm' (its children: self_attn, mlp, " \
        "input_layernorm, post_attention_layernorm)" in line


def test_a_method_a_read_names_is_held_at_wrap_too(model: nnatlas.AtlasModel) -> None:
    mlp = next(h for h in llama.FAMILY.hosts if h.path == "layers[i].mlp")
    name = mlp.values[0].name
    broken = dataclasses.replace(llama.FAMILY, hosts=tuple(
        _value(h, name, kind="method", module=("down_proj",), method="forwrad") if h is mlp else h
        for h in llama.FAMILY.hosts))
    found = [m for m in fit.misfits(nnatlas.wrap(model.native, family=broken, check=False)) if m.kind == "method"]
    assert found and found[0].gap is not None and found[0].gap.part == "forwrad" and "forward" in found[0].gap.children
    with pytest.raises(nnatlas.NnatlasError, match=r"Linear has no method 'forwrad'"):
        nnatlas.wrap(model.native, family=broken, check=True)


def test_a_model_that_fits_has_no_misfit(model: nnatlas.AtlasModel) -> None:
    assert list(fit.misfits(model)) == []
