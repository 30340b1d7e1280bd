"""A spec is data: thousands of hostile specs each give a SpecError or a clean compile whose
Python parses and imports without doing anything else.

Each example mutates a small, complete family (its own vocabulary, every section a family has)
with hypothesis: code and odd text injected into every key and every string, deep nesting, huge,
NaN and infinite numbers, long strings, values of the wrong type. It is compiled in memory; on
success the adapter and its test module are rendered, parsed, and executed as modules, and the
process must show no trace of a payload (an environment variable, a file, a new import).
"""

from __future__ import annotations

import ast
import copy
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest  # noqa: F401 - the generated test module imports it: imported before the examples
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nnatlas.families  # noqa: F401 - imported before the examples, so an import they cause shows
import nnatlas.model  # noqa: F401
import nnatlas.spec  # noqa: F401
import nnatlas.testing  # noqa: F401
import nnatlas.trace.expressions  # noqa: F401
from nnatlas.compiler import SpecError, compile_texts, render
from nnatlas.compiler.emit.pycheck import check_adapter

FAMILY = "fuzzfam"
SENTINEL = Path(os.environ.get("TMPDIR", "/tmp")) / f"nnatlas-fuzz-sentinel-{os.getpid()}"
ENV = "NNATLAS_FUZZ_PWNED"

VOCABULARY = """\
dims:
  batch: the sequences
  seq: the positions
  hidden_size: the stream's width
  num_heads: the heads
  head_dim: a head's width
layouts:
  Residual: {dims: batch seq hidden_size}
  Heads: {dims: batch seq num_heads head_dim}
  Tokens: {dims: batch seq, dtype: long}
  Size: {dims: "", dtype: object}
values:
  input_ids: {layout: Tokens, meaning: the token ids}
  input_size: {layout: Size, meaning: the input's shape}
  layer_input: {layout: Residual, meaning: the block's input}
  layer_output: {layout: Residual, meaning: the block's output}
  attention_output: {layout: Residual, meaning: what attention adds}
  attention_premix: {layout: Heads, meaning: each head's output}
conditions:
  eager:
    says: needs eager attention
    fix: load with attn_implementation="eager"
traits:
  Tiny: a test trait
modules:
  layers: the blocks
  self_attn: a block's attention
"""

SPEC = """\
family: fuzzfam
title: Fuzz
lines: [Fuzz One, Fuzz Two]
summary: A small family every mutation starts from.
traits: [Tiny]
loads:
  model_types: [llama]
  classes: [LlamaForCausalLM]
rename:
  layers: model.layers
  layers[i].self_attn: self_attn
config:
  num_layers: num_hidden_layers
  hidden_size: hidden_size
  num_heads: num_attention_heads
  num_kv_heads: num_key_value_heads
  head_dim: head_dim or hidden_size // num_attention_heads
  qk_head_dim: head_dim
  vocab_size: vocab_size
  intermediate_size: intermediate_size
  image_size: {unavailable: "no images"}
functions:
  delta_rule:
    names: [torch_chunk_gated_delta_rule]
    words: the kernel
    route: {torch: torch_recurrent_gated_delta_rule, seq_dim: 1, state_arg: initial_state, state_output: 1}
hosts:
  model:
    class: LlamaForCausalLM
    values:
      input_ids: input.input_ids
      input_size: {derived: "shape(input_ids)"}
  layers[i]:
    class: LlamaDecoderLayer
    when: "i < num_layers"
    values:
      layer_input: input
      layer_output: output
    identities:
      - layer_input + self_attn.attention_output == layer_output
      - {check: "layer_output == layer_output", atol: 1.0e-5, rtol: 0}
  layers[i].self_attn:
    class: LlamaAttention
    values:
      attention_premix: {read: o_proj.input, view: "unflatten(-1, [num_heads, head_dim])", needs: eager}
      attention_output: output[0]
tiny:
  model_class: LlamaForCausalLM
  config_class: LlamaConfig
  config: {vocab_size: 96, rms_norm_eps: 1.0e-6, tie_word_embeddings: false}
  draw:
    num_hidden_layers: [1, 2]
    num_attention_heads: [2, 4]
    head_dim: [4, 8]
    hidden_size: num_attention_heads * head_dim
    intermediate_size: [16]
  batch: [1, 2]
  seq: [1, 4]
  examples: 3
checkpoints:
  - name: org/fuzz-1b
    config: {model_type: llama, hidden_size: 64, num_hidden_layers: 2, layer_types: [a, b]}
notes:
  - title: A note
    body: |
      Text.

      ```python
      x = 1
      ```
diagram:
  block: [self_attn, add, mixer]
docstring: The fuzz family.
"""

