"""Golden error messages: a broken spec names file:line:col for every problem, and writes nothing."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from nnatlas.compiler import SpecError, compile_atlas, generate


def errors(root: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        compile_atlas(root / "specs", root)
    return str(info.value).splitlines()


def edit(root: Path, name: str, old: str, new: str) -> None:
    path = root / "specs" / name
    text = path.read_text()
    assert old in text, f"{old!r} not in {name}"
    path.write_text(text.replace(old, new, 1))


def line_of(root: Path, name: str, needle: str) -> int:
    for n, line in enumerate((root / "specs" / name).read_text().splitlines(), 1):
        if needle in line:
            return n
    raise AssertionError(needle)


def test_value_name_typo(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", "      layer_mid: post_attention_layernorm.input", "      layr_mid: post_attention_layernorm.input")
    n = line_of(spec_root, "llama.yaml", "layr_mid")
    assert errors(spec_root) == [f"specs/llama.yaml:{n}:7: unknown value 'layr_mid'; did you mean 'layer_mid'? A new "
                                 "standard value is declared once in specs/_vocabulary.yaml, under values:, with its "
                                 "layout and its one-line meaning"]


def test_unknown_layout_and_dim(spec_root: Path) -> None:
    edit(spec_root, "_vocabulary.yaml", "  Neurons: {dims: batch seq intermediate_size}", "  Neurons: {dims: batch seq intermediate}")
    edit(spec_root, "_vocabulary.yaml", "    layout: Residual\n    meaning: The residual stream entering the block",
         "    layout: Residul\n    meaning: The residual stream entering the block")
    n1 = line_of(spec_root, "_vocabulary.yaml", "Neurons: {dims")
    c1 = (spec_root / "specs" / "_vocabulary.yaml").read_text().splitlines()[n1 - 1].index("intermediate") + 1
    n2 = line_of(spec_root, "_vocabulary.yaml", "layout: Residul")
    assert errors(spec_root) == [
        f"specs/_vocabulary.yaml:{n1}:{c1}: layout Neurons: unknown dim 'intermediate'; did you mean 'intermediate_size'?",
        f"specs/_vocabulary.yaml:{n2}:13: value layer_input: unknown layout 'Residul'; did you mean 'Residual'?",
    ]


def test_identity_term_names_nothing(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "      - mlp_neurons == mlp_activation\n", "      - mlp_neurons == mlp_activaton\n")
    n = line_of(spec_root, "gpt2.yaml", "mlp_activaton")
    assert errors(spec_root) == [
        f"specs/gpt2.yaml:{n}:9: identity term 'mlp_activaton' names nothing on host layers[i].mlp; did you mean 'mlp_activation'?"]


def test_duplicate_key_tab_and_unknown_key_all_reported(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", "title: Llama\n", "title: Llama\ntitle: Llama again\n")
    edit(spec_root, "gpt2.yaml", "title: GPT-2\n", "title: GPT-2\ncolour: blue\n")
    (spec_root / "specs" / "broken.yaml").write_text("family: broken\nhosts:\n\tmodel: {}\n")
    got = errors(spec_root)
    assert got == [
        "specs/broken.yaml:3:1: tab in indentation; indent with spaces",
        "specs/gpt2.yaml:3:1: unknown key 'colour'",
        "specs/llama.yaml:3:1: duplicate key 'title' (first at line 2)",
    ]


def test_alias_bomb_is_refused_without_expansion(spec_root: Path) -> None:
    bomb = ["family: bomb", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        bomb.append(f"{cur}: &{cur} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
    (spec_root / "specs" / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    got = errors(spec_root)
    assert got[0] == ("specs/bomb.yaml:2:4: anchor 'a': anchors and aliases are not allowed in specs: each entry must "
                      "stand on the line that an error or a page points to. Share between families with extends: (or "
                      "a part under specs/parts/), else write the entry again")
    assert all(line.startswith("specs/bomb.yaml:") for line in got)


def test_non_mapping_document_and_extends_itself(spec_root: Path) -> None:
    (spec_root / "specs" / "listy.yaml").write_text("- family: listy\n")
    edit(spec_root, "gpt2.yaml", "family: gpt2\n", "family: gpt2\nextends: gpt2\n")
    assert errors(spec_root) == [
        "specs/gpt2.yaml:2:10: extends cycle: gpt2 -> gpt2",
        "specs/listy.yaml:1:1: a spec must be a mapping of keys to values",
    ]


def test_bad_read_point_view_and_condition(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", "attention_queries: call:attention.args[1]", "attention_queries: call:atention.args[1]")
    edit(spec_root, "llama.yaml", 'view: "unflatten(-1, [num_heads, head_dim])"', 'view: "unflatten(-1, [num_head, head_dim])"')
    edit(spec_root, "llama.yaml", 'needs: eager}\n      attention_probabilities', 'needs: eagr}\n      attention_probabilities')
    got = errors(spec_root)
    assert len(got) == 3
    assert "attention_queries: unknown interface call in 'call:atention.args[1]' (known: call:attention, call:experts)" in got[0]
    assert "attention_scores: unknown condition 'eagr'; did you mean 'eager'?" in got[1]
    assert "attention_premix: view names 'num_head', which is not a config entry nor a call dim (batch, seq); did you mean 'num_heads'?" in got[2]


def test_identity_grammar_refuses_code(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "      - mlp_neurons == mlp_activation\n", "      - __import__('os').system('true') == 0\n")
    got = errors(spec_root)
    assert len(got) == 1 and "identity: only named functions may be called (no methods)" in got[0]


def digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "generated").rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_broken_generate_leaves_generated_untouched(spec_root: Path) -> None:
    before = digest(spec_root)
    edit(spec_root, "llama.yaml", "summary: >", "summary: >\n  changed and\n")  # a change that would rewrite files
    edit(spec_root, "gpt2.yaml", "      layer_input: input\n", "      layer_inptu: input\n")  # and an error
    with pytest.raises(SpecError):
        generate(spec_root)
    assert digest(spec_root) == before


def test_cli_exit_status_2_lists_every_problem(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", "      layer_mid:", "      layr_mid:")
    edit(spec_root, "gpt2.yaml", "      layer_mid:", "      layr_mid:")
    proc = subprocess.run([sys.executable, "-m", "nnatlas.compiler.cli", "generate", "--root", str(spec_root)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("specs/gpt2.yaml:") and lines[1].startswith("specs/llama.yaml:")
    assert lines[-1] == "nnatlas: 2 problems in the specs; nothing was written"


def test_recompute_sdpa_misused(spec_root: Path) -> None:
    """``recompute: sdpa`` takes only 'sdpa', only on eager's softmax in the host's own forward, only on a
    value that needs eager; each misuse names file:line:col of the value it was given."""
    edit(spec_root, "falcon.yaml", '{read: "op:softmax.input[0]", needs: eager, recompute: sdpa}',
         '{read: "op:softmax.input[0]", recompute: sdpa}')
    edit(spec_root, "falcon.yaml", '{read: "op:softmax.output", needs: eager, recompute: sdpa}',
         '{read: "op:softmax.output", needs: eager, recompute: flex}')
    edit(spec_root, "llama.yaml", '{read: "call:attention > op:softmax.input[0]", needs: eager}',
         '{read: "call:attention > op:softmax.input[0]", needs: eager, recompute: sdpa}')
    edit(spec_root, "gpt2.yaml", "      mlp_neurons: down_proj.input\n",
         "      mlp_neurons: {read: down_proj.input, needs: eager, recompute: sdpa}\n")

    def at(name: str, needle: str, value: str) -> str:
        n = line_of(spec_root, name, needle)
        c = (spec_root / "specs" / name).read_text().splitlines()[n - 1].index("recompute: ") + len("recompute: ") + 1
        return f"specs/{name}:{n}:{c}: {value}"  # the column of the key's value

    got = errors(spec_root)
    assert at("falcon.yaml", "recompute: flex", "attention_probabilities: recompute takes 'sdpa' (the load "
                        "under which the host's forward calls scaled_dot_product_attention in place of eager's "
                        "softmax), not 'flex'") in got
    assert at("falcon.yaml", "recompute: sdpa", "attention_scores: recompute: sdpa recomputes what only eager attention "
              "forms: the value needs eager ('needs: eager')") in got
    assert at("gpt2.yaml", "recompute: sdpa", "mlp_neurons: recompute: sdpa stands for eager's softmax in the host's "
              "own forward: read op:softmax.input[0] (the scores) or op:softmax.output (the probabilities)") in got
    assert at("llama.yaml", "recompute: sdpa", "attention_scores: recompute: sdpa stands for eager's softmax in the "
              "host's own forward: read op:softmax.input[0] (the scores) or op:softmax.output (the probabilities); "
              "a read inside eager attention (call:attention > op:...) is recomputed without it") in got


def test_a_new_module_name_is_a_choice_not_an_accident(spec_root: Path) -> None:
    """A host or rename key named outside the vocabulary's modules: (self_attn_2, dense_mlp) is refused with
    the nearest standard name, and says where a new one is declared."""
    edit(spec_root, "llama.yaml", "  layers[i].mlp:\n", "  layers[i].self_attn_2: {class: LlamaAttention}\n  layers[i].mlp:\n")
    edit(spec_root, "llama.yaml", "  lm_head: lm_head\n", "  lm_head: lm_head\n  dense_mlp: model.dense\n")
    n1 = line_of(spec_root, "llama.yaml", "dense_mlp")
    n2 = line_of(spec_root, "llama.yaml", "self_attn_2")
    tail = " A new module name is declared once in specs/_vocabulary.yaml, under modules:, with its one-line meaning " \
           "(what any family's module of that name is), or for this family alone under modules: in its spec"
    got = errors(spec_root)
    assert f"specs/llama.yaml:{n1}:3: rename key 'dense_mlp': 'dense_mlp' is not a standard module name." + tail in got
    assert f"specs/llama.yaml:{n2}:3: host 'layers[i].self_attn_2': 'self_attn_2' is not a standard module name; " \
           "did you mean 'self_attn'?" + tail in got
    # declared in the family's own spec, the same names are a choice of that family, and both problems are gone
    edit(spec_root, "llama.yaml", "rename:\n", "modules:\n  self_attn_2: a second attention\n  dense_mlp: a dense MLP\n"
                                               "rename:\n")
    assert not [e for e in _errors_or_none(spec_root) if "standard module name" in e]


def _errors_or_none(root: Path) -> list[str]:
    try:
        compile_atlas(root / "specs", root)
    except SpecError as e:
        return str(e).splitlines()
    return []


def test_a_kind_value_that_the_host_also_reads_is_refused(spec_root: Path) -> None:
    """A value read on a host and again on one of its kinds was two reads of one name, one served by accident
    of order: both kinds of glm4_moe's MLP say so, naming the host's line."""
    edit(spec_root, "glm4_moe.yaml", "    values:\n      mlp_activation: null\n", "    values:\n      mlp_activation: act_fn.output\n")
    host = line_of(spec_root, "glm4_moe.yaml", "mlp_activation: act_fn.output")
    lines = (spec_root / "specs" / "glm4_moe.yaml").read_text().splitlines()
    kinds = [n for n, text in enumerate(lines, 1) if text.startswith("          mlp_activation:")]
    assert len(kinds) == 2
    tail = (f"value 'mlp_activation' is read on the host too (specs/glm4_moe.yaml:{host}); a kind's read does not "
            "replace the host's: set 'mlp_activation: null' on the host and give every kind its own read, or drop it here")
    got = errors(spec_root)
    assert f"specs/glm4_moe.yaml:{kinds[0]}:11: kind 'moe' of host 'layers[i].mlp': " + tail in got
    assert f"specs/glm4_moe.yaml:{kinds[1]}:11: kind 'dense' of host 'layers[i].mlp': " + tail in got


def test_a_layout_dim_no_config_entry_sizes_is_named_at_compile(spec_root: Path) -> None:
    """Without the config entry that sizes a layout's dim, the generated tests died on a bare KeyError; now the
    compiler names every value whose layout needs it."""
    edit(spec_root, "qwen3_5_text.yaml", "  key_dim: linear_key_head_dim\n", "")
    got = [e for e in errors(spec_root) if e.startswith("specs/qwen3_5_text.yaml:")]
    assert got and all("has 'key_dim', which is not a config entry of this family nor sized by the call's inputs: "
                       "add it under config:" in e for e in got), got
    assert {e.split(": ")[1] for e in got} >= {"attention_queries", "attention_keys", "state_output"}, got


def test_the_kth_call_of_an_interface_is_a_number(spec_root: Path) -> None:
    """call:NAME#K reads the K-th call of an interface (DiffLlama's second attention call); a K that is no number
    is one error at the read, saying how to write it."""
    edit(spec_root, "diffllama.yaml", '      second_values: "call:attention#1.args[3]"',
         '      second_values: "call:attention#one.args[3]"')
    n = line_of(spec_root, "diffllama.yaml", "call:attention#one")
    col = (spec_root / "specs" / "diffllama.yaml").read_text().splitlines()[n - 1].index("#one")  # at the #
    assert errors(spec_root) == [
        f"specs/diffllama.yaml:{n}:{col}: second_values: 'call:attention#one.args[3]': the K-th call of an interface "
        "is call:attention#K, K a number (#0 the first call, #1 the second)"]
