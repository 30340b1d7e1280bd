"""The runtime's promises: reads are views, edits land, errors say what to do, nothing survives a trace."""

from __future__ import annotations

import threading

import pytest
import torch

import nnatlas
from nnatlas import testing
from nnatlas.errors import NnatlasError, NotReached, OutOfOrderError, Unavailable, UnknownName
from nnatlas.trace import sites


@pytest.fixture(scope="module")
def llama() -> nnatlas.AtlasModel:
    return testing.build("llama", attn_implementation="eager")


@pytest.fixture(scope="module")
def inputs(llama: nnatlas.AtlasModel) -> dict[str, torch.Tensor]:
    return testing.draw_inputs(llama.vocab_size, 2, 6, [0, 2], seed=3)


def hook_count(model: nnatlas.AtlasModel) -> int:
    """nnatlas' hooks on the model (transformers installs output-capturing hooks of its own, for good),
    and the forwards a trace wraps on module instances."""
    hooks = [h for m in model.native.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values(),
                                                          m.__dict__.get("forward"))]
    return sum(1 for h in hooks if getattr(h, "__module__", "").startswith("nnatlas"))


def assert_clean(model: nnatlas.AtlasModel, impl: str = "eager") -> None:
    assert hook_count(model) == 0
    assert sites.registered_names() == set()
    assert model.config._attn_implementation == impl
    assert torch._C._len_torch_function_stack() == 0
    assert model._tracer is None