# code and near-code: each would run, or break the generated Python, if it were written as code
SET_ENV = f"getattr(getattr(__import__('os'), 'environ'), 'setdefault')('{ENV}', '1')"  # no '.', no '['
PAYLOADS = [
    f"zz = {SET_ENV}; yy",
    f"x(c: Any) -> Any:\n    return {SET_ENV}\n\n\ndef y",
    f"X(Host):\n    pass\n\n\n{SET_ENV}\n\n\nclass Y",
    f"x = __import__('os').environ.setdefault('{ENV}', '1'); y",
    f"__import__('os').environ.setdefault('{ENV}', '1')",
    f"\nimport os; os.environ['{ENV}'] = '1'\n",
    f"a: int = open({str(SENTINEL)!r}, 'w'); b",
    f"{ENV}\"\"\"; import os; os.environ['{ENV}']='1'; '''",
    "GPT2Block\\", "vocab-size", "class", "None", "True", "match", "__class__", "__init__", "_", "a b", "a.b",
    "layers[i]", "a[0]", "", " ", "é", "x²", "١", "Ａ", "a\x00b", "a\tb", "{{ x }}", "{% raw %}", "'", '"', "\\", "\\N",
    "x" * 150, "layers[i].__class__", "op:softmax#99999999999.output", "call:attention.args[99999999999999999999]",
    "unflatten(-1e309, [num_heads, head_dim])", "unflatten(-1.5, [a, b])", "2 ** 10 ** 10", "'x' * 10 ** 9",
    "1e309", "-" * 3 + "1", "(" * 300 + "a" + ")" * 300, "a" + " + a" * 400, "sigmoid(" * 60 + "a" + ")" * 60,
    "lambda: 0", "[x for x in ()]", "__import__('os')", "().__class__.__bases__[0].__subclasses__()",
]
NUMBERS = [float("inf"), float("-inf"), float("nan"), 10**30, -(10**30), 2**53 + 1, 1e308, -1e-320, 0, -1, 10**6]


def nested(depth: int, leaf: Any, mapping: bool) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf} if mapping else [leaf]
    return leaf


def odd_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(PAYLOADS),
        st.sampled_from(NUMBERS),
        st.builds(nested, st.integers(1, 80), st.sampled_from(PAYLOADS[:3] + [1, None]), st.booleans()),
        st.builds(lambda n, c: c * n, st.sampled_from([1_000, 25_000]), st.sampled_from(["a", "é", "\\"])),
        st.none(), st.booleans(), st.integers(-5, 5), st.lists(st.sampled_from(PAYLOADS), max_size=2),
        st.dictionaries(st.sampled_from(PAYLOADS), st.sampled_from(PAYLOADS), max_size=2),
        st.text(max_size=8),
    )


def paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*path, i))
    return out


def mutate(doc: Any, data: st.DataObject, keys: bool) -> None:
    """One mutation: rename a key to a payload (``keys``), or replace a value with something odd."""
    candidates = [p for p in paths(doc) if p]
    path = data.draw(st.sampled_from(candidates))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if keys and isinstance(parent, dict):
        new_key = data.draw(st.sampled_from(PAYLOADS))
        items = [(new_key if k == path[-1] else k, v) for k, v in parent.items()]
        parent.clear()
        parent.update(items)
    else:
        parent[path[-1]] = data.draw(odd_values())


DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=DUMPER, sort_keys=False, allow_unicode=True, width=10**6)


BASE = {"_vocabulary.yaml": yaml.safe_load(VOCABULARY), f"{FAMILY}.yaml": yaml.safe_load(SPEC)}
BASE_TEXTS = {name: dump(doc) for name, doc in BASE.items()}


def compile_and_import(texts: dict[str, str], baseline: bool = False) -> str:
    """'error' (a SpecError) or 'ok' (compiled, parsed, imported, nothing else happened). Nothing else:
    no module imported beyond those the base spec's adapter and tests import (loaded first, once:
    ``baseline``), whatever ran before in the session."""
    if not baseline and not WARM:
        WARM.append(compile_and_import(BASE_TEXTS, baseline=True))
    try:
        atlas = compile_texts(texts)
    except SpecError as e:
        assert e.problems
        for p in e.problems:
            assert p.file.startswith("specs/") and p.line >= 1 and p.col >= 1 and p.message, p
        return "error"
    (f,) = [x for x in atlas.families if x.name == FAMILY]
    LAST["module"] = None
    rendered = render(atlas)  # every file: pages and index too
    adapter_src, tests_src = rendered[f"generated/families/{FAMILY}.py"], rendered[f"generated/tests/test_{FAMILY}.py"]
    check_adapter(f"generated/families/{FAMILY}.py", adapter_src)  # what generate checks before it writes or runs
    ast.parse(tests_src)
    name = f"nnatlas.families.{FAMILY}"
    modules = set(sys.modules)
    adapter = types.ModuleType(name)
    exec(compile(adapter_src, f"<{name}>", "exec"), adapter.__dict__)
    sys.modules[name] = adapter
    try:
        tests = types.ModuleType(f"test_{FAMILY}")
        exec(compile(tests_src, f"<test_{FAMILY}>", "exec"), tests.__dict__)
    finally:
        del sys.modules[name]
    assert adapter.FAMILY.name == FAMILY and callable(tests.test_native_classes)
    LAST["module"] = adapter
    if not baseline:
        assert set(sys.modules) <= modules | {name}, f"importing the adapter imported {set(sys.modules) - modules}"
    return "ok"


