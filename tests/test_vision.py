"""Image-text loads: method read points, scoped ops, call conditions, shared notes, processors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import nnatlas
from nnatlas import testing as T
from nnatlas.compiler import SpecError
from nnatlas.compiler.language import readpoint
from nnatlas.compiler.resolve.resolve import resolve

FAMILY = "qwen3_vl"
SPECS = Path(__file__).resolve().parent.parent / "specs"


def test_method_patch_removed_after_trace_and_after_an_exception() -> None:
    model = T.build(FAMILY)
    text = model.native.model.language_model
    inputs = T._fixed_inputs(model)
    with model.trace(dict(inputs)):
        model.layers[0].deepstack_output.save()
    assert "_deepstack_process" not in text.__dict__
    with pytest.raises(RuntimeError, match="boom"):
        with model.trace(dict(inputs)):
            model.layers[0].deepstack_output[:] = lambda x: (_ for _ in ()).throw(RuntimeError("boom"))
    assert "_deepstack_process" not in text.__dict__
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.native.modules())


def test_deepstack_edit_reaches_only_image_positions_of_the_next_block() -> None:
    model = T.build(FAMILY)
    inputs = T._fixed_inputs(model)
    with model.trace(dict(inputs)):
        base = model.layers[1].input.save()
    with model.trace(dict(inputs)):
        mask = model.vision.image_token_mask.save()
        model.layers[0].deepstack_output[:] = 0
        edited = model.layers[1].input.save()
    assert torch.equal(base[~mask], edited[~mask]) and not torch.equal(base[mask], edited[mask])


def test_vision_values_are_views_of_the_native_stream() -> None:
    model = T.build(FAMILY)
    with model.trace(dict(T._fixed_inputs(model))):
        out = model.vision.layers[0].layer_output.save()
        native = model.vision.layers[0].output.save()
    assert out.shape[0] == 1 and out[0].data_ptr() == native.data_ptr()


def test_read_point_parses() -> None:
    r = readpoint.parse("model.language_model > method:_deepstack_process#i.args[2]")
    assert (r.kind, r.method, r.per_index, r.module, r.scope_root, r.access) == (
        "method", "_deepstack_process", True, ("language_model",), True, (2,))
    r = readpoint.parse("model.model > op:masked_scatter.input[2]")
    assert (r.kind, r.op, r.module, r.scope_root, r.access) == ("op", "masked_scatter", ("model",), True, (2,))
    r = readpoint.parse("router > op:linear.output")  # the same scoping from the host
    assert (r.kind, r.op, r.module, r.scope_root) == ("op", "linear", ("router",), False)


def _broken(tmp_path: Path, edit: tuple[str, str, str]) -> SpecError:
    specs = tmp_path / "specs"
    shutil.copytree(SPECS, specs)
    path = specs / edit[0]
    text = path.read_text()
    assert edit[1] in text
    path.write_text(text.replace(edit[1], edit[2], 1))
    with pytest.raises(SpecError) as e:
        resolve(specs, tmp_path)
    return e.value


def test_unknown_shared_notes_is_reported_where_it_is_named(tmp_path: Path) -> None:
    err = _broken(tmp_path, ("qwen3_vl.yaml", "{shared: qwen_vit}", "{shared: qwen_vitt}"))
    assert "specs/qwen3_vl.yaml:" in str(err) and "unknown shared notes 'qwen_vitt'" in str(err)
    assert "did you mean 'qwen_vit'" in str(err)


def test_a_call_condition_is_not_a_load_condition(tmp_path: Path) -> None:
    err = _broken(tmp_path, ("qwen3_vl.yaml", "needs: processor, reached: images}", "needs: images}"))
    assert "'images' is a call condition; 'needs' takes a load condition" in str(err)


def test_image_processor_without_torchvision_loads_back(tmp_path: Path) -> None:
    model = T.build(FAMILY)
    model.processor.save_pretrained(tmp_path)
    from nnatlas.inputs.processing import load_processor

    loaded = load_processor(tmp_path)
    assert type(loaded).__name__ == "Qwen3VLProcessor" and not hasattr(loaded, "video_processor") or \
        getattr(loaded, "video_processor", None) is None
    red = T.tiny_images([(16, 16)])
    a = model.processor(text=T.PROMPT, images=red, return_tensors="pt")
    b = nnatlas.wrap(model.native, processor=loaded).processor(text=T.PROMPT, images=red, return_tensors="pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
