"""Parts: fragments written once in specs/parts/ and included by families with a class map.

The Qwen ViT vision hosts live in specs/parts/qwen_vit.yaml, included by qwen3_vl and qwen3_5_text;
qwen3_next, which extends qwen3_5_text, has no vision encoder without dropping anything (parts are
not inherited: a family is the parts it includes). A part is no family: nothing is generated for it.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

from nnatlas import compiler
from nnatlas.compiler import SpecError, compile_atlas, generate

ROOT = Path(__file__).resolve().parent.parent
VISION = ("vision", "vision.layers[i]", "vision.layers[i].self_attn", "vision.layers[i].mlp")


def test_the_vision_part_is_written_once_and_included_twice() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    fams = {f.name: f for f in atlas.families}
    vl, q35 = fams["qwen3_vl"], fams["qwen3_5_text"]
    for f, prefix in ((vl, "Qwen3VL"), (q35, "Qwen3_5")):
        assert [h.cls for p in VISION for h in f.hosts_at(p)] == [
            f"{prefix}VisionModel", f"{prefix}VisionBlock", f"{prefix}VisionAttention", f"{prefix}VisionMLP"]
        assert f.parts == (("specs/parts/qwen_vit.yaml", f.parts[0][1]),)
        # each mapped class stands where the family maps it
        assert f.hosts_at("vision")[0].at is not None and f.hosts_at("vision")[0].at[0] == f.file
    for p in VISION:  # the same hosts but for the classes
        a, b = vl.hosts_at(p)[0], q35.hosts_at(p)[0]
        assert dataclasses.replace(a, cls="") == dataclasses.replace(b, cls="")
    for name in ("qwen3_vl.yaml", "qwen3_5_text.yaml"):
        text = (ROOT / "specs" / name).read_text()
        assert "op:unsqueeze#2" not in text and "patch_embed.output" not in text  # the vision hosts are not repeated


def test_a_family_is_its_own_parts_not_a_subtraction() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    nxt = next(f for f in atlas.families if f.name == "qwen3_next")
    assert not [h for h in nxt.hosts if h.path.startswith(("vision", "projector"))]
    assert not [k for k, _ in nxt.rename if k.startswith(("vision", "projector"))]
    assert nxt.parts == ()
    spec = (ROOT / "specs" / "qwen3_next.yaml").read_text()
    assert not re.search(r"^ +(vision|projector)", spec, re.M)  # nothing of the vision encoder to drop
    # the one drop outside the hosts' values and classes (the MLP kinds' own): tiny.image_text, the base's second tiny
    # load (no part carries loads)
    drops = [line.split("#")[0].strip() for line in spec.splitlines() if re.search(r": null\b", line)
             and not re.match(r"^ +(class|mlp_\w+|router_logits|expert_\w+|routed_output|shared_expert_output): null", line)]
    assert drops == ["image_text: null"]


def test_parts_are_not_families() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    assert "qwen_vit" not in {f.name for f in atlas.families}
    outputs = compiler.render(atlas)
    assert not [k for k in outputs if "qwen_vit" in k]
    assert not list((ROOT / "generated").rglob("*qwen_vit*"))
    assert ("specs/parts/qwen_vit.yaml", next(s for p, s in atlas.sources if p.endswith("qwen_vit.yaml"))) \
        in atlas.sources  # but the atlas digest covers it


PART = """part: gated_mlp
classes: [Mlp]
hosts:
  layers[i].mlp:
    class: Mlp
    values:
      mlp_activation: act_fn.output
      mlp_neurons: down_proj.input
      mlp_output: output
    identities:
      - mlp_neurons == mlp_activation * up_proj.output