LAST: dict[str, Any] = {}
WARM: list[str] = []  # the base spec, imported once before the first check


def run(doc_mutations: int, data: st.DataObject, keys: bool, vocabulary: bool) -> None:
    docs = copy.deepcopy(BASE)
    target = "_vocabulary.yaml" if vocabulary else f"{FAMILY}.yaml"
    for _ in range(doc_mutations):
        mutate(docs[target], data, keys)
    texts = dict(BASE_TEXTS)
    try:
        texts[target] = dump(docs[target])
    except (yaml.YAMLError, RecursionError):  # nested too deep for PyYAML's own dumper: write it by hand
        texts[target] += "deep: " + "[" * 1000 + "]" * 1000 + "\n"
    compile_and_import(texts)
    assert_no_payload_ran()


def assert_no_payload_ran() -> None:
    """No payload's trace (taken away, so that one failure does not fail the next examples)."""
    ran = os.environ.pop(ENV, None) is not None
    if SENTINEL.exists():
        SENTINEL.unlink()
        ran = True
    assert not ran, "a spec ran code"


SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.nested_given])


def test_the_base_spec_compiles_and_imports() -> None:
    assert compile_and_import(BASE_TEXTS) == "ok"


@SETTINGS
@given(st.integers(1, 3), st.data())
def test_keys_of_the_family(n: int, data: st.DataObject) -> None:
    run(n, data, keys=True, vocabulary=False)


@SETTINGS
@given(st.integers(1, 3), st.data())
def test_values_of_the_family(n: int, data: st.DataObject) -> None:
    run(n, data, keys=False, vocabulary=False)


@settings(SETTINGS, max_examples=225)
@given(st.integers(1, 2), st.data(), st.booleans())
def test_keys_and_values_of_the_vocabulary(n: int, data: st.DataObject, keys: bool) -> None:
    run(n, data, keys=keys, vocabulary=True)


@settings(SETTINGS, max_examples=200)
@given(st.data())
def test_one_payload_in_every_string_at_once(data: st.DataObject) -> None:
    """Every string of the family (keys too) replaced by the same payload, and each alone."""
    payload = data.draw(st.sampled_from(PAYLOADS))
    doc = copy.deepcopy(BASE[f"{FAMILY}.yaml"])
    strings = [p for p in paths(doc) if p and isinstance(_at(doc, p), str)]
    chosen = data.draw(st.lists(st.sampled_from(strings), min_size=1, max_size=len(strings), unique=True))
    for p in chosen:
        _at(doc, p[:-1])[p[-1]] = payload
    texts = {"_vocabulary.yaml": BASE_TEXTS["_vocabulary.yaml"], f"{FAMILY}.yaml": dump(doc)}
    compile_and_import(texts)
    assert_no_payload_ran()


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


TEXT = [("title",), ("summary",), ("lines", 1), ("docstring",), ("notes", 0, "title"), ("functions", "delta_rule", "words"),
        ("checkpoints", 0, "name"), ("config", "image_size", "unavailable"), ("tiny", "config", "rms_norm_eps")]
VOCABULARY_TEXT = [("values", "layer_input", "meaning"), ("conditions", "eager", "says"), ("conditions", "eager", "fix"),
                   ("traits", "Tiny"), ("dims", "batch")]
TEXT_PAYLOADS = [p for p in PAYLOADS if p.strip()]


@settings(SETTINGS, max_examples=150)
@given(st.sampled_from([(False, p) for p in TEXT] + [(True, p) for p in VOCABULARY_TEXT]),
       st.lists(st.sampled_from(TEXT_PAYLOADS), min_size=1, max_size=3))
def test_payloads_in_text_compile_and_stay_text(where: tuple[bool, tuple[Any, ...]], payloads: list[str]) -> None:
    """Free text (titles, meanings, reasons, config values) takes any payload and keeps it as data."""
    vocabulary, path = where
    docs = copy.deepcopy(BASE)
    doc = docs["_vocabulary.yaml" if vocabulary else f"{FAMILY}.yaml"]
    text = " ".join(payloads)
    _at(doc, path[:-1])[path[-1]] = text
    assert compile_and_import({name: dump(d) for name, d in docs.items()}) == "ok"
    assert_no_payload_ran()
    family = LAST["module"].FAMILY
    if path == ("title",):
        assert family.title == text
    if path == ("lines", 1):
        assert family.lines[1] == text
    if path == ("tiny", "config", "rms_norm_eps"):
        assert LAST["module"].TINY["config"]["rms_norm_eps"] == text
