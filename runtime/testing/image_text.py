"""The image-text load's checks: a text-only load and a prompt without images refuse the vision values by name,
broken image inputs fail before the forward, and a saved model loads back with its processor."""

from __future__ import annotations

from typing import Any

import torch

import nnatlas

from ..errors import NnatlasError, NotReached, Unavailable
from ..model import AtlasModel
from .cases import _fixed_inputs
from .tiny import shared_build
from .values import each_host, host_specs


def _vision_specs(model: AtlasModel) -> list[tuple[str, Any, Any]]:
    """(label, host, value spec) of every value that needs the image-text load or a call with images."""
    out = []
    for path in dict.fromkeys(h.path for h in model._family.hosts):
        for label, host in each_host(model, path):
            for spec in host_specs(model, host):
                for v in spec.values:
                    if (v.needs is not None and v.needs.name == "processor") or v.reached is not None:
                        out.append((label, host, v))
    return out


def check_text_only_load(family: str, variant: str | None = None) -> None:
    """Without a processor every vision value (and DeepStack's) raises Unavailable, naming the load."""
    model = shared_build(family, processor=False, variant=variant, perturbed=True)
    assert model.processor is None
    found = [x for x in _vision_specs(model) if x[2].needs is not None and x[2].needs.name == "processor"]
    assert found, "no value needs the image-text load"
    inputs = _fixed_inputs(model, text_only=True)
    for label, host, v in found:
        try:
            with model.trace(dict(inputs)):
                getattr(host, v.name).save()
        except Unavailable as e:
            assert "image-text-to-text" in str(e), f"{label}.{v.name}: {e}"
        else:
            raise AssertionError(f"{label}.{v.name} was served by a text-only load")
    with model.trace(dict(inputs)):  # the text values are all there
        out = model.layers[0].layer_output.save()
    assert out.shape[:2] == inputs["input_ids"].shape


def check_text_prompt(family: str, variant: str | None = None) -> None:
    """On a prompt without images, a value computed only with images raises NotReached before the
    forward (not a hang, not a wrong tensor), also when later values were asked for after it."""
    model = shared_build(family, variant=variant, perturbed=True)
    inputs = _fixed_inputs(model, text_only=True)
    found = [x for x in _vision_specs(model) if x[2].reached is not None]
    assert found, "no value is computed only with images"
    for label, host, v in found:
        if v.needs is not None and v.needs.name != "processor":
            continue
        if v.read.kind == "derived":  # computed from the inputs: on a text prompt, nothing is an image
            with model.trace(dict(inputs)):
                derived = getattr(host, v.name).save()
            assert not bool(torch.as_tensor(derived).any()), f"{label}.{v.name} marks something on a text prompt"
            continue
        try:
            with model.trace(dict(inputs)):
                getattr(host, v.name).save()
                model.layers[-1].layer_output.save()
        except NotReached as e:
            assert "images" in str(e) and v.name in str(e), f"{label}.{v.name}: {e}"
        else:
            raise AssertionError(f"{label}.{v.name} was served on a prompt without images")


def check_image_input_errors(family: str, variant: str | None = None) -> None:
    """Raw image tensors: a missing mm_token_type_ids (where the model takes them) or an image-token
    count that does not match the images is a clear error before the forward."""
    model = shared_build(family, variant=variant, perturbed=True)
    inputs = _fixed_inputs(model)
    calls = []
    handle = model.native.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        keep = torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool)
        image = inputs["input_ids"][0] == model.config.image_token_id
        keep[int(image.nonzero()[0])] = False  # one image token fewer
        fewer = {k: (v[:, keep] if k in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids") else v)
                 for k, v in inputs.items()}
        cases: list[tuple[dict[str, torch.Tensor], str]] = [(fewer, "image tokens")]
        if "mm_token_type_ids" in inputs:
            bad = dict(inputs)
            bad.pop("mm_token_type_ids")
            cases.insert(0, (bad, "mm_token_type_ids"))
        for broken, words in cases:
            try:
                with model.trace(broken):
                    model.logits.save()
            except NnatlasError as e:
                assert words in str(e), str(e)
            else:
                raise AssertionError(f"inputs without the right {words} ran")
        assert not calls, "the forward ran before the error"
    finally:
        handle.remove()
    with model.trace(dict(inputs)):
        logits = model.logits.save()
    assert logits.shape[1] == inputs["input_ids"].shape[1]


def check_processor_round_trip(family: str, tmp: Any, variant: str | None = None) -> None:
    """save_pretrained / from_pretrained in a directory: nnatlas.load(path, task="image-text-to-text")
    brings back the wrapper with its processor (no torchvision needed), and the same logits; the
    default load (text-generation) of the same directory takes text only, with the same text values."""
    model = shared_build(family, variant=variant, perturbed=True)
    native: Any = model.native
    native.save_pretrained(tmp)
    processor: Any = model.processor
    processor.save_pretrained(tmp)
    loaded = nnatlas.load(str(tmp), task="image-text-to-text", attn_implementation="eager")
    assert loaded.family == family and loaded.processor is not None
    inputs = _fixed_inputs(model)
    again = _fixed_inputs(loaded)
    assert all(torch.equal(inputs[k], again[k]) for k in inputs), "the loaded processor makes other inputs"
    with model.trace(dict(inputs)):
        a = model.logits.save()
    with loaded.trace(dict(again)):
        b = loaded.logits.save()
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    text_only = nnatlas.load(str(tmp), attn_implementation="eager")
    assert text_only.family == family and text_only.processor is None
    ids = _fixed_inputs(model, text_only=True)
    with model.trace(dict(ids)):
        wrapped = model.layers[-1].layer_output.save()
        wrapped_logits = model.logits.save()
    with text_only.trace(dict(ids)):
        alone = text_only.layers[-1].layer_output.save()
        alone_logits = text_only.logits.save()
    torch.testing.assert_close(alone, wrapped)
    torch.testing.assert_close(alone_logits, wrapped_logits)
