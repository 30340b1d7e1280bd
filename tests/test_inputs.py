"""Bad input gets an InputError saying what was expected, before the forward runs; the caller's
tensors are never written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import nnatlas
from nnatlas.testing import suite as T

VL = "qwen3_vl"


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return T.build("llama", attn_implementation="eager")


@pytest.fixture(scope="module")
def vl() -> nnatlas.AtlasModel:
    return T.build(VL)


@pytest.fixture(scope="module")
def qwen35_images() -> nnatlas.AtlasModel:
    return T.build("qwen3_5_text", variant="image_text")


def ids_of(model: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return T.draw_inputs(model.vocab_size, 2, 6, [0, 2], seed=3)


def trace(model: nnatlas.AtlasModel, inputs: Any, **kw: Any) -> None:
    with model.trace(inputs, **kw):
        model.logits.save()


def edit(model: nnatlas.AtlasModel, fn: Callable[[nnatlas.AtlasModel], None]) -> None:
    with model.trace(ids_of(model)):
        fn(model)
        model.logits.save()


def with_(inputs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**inputs, **changes}


def zero_mlp(value: Any) -> Callable[[nnatlas.AtlasModel], None]:
    def fn(m: nnatlas.AtlasModel) -> None:
        m.layers[0].mlp.mlp_output = value
    return fn


def generate_past_the_steps(m: nnatlas.AtlasModel) -> None:
    with m.generate(ids_of(m), max_new_tokens=2) as tracer:
        for _ in tracer.iter[5:6]:
            m.logits.save()


def vl_inputs(m: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return dict(T._fixed_inputs(m))


# (case, model, what it does, words the message must hold)
CASES: list[tuple[str, str, Callable[[nnatlas.AtlasModel], None], tuple[str, ...]]] = [
    ("empty prompt", "llama", lambda m: trace(m, ""), ("prompt is empty", "at least one token")),
    ("[1, 0] ids", "llama", lambda m: trace(m, torch.zeros(1, 0, dtype=torch.long)), ("at least one token", "[1, 0]")),
    ("empty list", "llama", lambda m: trace(m, []), ("empty list", "expected a prompt")),
    ("float ids", "llama", lambda m: trace(m, torch.ones(1, 4)), ("integer token ids", "torch.float32")),
    ("3-D ids", "llama", lambda m: trace(m, torch.ones(1, 2, 3, dtype=torch.long)), ("rank 1", "rank 3")),
    ("0-D ids", "llama", lambda m: trace(m, torch.tensor(3)), ("rank 1", "rank 0")),
    ("3-D ids in a dict", "llama", lambda m: trace(m, {"input_ids": torch.ones(1, 2, 3, dtype=torch.long)}),
     ("input_ids", "rank 3")),
    ("negative id", "llama", lambda m: trace(m, with_(ids_of(m), input_ids=ids_of(m)["input_ids"] * 0 - 1)),
     ("input_ids", "[0, 96)", "got -1")),
    ("id >= vocab_size", "llama", lambda m: trace(m, torch.tensor([[1, 2, 96]])), ("[0, 96)", "got 96")),
    ("attention_mask of another shape", "llama",
     lambda m: trace(m, with_(ids_of(m), attention_mask=torch.ones(2, 5, dtype=torch.long))),
     ("attention_mask", "shape of input_ids [2, 6]", "[2, 5]")),
    ("unknown keyword argument", "llama", lambda m: trace(m, ids_of(m), output_attention=True),
     ("takes no argument 'output_attention' (nearest: output_attentions)", "expected its parameters (input_ids")),
    ("unknown key in a dict", "llama", lambda m: trace(m, with_(ids_of(m), pixel_values=None)),
     ("takes no argument 'pixel_values'",)),
    ("no input_ids", "llama", lambda m: trace(m, {"attention_mask": torch.ones(1, 3)}),
     ("expected input_ids",)),
    ("images=[]", VL, lambda m: trace(m, "the city", images=[]), ("images=[] holds no image", "PIL images")),
    ("pixel_values of the wrong width", VL,
     lambda m: trace(m, with_(vl_inputs(m), pixel_values=vl_inputs(m)["pixel_values"][:, :-1])),
     ("pixel_values", "expected rows of")),
    ("float image_grid_thw", VL,
     lambda m: trace(m, with_(vl_inputs(m), image_grid_thw=vl_inputs(m)["image_grid_thw"].float())),
     ("image_grid_thw", "integer tensor [images, 3]", "torch.float32")),
    ("1-D image_grid_thw", VL,
     lambda m: trace(m, with_(vl_inputs(m), image_grid_thw=vl_inputs(m)["image_grid_thw"][0])),
     ("image_grid_thw", "[images, 3]", "shape [3]")),
    ("too-short mm_token_type_ids", VL,
     lambda m: trace(m, with_(vl_inputs(m), mm_token_type_ids=vl_inputs(m)["mm_token_type_ids"][:, :-1])),
     ("mm_token_type_ids", "shape of input_ids")),
    ("assign a str", "llama", lambda m: edit(m, zero_mlp("zero")),
     ("layers[0].mlp.mlp_output = a str", "expected a tensor", "Residual [batch seq hidden_size]")),
    ("assign None", "llama", lambda m: edit(m, zero_mlp(None)), ("mlp_output = None", "Residual")),
    ("assign a list", "llama", lambda m: edit(m, zero_mlp([0.0] * 16)), ("a list", "torch.tensor(...)", "Residual")),
    ("assign a tensor that does not broadcast", "llama", lambda m: edit(m, zero_mlp(torch.zeros(3, 5))),
     ("shape [3, 5] does not broadcast", "Residual [batch seq hidden_size] = [2, 6, 16]")),
    ("assign a float tensor to token ids", "llama",
     lambda m: edit(m, lambda m: setattr(m, "input_ids", torch.zeros(2, 6))),
     ("input_ids", "torch.float32 cannot become long", "Tokens [batch seq]")),
    ("string index", "llama", lambda m: edit(m, lambda m: m.layers[0].mlp.mlp_output.__setitem__("a", 0)),
     ("mlp_output['a']", "not a string", "Residual")),
    ("setitem a tensor that does not fit", "llama",
     lambda m: edit(m, lambda m: m.layers[0].mlp.mlp_output.__setitem__((0, 0), torch.ones(5))),
     ("mlp_output[(0, 0)] = ...", "shape [5]", "does not fit", "Residual")),
    ("trace(grad=...) not a bool", "llama", lambda m: trace(m, ids_of(m), grad="yes"),
     ("trace(grad=...)", "expected True or False", "'yes'")),
    ("tracer.iter past max_new_tokens", "llama", generate_past_the_steps,
     ("tracer.iter[5:6]", "2 generation steps (max_new_tokens)")),
]


# the image cases again on Qwen3.5's image-text load
CASES += [(f"{case} (qwen3_5 image-text)", "qwen35_images", action, words)
          for case, family, action, words in list(CASES) if family == VL]


@pytest.mark.parametrize(("case", "family", "action", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_an_input_error(case: str, family: str, action: Callable[[nnatlas.AtlasModel], None],
                                     words: tuple[str, ...], llama: nnatlas.AtlasModel,
                                     request: pytest.FixtureRequest) -> None:
    model = llama if family == "llama" else request.getfixturevalue("vl" if family == VL else family)
    calls: list[int] = []
    handle = model.native.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(nnatlas.InputError) as info:
            action(model)
    finally:
        handle.remove()
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in message, f"{case}: {w!r} not in {message!r}"
    # refused before the forward, except what only the forward's tensor can tell (a setitem's shape)
    assert not calls or case == "setitem a tensor that does not fit", f"{case}: the forward ran first"
    assert model._tracer is None
    trace(model, ids_of(model) if family == "llama" else vl_inputs(model))  # and the model traces again


def test_load_of_a_missing_local_path_says_so(tmp_path: Any) -> None:
    for path in (str(tmp_path / "nope"), "./no/such/model", "~/no-such-model-dir/"):
        with pytest.raises(nnatlas.InputError, match="does not exist"):
            nnatlas.load(path)


def test_numpy_edits_are_converted(llama: nnatlas.AtlasModel) -> None:
    inputs = ids_of(llama)
    with llama.trace(inputs):
        llama.layers[0].mlp.mlp_output = np.zeros((2, 6, 16), dtype=np.float64)
        zero = llama.layers[0].mlp.mlp_output.save()
    assert torch.count_nonzero(zero) == 0


def test_a_tensor_that_broadcasts_is_written_in(llama: nnatlas.AtlasModel) -> None:
    inputs = ids_of(llama)
    with llama.trace(inputs):
        llama.layers[0].mlp.mlp_output = torch.full((16,), 0.5)
        out = llama.layers[0].mlp.mlp_output.save()
    assert out.shape == (2, 6, 16) and bool((out == 0.5).all())


def test_iter_ranges_inside_the_steps_still_work(llama: nnatlas.AtlasModel) -> None:
    with llama.generate(ids_of(llama), max_new_tokens=2) as tracer:
        outs = [llama.logits.save() for _ in tracer.iter[0:2]]
        last = [llama.logits.save() for _ in tracer.iter[-1:]]
    assert all(o.numel() for o in outs + last)


def test_tokenizer_output_keeps_only_what_the_forward_takes(llama: nnatlas.AtlasModel) -> None:
    from transformers import BatchEncoding

    made = llama.tokenizer("the city of paris", return_tensors="pt")
    # what a BERT-style fast tokenizer adds; Llama's forward takes none (a plain dict with it is refused)
    enc = BatchEncoding({**made, "token_type_ids": torch.zeros_like(made["input_ids"])})
    with llama.trace(enc):
        logits = llama.logits.save()
    assert logits.shape[:2] == enc["input_ids"].shape


# ---- the caller's tensors ------------------------------------------------------------------

def test_edits_of_inputs_never_write_the_callers_tensors(llama: nnatlas.AtlasModel) -> None:
    inputs = ids_of(llama)
    ids, mask = inputs["input_ids"].clone(), inputs["attention_mask"].clone()
    with llama.trace({"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}):
        llama.input_ids[:] = 7
        llama.attention_mask[:] = 1
        seen = llama.input_ids.save()
        logits = llama.logits.save()
    assert torch.equal(inputs["input_ids"], ids) and torch.equal(inputs["attention_mask"], mask)
    assert bool((seen == 7).all())  # the forward ran on the edited copy
    with llama.trace({"input_ids": torch.full_like(ids, 7), "attention_mask": torch.ones_like(mask)}):
        want = llama.logits.save()
    torch.testing.assert_close(logits, want)
    # a bare tensor (1-D: the forward gets a view of it) and an assignment
    row = ids[0].clone()
    with llama.trace(row):
        llama.input_ids = torch.full((1, 6), 5)
    assert torch.equal(row, ids[0])


def test_edits_of_a_value_that_is_the_callers_embeddings_leave_them(llama: nnatlas.AtlasModel) -> None:
    embeds = torch.randn(1, 4, 16)
    before = embeds.clone()
    with llama.trace({"inputs_embeds": embeds}):
        llama.layers[0].layer_input[:] = 0
        first = llama.layers[0].layer_input.save()
    assert torch.equal(embeds, before)
    assert torch.count_nonzero(first) == 0


def test_reads_of_inputs_stay_zero_copy(llama: nnatlas.AtlasModel) -> None:
    inputs = ids_of(llama)
    with llama.trace(inputs):
        seen = llama.input_ids.save()
    assert seen.data_ptr() == inputs["input_ids"].data_ptr()