def test_block_sum_and_reads_are_views(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    seen = {}
    handle = llama.native.model.layers[1].register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    try:
        with llama.trace(inputs):
            x = llama.layers[1].input.save()
            att = llama.layers[1].self_attn.attention_output.save()
            mlp = llama.layers[1].mlp.mlp_output.save()
            out = llama.layers[1].layer_output.save()
    finally:
        handle.remove()
    torch.testing.assert_close(x + att + mlp, out, atol=0, rtol=0)
    assert out.untyped_storage().data_ptr() == seen["out"].untyped_storage().data_ptr()  # no copy
    assert_clean(llama)


def test_hidden_states_facts_pinned(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    """hs[0] is the first block's input, hs[i] block i-1's output, but hs[L] is the final norm's output."""
    n = llama.num_layers
    with llama.trace(inputs, output_hidden_states=True) as tracer:
        first = llama.layers[0].layer_input.save()
        outs = [llama.layers[i].layer_output.save() for i in range(n)]
        normed = llama.final_norm_output.save()
    hs = tracer.output.hidden_states
    assert torch.equal(hs[0], first)
    for i in range(1, n):
        assert torch.equal(hs[i], outs[i - 1])
    assert torch.equal(hs[n], normed) and not torch.equal(hs[n], outs[-1])


def test_edits_reach_the_forward(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    with llama.trace(inputs):
        base_mlp0 = llama.layers[0].mlp.mlp_output.save()
        base = llama.logits.save()
    base_mlp0 = base_mlp0.clone()
    # assignment of a tensor, in-place setitem, a function of the value, an expression of earlier values
    with llama.trace(inputs):
        llama.layers[1].mlp.mlp_output = torch.zeros_like(base_mlp0)
        a = llama.logits.save()
    with llama.trace(inputs):
        llama.layers[1].mlp.mlp_output[:] = 0
        b = llama.logits.save()
    with llama.trace(inputs):
        llama.layers[1].mlp.mlp_output = lambda v: v * 0
        c = llama.logits.save()
    assert torch.equal(a, b) and torch.equal(b, c) and not torch.equal(a, base)
    with llama.trace(inputs):
        early = llama.layers[0].mlp.mlp_output.save()
        llama.layers[1].mlp.mlp_output = llama.layers[0].mlp.mlp_output * 0.5
        late = llama.layers[1].mlp.mlp_output.save()
    torch.testing.assert_close(late, early * 0.5, atol=0, rtol=0)
    with llama.trace(inputs):
        llama.layers[0].self_attn.attention_premix[:, :, 0] = 0  # one head, through the view onto o_proj's input
        premix = llama.layers[0].self_attn.o_proj.input.save()
    assert torch.all(premix.unflatten(-1, (llama.num_heads, llama.head_dim))[:, :, 0] == 0)
    assert_clean(llama)


def test_out_of_order_names_both(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    with pytest.raises(OutOfOrderError) as info:
        with llama.trace(inputs):
            llama.layers[1].layer_output.save()
            llama.layers[0].layer_output.save()
    assert "layers[0].layer_output is computed before layers[1].layer_output" in str(info.value)
    assert_clean(llama)
    with llama.trace(inputs, order="any"):
        late = llama.layers[1].layer_output.save()
        early = llama.layers[0].layer_output.save()
    assert late.shape == early.shape


def test_a_read_point_that_never_fires_says_so_not_out_of_order(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    """A value whose read point the forward never reaches, asked for before a later one, was reported as
    "computed after" the later one; the forward now runs on, and says the read point never fired."""
    mlp = llama.native.model.layers[0].mlp

    def forward(x: torch.Tensor) -> torch.Tensor:  # the activation as a function: act_fn never fires
        return mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

    mlp.forward = forward
    try:
        with pytest.raises(NotReached) as info:
            with llama.trace(inputs):
                llama.layers[0].mlp.mlp_activation.save()
                llama.layers[0].mlp.mlp_neurons.save()
                llama.layers[1].layer_output.save()
        assert str(info.value).startswith("layers[0].mlp.mlp_activation was never computed: its read point never "
                                          "fired in this forward, so layers[0].mlp.mlp_neurons, asked for after it")
        assert_clean(llama)
    finally:
        del mlp.forward
    with llama.trace(inputs):  # the same body on the model's own forward
        x = llama.layers[0].mlp_input.save()
        act = llama.layers[0].mlp.mlp_activation.save()
        neurons = llama.layers[0].mlp.mlp_neurons.save()
    torch.testing.assert_close(neurons, act * mlp.up_proj(x))


def test_expression_of_a_later_value_is_out_of_order(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    with pytest.raises(OutOfOrderError) as info:
        with llama.trace(inputs):
            llama.layers[0].mlp.mlp_output = llama.layers[1].mlp.mlp_output * 2
    assert "layers[1].mlp.mlp_output" in str(info.value) and "layers[0].mlp.mlp_output" in str(info.value)
    assert_clean(llama)


def test_not_reached(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    embeds = llama.native.model.embed_tokens(inputs["input_ids"]).detach()
    with pytest.raises(NotReached) as info:
        with llama.trace({"inputs_embeds": embeds, "attention_mask": inputs["attention_mask"]}):
            llama.token_embeddings.save()
    assert "token_embeddings" in str(info.value)
    assert_clean(llama)


def test_unavailable_says_which_load(inputs: dict) -> None:
    # falcon's attention is its module's own code: under sdpa it forms no pattern, a read recomputes it
    # from its sdpa call (recompute: sdpa), and an edit could reach nothing
    falcon = testing.build("falcon", attn_implementation="sdpa")
    with pytest.raises(Unavailable) as info:
        with falcon.trace(inputs):
            falcon.layers[0].self_attn.attention_probabilities[:] = 0
    assert "attn_implementation='sdpa'" in str(info.value) and 'attn_implementation="eager"' in str(info.value)
    assert "scaled_dot_product_attention" in str(info.value)
    assert_clean(falcon, "sdpa")
    sdpa = testing.build("llama", attn_implementation="sdpa")  # llama's is recomputed, but not editable
    with pytest.raises(Unavailable) as info:
        with sdpa.trace(inputs):
            sdpa.layers[0].self_attn.attention_probabilities[:] = 0
    assert "attn_implementation='sdpa'" in str(info.value) and 'attn_implementation="eager"' in str(info.value)
    with sdpa.trace(inputs):
        q = sdpa.layers[0].self_attn.attention_queries.save()
        p = sdpa.layers[0].self_attn.attention_probabilities.save()
    assert q.shape[1] == sdpa.num_heads == p.shape[1]
    assert_clean(sdpa, "sdpa")


def test_unknown_name_suggests(llama: nnatlas.AtlasModel) -> None:
    with pytest.raises(UnknownName) as info:
        llama.layers[0].layer_ouput  # noqa: B018
    assert "nearest: layer_output" in str(info.value)
    with pytest.raises(IndexError, match="there are 3"):
        llama.layers[7]


def test_nothing_survives_an_exception(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    with pytest.raises(ValueError, match="in the body"):
        with llama.trace(inputs):
            llama.layers[0].self_attn.attention_scores.save()
            raise ValueError("in the body")
    assert_clean(llama)

    def boom(v: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("in the forward")

    with pytest.raises(RuntimeError, match="in the forward"):
        with llama.trace(inputs):
            llama.layers[0].self_attn.attention_scores.save()
            llama.layers[0].self_attn.attention_probabilities = boom
    assert_clean(llama)
    with llama.trace(inputs):  # and the model still traces
        llama.layers[0].self_attn.attention_scores.save()
    assert_clean(llama)


def test_save_outside_a_trace_and_nested_traces(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    with pytest.raises(NnatlasError, match="inside `with model.trace"):
        llama.layers[0].layer_output.save()
    with pytest.raises(NnatlasError, match="do not nest"):
        with llama.trace(inputs):
            with llama.trace(inputs):
                pass
    assert_clean(llama)


def test_two_models_in_one_process_do_not_interfere(inputs: dict) -> None:
    a = testing.build("llama", seed=1)
    b = testing.build("llama", seed=2)
    g = testing.build("gpt2")
    ids = {k: v for k, v in inputs.items()}
    with a.trace(ids):
        pa = a.layers[0].self_attn.attention_probabilities.save()
    with b.trace(ids):
        pb = b.layers[0].self_attn.attention_probabilities.save()
    with g.trace(testing.draw_inputs(g.vocab_size, 2, 6, [0, 2], seed=3)):
        pg = g.layers[0].self_attn.attention_probabilities.save()
    assert not torch.equal(pa, pb) and pg.shape[1] == g.num_heads
    for m in (a, b, g):
        assert_clean(m)


def test_threads_one_after_another_and_concurrently(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    results: dict[str, torch.Tensor] = {}

    def run(name: str) -> None:
        with llama.trace(inputs):
            results[name] = llama.layers[2].layer_output.save()

    for name in ("first", "second"):
        t = threading.Thread(target=run, args=(name,))
        t.start()
        t.join()
    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6
    for r in results.values():
        assert torch.equal(r, results["first"])
    assert_clean(llama)


def test_trace_inputs(llama: nnatlas.AtlasModel) -> None:
    with llama.trace(testing.PROMPT):
        one = llama.input_ids.save()
    with llama.trace([testing.PROMPT, "the tower"]):
        ids = llama.input_ids.save()
        mask = llama.attention_mask.save()
        size = llama.input_size.save()
    assert ids.shape == mask.shape == (2, one.shape[1]) and list(size) == [2, one.shape[1]]
    assert mask[1, 0] == 0 and mask[1, -1] == 1  # left padding
    with llama.trace(one[0]):
        again = llama.logits.save()
    with llama.trace({"input_ids": one}):
        dict_in = llama.logits.save()
    assert torch.equal(again, dict_in)


def test_printout_and_support(llama: nnatlas.AtlasModel) -> None:
    text = str(llama)
    assert text.startswith("LlamaForCausalLM(")
    assert "(layers): ModuleList(" in text and "(0-2): 3 x LlamaDecoderLayer(" in text
    assert "(attention_queries) -> Queries [batch num_heads seq qk_head_dim]: The queries entering attention" in text
    assert "(input_size): [batch, seq] of the current call; read-only" in text
    gpt2 = testing.build("gpt2")
    assert "(layers/h): ModuleList(" in str(gpt2) and "(self_attn/attn): GPT2Attention(" in str(gpt2)
    sdpa = testing.build("llama", attn_implementation="sdpa")
    table = sdpa.support()
    assert ("layers[0].self_attn", "attention_probabilities") in table.available()
    assert "(conditional: read in eager attention, recomputed under sdpa" in repr(table)
    falcon = testing.build("falcon", attn_implementation="sdpa")  # its own sdpa call (recompute: sdpa)
    table = falcon.support()
    assert ("layers[0].self_attn", "attention_probabilities") in table.available()
    assert "(conditional: read at eager's softmax, recomputed under sdpa from the forward's " \
        "scaled_dot_product_attention call; an edit needs attn_implementation='eager')" in repr(table)


def test_load_round_trip(tmp_path, llama: nnatlas.AtlasModel, inputs: dict) -> None:
    llama.native.save_pretrained(tmp_path)
    llama.tokenizer.save_pretrained(tmp_path)
    loaded = nnatlas.load(str(tmp_path), attn_implementation="eager")
    assert loaded.family == "llama" and loaded.tokenizer is not None
    with loaded.trace(inputs):
        a = loaded.logits.save()
    with llama.trace(inputs):
        b = llama.logits.save()
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(NnatlasError, match="task"):
        nnatlas.load(str(tmp_path), task="summarization")


def test_generate_records_every_step(llama: nnatlas.AtlasModel) -> None:
    with llama.generate(testing.PROMPT, max_new_tokens=3) as tracer:
        steps = []
        for _ in tracer.iter[:]:
            steps.append(llama.next_token_probs.save())
    prompt_len = len(testing.PROMPT.split())
    assert tracer.output.shape[1] == prompt_len + 3
    chosen = [int(p.argmax(-1)) for p in steps]
    assert chosen == tracer.output[0, prompt_len:].tolist()
    assert_clean(llama)


def test_handles_are_made_once_and_follow_a_replaced_module(inputs: dict) -> None:
    """Hosts and value handles are cached (the next lookup is a dict hit), but a native submodule
    replaced after wrapping gets a new host, and reads land on the module that now runs."""
    model = testing.build("llama", attn_implementation="eager", seed=4)
    assert model.layers[1] is model.layers[1]
    assert model.layers[1].mlp is model.layers[1].mlp
    assert model.layers[1].mlp.mlp_output is model.layers[1].mlp.mlp_output
    old_layer, old_mlp = model.layers[1], model.layers[1].mlp
    native = model.native.model.layers[1]
    native.mlp = type(native.mlp)(model.config)  # a fresh MLP (other weights) in place of the old one
    model.native.model.layers[0] = type(native)(model.config, 0)
    assert model.layers[1] is old_layer and model.layers[1].mlp is not old_mlp
    assert model.layers[1].mlp._module is native.mlp and model.layers[0]._module is model.native.model.layers[0]
    seen = {}
    handle = native.mlp.register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    try:
        with model.trace(inputs):
            first = model.layers[0].layer_output.save()
            out = model.layers[1].mlp.mlp_output.save()
    finally:
        handle.remove()
    assert out.data_ptr() == seen["out"].data_ptr()
    assert first.shape == (*inputs["input_ids"].shape, model.hidden_size)
    assert hook_count(model) == 0


def test_boundary_sites_wrap_the_instance_forward_and_put_it_back(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    """Module boundaries are served from a wrapper on the instance's ``forward`` (not a forward hook):
    a forward already on the instance (accelerate puts one there) runs inside it and is restored."""
    mlp = llama.native.model.layers[0].mlp
    calls = []
    original = mlp.forward

    def own(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    mlp.forward = own
    try:
        with llama.trace(inputs):
            x = llama.layers[0].mlp_input.save()
            out = llama.layers[0].mlp.mlp_output.save()
        assert mlp.__dict__["forward"] is own and calls == [1]
        with torch.no_grad():
            torch.testing.assert_close(mlp(x), out, atol=0, rtol=0)
    finally:
        del mlp.forward
    assert "forward" not in mlp.__dict__ and hook_count(llama) == 0
    assert_clean(llama)


def test_a_plain_forward_in_another_thread_is_not_the_traces(llama: nnatlas.AtlasModel, inputs: dict) -> None:
    """A trace instruments the shared modules only for its own forward: plain forwards of the same
    model in another thread meanwhile neither see its edits nor feed its saves."""
    with torch.no_grad():
        baseline = llama.native(**inputs).logits.clone()
    stop = threading.Event()
    plain_results: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def plain_forwards() -> None:
        try:
            while not stop.is_set():
                with torch.no_grad():
                    plain_results.append(llama.native(**inputs).logits)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    worker = threading.Thread(target=plain_forwards)
    worker.start()
    try:
        saved = []
        for _ in range(20):
            with llama.trace(inputs):
                llama.layers[1].self_attn.attention_scores[:] = 0
                llama.layers[1].layer_output[:] = 0
                saved.append(llama.layers[2].layer_input.save())
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert plain_results and all(torch.equal(r, baseline) for r in plain_results)
    assert all(torch.count_nonzero(s) == 0 for s in saved)
    assert_clean(llama)


def test_an_augmented_edit_of_an_indexed_value_reaches_the_model() -> None:
    """``v[:, -1] += x`` indexes with a slice (unhashable before Python 3.12): its target is resolved without
    the cache of targets instead of raising TypeError, in a trace and on every step of generate."""
    model = testing.build("llama", seed=2)
    d = torch.ones(model.hidden_size)
    with model.trace(testing.PROMPT):
        base = model.layers[1].layer_output.save()
    with model.trace(testing.PROMPT):
        model.layers[1].layer_output[:, -1] += 4 * d
        out = model.layers[1].layer_output.save()
    torch.testing.assert_close(out[:, :-1], base[:, :-1], rtol=0, atol=0)
    torch.testing.assert_close(out[:, -1], base[:, -1] + 4, rtol=0, atol=0)
    with model.generate(testing.PROMPT, max_new_tokens=2) as tracer:
        for _ in tracer.iter[:]:
            model.layers[1].layer_output[:, -1] += 4 * d
    assert tracer.output.shape[1] == len(testing.PROMPT.split()) + 2


def test_an_edit_expression_that_fails_is_one_input_error_naming_the_value() -> None:
    """torch's own error inside an edit's expression (shapes that do not broadcast) is an InputError that names
    the value it computes and the shapes, and the trace leaves nothing behind."""
    model = testing.build("llama", seed=2)
    with pytest.raises(nnatlas.InputError, match=r"layers\[2\]\.mlp\.mlp_output: the expression it is computed from "
                                                 r"failed on tensors of shapes \[1, \d+, 16\], \[2\]: RuntimeError"):
        with model.trace(testing.PROMPT):
            model.layers[2].mlp.mlp_output = model.layers[0].layer_output * torch.ones(2)
    assert_clean(model)
    with model.trace(testing.PROMPT):  # and the model traces again
        out = model.logits.save()
    assert out.isfinite().all()