"""


def _specs(tmp_path: Path, files: dict[str, str]) -> Path:
    specs = tmp_path / "specs"
    (specs / "parts").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "_vocabulary.yaml", specs)
    for name, text in files.items():
        (specs / name).write_text(text)
    return specs


def _llama_with(include: str, drop_mlp: bool = True) -> str:
    text = (ROOT / "specs" / "llama.yaml").read_text()
    if drop_mlp:
        start = text.index("  layers[i].mlp:")
        text = text[:start] + text[text.index("\ntiny:") + 1:]
    return text.replace("rename:\n", include + "\nrename:\n", 1)


def test_one_part_in_two_families_with_their_own_classes(tmp_path: Path) -> None:
    specs = _specs(tmp_path, {
        "parts/gated_mlp.yaml": PART,
        "llama.yaml": _llama_with("include:\n  - {part: gated_mlp, classes: {Mlp: LlamaMLP}}"),
        "child.yaml": "family: child\nextends: llama\ninclude:\n  - {part: gated_mlp, classes: {Mlp: ChildMLP}}\n",
        "other.yaml": "family: other\nextends: llama\nhosts:\n  layers[i]:\n    identities=: [layer_input == layer_input]\n",
    })
    fams = {f.name: f for f in compile_atlas(specs, tmp_path).families}
    assert fams["llama"].hosts_at("layers[i].mlp")[0].cls == "LlamaMLP"
    assert fams["child"].hosts_at("layers[i].mlp")[0].cls == "ChildMLP"
    assert fams["other"].hosts_at("layers[i].mlp") == ()  # extends llama, includes nothing: no part
    # the part's host goes after the family's own hosts, as if written at the end of the file
    assert [h.path for h in fams["llama"].hosts][-1] == "layers[i].mlp"


def test_part_errors(tmp_path: Path) -> None:
    bad_part = PART.replace("classes: [Mlp]", "classes: [Mlp, Gate]").replace("class: Mlp", "class: Mlpp")
    specs = _specs(tmp_path, {
        "parts/gated_mlp.yaml": bad_part,
        "parts/wrong_name.yaml": "part: right_name\n",
        "llama.yaml": _llama_with("include:\n  - {part: gated_mlp, classes: {Mlp: LlamaMLP, Mpl: X}}\n"
                                  "  - {part: gated_mlp}\n  - {part: gated_mpl}"),
    })
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert str(e.value).splitlines() == [
        "specs/llama.yaml:14:5: include gated_mlp: map every class of the part to this family's: Gate not mapped "
        "(classes: {Gate: ...})",
        "specs/llama.yaml:14:48: include gated_mlp: the part has no class 'Mpl' to map (its classes: Mlp, Gate); "
        "did you mean 'Mlp'?",
        "specs/llama.yaml:15:12: include names part 'gated_mlp' twice",
        "specs/llama.yaml:16:12: unknown part 'gated_mpl' (specs/parts/gated_mpl.yaml); did you mean 'gated_mlp'?",
        "specs/parts/gated_mlp.yaml:5:12: part gated_mlp: host 'layers[i].mlp' has class 'Mlpp', which is not one "
        "of the part's classes (Mlp, Gate): list it under 'classes' for the families to map",
        "specs/parts/wrong_name.yaml:1:7: a part says its name: 'part: wrong_name' (specs/parts/wrong_name.yaml)",
    ]


def test_every_class_of_a_part_is_mapped(tmp_path: Path) -> None:
    specs = _specs(tmp_path, {
        "parts/gated_mlp.yaml": PART.replace("classes: [Mlp]", "classes: [Mlp, Gate]"),
        "llama.yaml": _llama_with("include:\n  - {part: gated_mlp, classes: {Mpl: LlamaMLP}}"),
    })
    with pytest.raises(SpecError) as e:
        compile_atlas(specs, tmp_path)
    assert str(e.value).splitlines() == [
        "specs/llama.yaml:14:5: include gated_mlp: map every class of the part to this family's: Mlp, Gate not "
        "mapped (classes: {Mlp: ...})",
        "specs/llama.yaml:14:33: include gated_mlp: the part has no class 'Mpl' to map (its classes: Mlp, Gate); "
        "did you mean 'Mlp'?",
    ]


def test_a_misspelt_mapped_class_fails_generate_at_the_include(tmp_path: Path) -> None:
    specs = _specs(tmp_path, {
        "parts/gated_mlp.yaml": PART,
        "llama.yaml": _llama_with("include:\n  - {part: gated_mlp, classes: {Mlp: LlamaMlp}}"),
    })
    with pytest.raises(SpecError) as e:
        generate(specs.parent)
    assert str(e.value) == ("specs/llama.yaml:14:38: layers[i].mlp: class LlamaMlp: the module here is LlamaMLP "
                            "(layers[0].mlp of the tiny model)")
