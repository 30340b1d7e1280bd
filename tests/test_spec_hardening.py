"""Hostile specs, one reproducer each: every one is a SpecError at its file:line:col, nothing runs,
nothing is written; and what the compiler writes is parsed before it is written or run."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest

from nnatlas.compiler import GenerateError, SpecError, compile_atlas, generate
from nnatlas.compiler.cli import main
from nnatlas.compiler.emit import emit, pages, pysource
from nnatlas.compiler.language import expr


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


def digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "generated").rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_a_rename_key_that_is_code_is_refused_and_runs_nothing(spec_root: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "x"
    payload = f"zz = getattr(__import__('os'), 'system')('touch {marker}'); yy"
    edit(spec_root, "gpt2.yaml", "  lm_head: lm_head\n", f'  lm_head: lm_head\n  "{payload}": lm_head\n')
    before = digest(spec_root)
    assert main(["generate", "--root", str(spec_root)]) == 2
    assert not marker.exists()
    assert digest(spec_root) == before
    n = line_of(spec_root, "gpt2.yaml", "zz = getattr")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"specs/gpt2.yaml:{n}:3: rename key \"zz = getattr(__import__('os'), 'syste...\" is not a name "
                      "(letters, digits and _, not starting with a digit)")
    assert err[-1] == "nnatlas: 1 problem in the specs; nothing was written"


def test_a_host_class_with_a_backslash_and_a_config_key_with_a_dash(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "    class: GPT2Block\n", '    class: "GPT2Block\\\\"\n')
    edit(spec_root, "gpt2.yaml", "  vocab_size: vocab_size\n", "  vocab_size: vocab_size\n  vocab-size: vocab_size\n")
    n1 = line_of(spec_root, "gpt2.yaml", 'class: "GPT2Block')
    n2 = line_of(spec_root, "gpt2.yaml", "vocab-size")
    assert errors(spec_root) == [
        f"specs/gpt2.yaml:{n2}:3: config key 'vocab-size' is not a name (letters, digits and _, not starting with a digit)",
        f"specs/gpt2.yaml:{n1}:12: class 'GPT2Block\\\\' is not a name (letters, digits and _, not starting with a digit)",
    ]


def test_a_vocabulary_name_that_is_a_keyword(spec_root: Path) -> None:
    edit(spec_root, "_vocabulary.yaml", "  batch: the sequences in the call\n", "  batch: the sequences in the call\n  lambda: x\n")
    edit(spec_root, "_vocabulary.yaml", "layouts:\n", "layouts:\n  __dict__: {dims: batch}\n")
    assert errors(spec_root) == [
        f"specs/_vocabulary.yaml:{line_of(spec_root, '_vocabulary.yaml', 'lambda: x')}:3: dim name 'lambda' is a Python keyword",
        f"specs/_vocabulary.yaml:{line_of(spec_root, '_vocabulary.yaml', '__dict__')}:3: layout name '__dict__' starts "
        "with '__' (reserved for Python's own names)"]


def test_keywords_dunders_and_clashing_class_names(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "  layers[i].self_attn: attn\n",
         "  layers[i].self_attn: attn\n  layers[i].class: attn\n  layer: transformer.__class__\n")
    edit(spec_root, "gpt2.yaml", "  num_layers: n_layer\n", "  num_layers: n_layer\n  __init__: n_layer\n  None: n_layer\n")
    edit(spec_root, "gpt2.yaml", "hosts:\n", "hosts:\n  layer[i].self_attn:\n    class: GPT2Attention\n")
    got = errors(spec_root)
    expected = [
        ("gpt2.yaml", "layers[i].class: attn", 3, "rename key 'layers[i].class': part 'class' is a Python keyword"),
        ("gpt2.yaml", "layer: transformer.__class__", 10,
         "native path 'transformer.__class__': part '__class__' starts with '__' (reserved for Python's own names)"),
        ("gpt2.yaml", "__init__: n_layer", 3, "config key '__init__' starts with '__' (reserved for Python's own names)"),
        ("gpt2.yaml", "None: n_layer", 3, "config key 'None' is a Python keyword"),
    ]
    for name, needle, col, message in expected:
        want = f"specs/{name}:{line_of(spec_root, name, needle)}:{col}: {message}"
        assert want in got, (want, got)
    assert any(re.fullmatch(r"specs/gpt2\.yaml:\d+:3: hosts 'layer\[i\]\.self_attn' and 'layers\[i\]\.self_attn' would both "
                            r"be class LayerSelfAttn in the adapter: rename one", line) for line in got), got
    # names outside the vocabulary's modules: (the key 'layer' and the host 'layer[i]...') are said too
    tail = (" A new module name is declared once in specs/_vocabulary.yaml, under modules:, with its one-line meaning "
            "(what any family's module of that name is), or for this family alone under modules: in its spec")
    for needle, message in (("  layer: transformer", "rename key 'layer': 'layer' is not a standard module name; did you "
                             "mean 'layers'?"),
                            ("  layer[i].self_attn:", "host 'layer[i].self_attn': 'layer' is not a standard module "
                             "name; did you mean 'layers'?")):
        assert f"specs/gpt2.yaml:{line_of(spec_root, 'gpt2.yaml', needle)}:3: {message}{tail}" in got, got
    # gpt2's seven, and the clash again in each family that extends gpt2 (gpt_bigcode), at its own host line
    assert len([g for g in got if g.startswith("specs/gpt2.yaml")]) == 7, got
    assert all(g.startswith("specs/gpt2.yaml") or "would both be class LayerSelfAttn" in g for g in got), got


def test_deep_nesting_is_a_spec_error_not_a_recursion_error(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "lines: [GPT-2, DistilGPT2]", "lines: " + "[" * 1000 + "]" * 1000)
    edit(spec_root, "llama.yaml", "title: Llama\n", "title: Llama\nx:" + "".join(f"\n{'  ' * k}k:" for k in range(1, 60)) + " 1\n")
    got = errors(spec_root)
    assert re.fullmatch(r"specs/gpt2\.yaml:3:\d+: nested deeper than 32 levels of mappings and lists", got[0])
    assert re.fullmatch(r"specs/llama\.yaml:\d+:\d+: nested deeper than 32 levels of mappings and lists", got[1])


def test_empty_summary_title_and_lines(spec_root: Path) -> None:
    path = spec_root / "specs" / "gpt2.yaml"
    path.write_text(re.sub(r"summary: >\n(  .*\n)+", 'summary: ""\n', path.read_text(), count=1))
    edit(spec_root, "gpt2.yaml", "title: GPT-2", 'title: " "')
    edit(spec_root, "llama.yaml", "lines: [Llama 2, Llama 3, Llama 3.1, Llama 3.2, TinyLlama]", "lines: []")
    edit(spec_root, "qwen3_next.yaml", "lines: [", 'lines: ["", ')
    got = errors(spec_root)
    assert got[:3] == ["specs/gpt2.yaml:2:8: title is empty: say it in words",
                       "specs/gpt2.yaml:4:10: summary is empty: say it in words",
                       "specs/llama.yaml:3:8: lines is empty: name at least one product line"]
    assert re.fullmatch(r"specs/qwen3_next\.yaml:\d+:9: lines: an empty product line", got[3]) and len(got) == 4


def test_numbers_are_finite_and_bounded(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", 'view: "unflatten(-1, [num_heads, head_dim])"', 'view: "unflatten(-1e309, [num_heads, head_dim])"')
    edit(spec_root, "gpt2.yaml", "      - mlp_neurons == mlp_activation\n", "      - {check: mlp_neurons == mlp_activation, atol: .inf}\n")
    edit(spec_root, "gpt2.yaml", "title: GPT-2\n", "title: GPT-2\ndocstring: " + "9" * 5000 + "\n")
    edit(spec_root, "qwen3_next.yaml", "  num_experts: num_experts\n", "  num_experts: num_experts\n  huge: 1e400 * num_experts\n")
    edit(spec_root, "qwen3_vl.yaml", "  mrope_axes: 3\n", "  mrope_axes: 3\n  nan: .nan\n")
    got = "\n".join(errors(spec_root))
    n = line_of(spec_root, "llama.yaml", "unflatten(-1e309")
    assert f"specs/llama.yaml:{n}:63: attention_premix: view: '1e309': numbers must be finite and real" in got
    assert f"specs/gpt2.yaml:{line_of(spec_root, 'gpt2.yaml', 'atol: .inf')}:54: '.inf' is not a finite number" in got
    assert f"specs/gpt2.yaml:3:12: integer too large (at most {2**53} in magnitude)" in got
    n = line_of(spec_root, "qwen3_next.yaml", "huge:")
    assert f"specs/qwen3_next.yaml:{n}:9: config.huge: '1e400': numbers must be finite and real" in got
    assert f"specs/qwen3_vl.yaml:{line_of(spec_root, 'qwen3_vl.yaml', 'nan: .nan')}:8: '.nan' is not a finite number" in got


def test_strings_and_expressions_are_bounded_and_scalars_plain(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "title: GPT-2\n", "title: GPT-2\n\ndocstring: " + "a" * 20_001 + "\n")
    edit(spec_root, "llama.yaml", "  vocab_size: vocab_size\n", "  vocab_size: vocab_size\n  long: " + "depth + " * 150 + "1\n")
    edit(spec_root, "gpt2.yaml", "title: GPT-2", "title: 2024-01-01")
    edit(spec_root, "qwen3_next.yaml", "family: qwen3_next\n", "family: qwen3_next\nbinary: !!binary aGVsbG8=\n")
    got = "\n".join(errors(spec_root))
    assert "specs/gpt2.yaml:4:12: a string of 20001 characters (at most 20000)" in got
    n = line_of(spec_root, "llama.yaml", "long:")
    assert f"specs/llama.yaml:{n}:9: config.long: an expression of 1201 characters (at most 1000)" in got
    assert ("specs/gpt2.yaml:2:8: a 'timestamp' value: a spec holds strings, numbers, booleans and null only "
            "(quote it to make it a string)") in got
    assert "specs/qwen3_next.yaml:2:9: a 'binary' value" in got


def test_expressions_deep_or_costly_are_refused() -> None:
    with pytest.raises(expr.ExprError, match="nested too deeply"):
        expr.compile_config("-" * 100 + "a")
    with pytest.raises(expr.ExprError, match="exponent 10000000000 is too large"):
        expr.evaluate(expr.compile_config("2 ** 10 ** 10"), lambda name: 1)
    with pytest.raises(expr.ExprError, match="repetition too long"):
        expr.evaluate(expr.compile_config("'x' * 10 ** 9"), lambda name: 1)
    assert expr.evaluate(expr.compile_config("2 ** 10 * n"), lambda name: 3) == 3072


def test_a_family_named_by_a_keyword_is_refused(spec_root: Path) -> None:
    (spec_root / "specs" / "if.yaml").write_text("family: if\nextends: llama\n")
    assert errors(spec_root) == ["specs/if.yaml:1:9: 'family' must be a lowercase name like qwen3_next (not a Python keyword)"]


def test_the_emitter_refuses_a_name_the_resolver_let_through() -> None:
    """Defence in depth: a bad name reaching a template stops the render (never written, never run)."""
    root = Path(__file__).resolve().parent.parent
    f = next(f for f in compile_atlas(root / "specs", root).families if f.name == "gpt2")
    key, c, text = f.config[0]
    bad = dataclasses.replace(f, config=((f"{key}(c): pass\nimport os\ndef x", c, text), *f.config[1:]))
    with pytest.raises(pysource.EmitError, match="refusing to write"):
        emit.render_family(bad)
    with pytest.raises(pysource.EmitError, match="no Python literal for inf"):
        pysource.pylit(float("inf"))


def test_generate_parses_every_python_file_before_writing_or_running_it(spec_root: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from nnatlas.compiler.emit import printouts

    before = digest(spec_root)
    edit(spec_root, "gpt2.yaml", "title: GPT-2", "title: GPT-2 (changed)")  # a change that would rewrite files
    real = emit.render_family

    def broken(f):  # type: ignore[no-untyped-def]
        return real(f) + "\ndef (:\n" if f.name == "gpt2" else real(f)

    def never(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a printout was computed from an adapter that does not parse")

    monkeypatch.setattr(emit, "render_family", broken)
    monkeypatch.setattr(printouts, "compute", never)
    with pytest.raises(GenerateError, match=r"generated/families/gpt2\.py would not parse \(line \d+: invalid syntax\)"):
        generate(spec_root)
    assert digest(spec_root) == before
    real_tests = emit.render_tests
    monkeypatch.setattr(emit, "render_tests", lambda f: "x = (\n" if f.name == "gpt2" else real_tests(f))
    monkeypatch.setattr(emit, "render_family", real)
    monkeypatch.setattr(printouts, "is_fresh", lambda *a: True)
    assert main(["generate", "--root", str(spec_root)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "generated/tests/test_gpt2.py would not parse" in err[0] and "nothing was written" in err[0]
    assert digest(spec_root) == before


@pytest.mark.parametrize("code,what", [
    ("x = getattr(__import__('os'), 'system')('true')", "a call of getattr(__import__('os'), 'system')"),
    ("x = getattr", "the name 'getattr'"),
    ("import os", "a Import statement"),
    ("from os import system", "an import from os"),
    ("x = _fn.__class__", "the attribute .__class__"),
    ("x = Layout.__init__", "the attribute .__init__"),
    ("x = [y for y in ()]", "a ListComp expression"),
    ("x = (lambda: 0)", "a Lambda expression"),
    ("class K(TypedHost):\n    def f(self) -> None:\n        pass", "a class body that is not annotations"),
    ("def f(c: Any) -> Any:\n    print(c)\n    return c", "a function that does more than return one expression"),
    ("x = HOSTS.count(1)", "a call of HOSTS.count"),
    ("x = HOSTS.count", "the attribute .count"),
    ("x = _fn.softmax(Family)(1)", "a call of _fn.softmax(Family)"),
])
def test_an_adapter_holds_nothing_but_an_adapters_shape(code: str, what: str) -> None:
    """Defence in depth, before an adapter is written or run: text that parses but is not an adapter's."""
    from nnatlas.compiler.emit.pycheck import check_adapter

    root = Path(__file__).resolve().parent.parent
    source = (root / "generated" / "families" / "gpt2.py").read_text()
    check_adapter("generated/families/gpt2.py", source)
    with pytest.raises(GenerateError, match=re.escape(what)):
        check_adapter("generated/families/gpt2.py", source + "\n" + code + "\n")


def test_generate_checks_each_adapter_before_a_printout_runs_it(spec_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nnatlas.compiler.emit import printouts

    before = digest(spec_root)
    real = emit.render_family
    marker = spec_root / "ran"
    payload = f"\n_x = getattr(__import__('os'), 'system')('touch {marker}')\n"

    def injected(f):  # type: ignore[no-untyped-def]
        return real(f) + payload if f.name == "gpt2" else real(f)

    monkeypatch.setattr(emit, "render_family", injected)
    monkeypatch.setattr(printouts, "compute", lambda *a: (_ for _ in ()).throw(AssertionError("a printout ran")))
    with pytest.raises(GenerateError, match=r"generated/families/gpt2\.py line \d+: a call of getattr\(.*, which no adapter holds"):
        generate(spec_root)
    assert not marker.exists() and digest(spec_root) == before


def test_sizes_a_spec_states_are_bounded_where_they_are_used(spec_root: Path) -> None:
    edit(spec_root, "llama.yaml", "  seq: [1, 7]", "  seq: [1, 1000000000]")
    n = line_of(spec_root, "llama.yaml", "seq: [1, 1000000000]")
    assert errors(spec_root) == [f"specs/llama.yaml:{n}:8: tiny.seq: a range [low, high] with 1 <= low <= high <= 4096"]
    edit(spec_root, "llama.yaml", "  seq: [1, 1000000000]", "  seq: [1, 7]")
    edit(spec_root, "llama.yaml", "    num_hidden_layers: [1, 2, 3]", "    num_hidden_layers: [1, 2, 5000]")
    n = line_of(spec_root, "llama.yaml", "num_hidden_layers: [1, 2, 5000]")
    assert errors(spec_root) == [f"specs/llama.yaml:{n}:31: tiny.draw.num_hidden_layers.2: 5000 is not tiny (at most 4096): "
                                 "the generated tests build this model"]
    edit(spec_root, "llama.yaml", "    num_hidden_layers: [1, 2, 5000]", "    num_hidden_layers: [1, 2, 3]")
    atlas = compile_atlas(spec_root / "specs", spec_root)
    f = next(f for f in atlas.families if f.name == "llama")
    ckpt = dict(f.checkpoints[0].config)
    ckpt["num_hidden_layers"] = 10**9  # past the resolver's own check (below): the page still draws at most 1024
    f = dataclasses.replace(f, checkpoints=(dataclasses.replace(f.checkpoints[0], config=tuple(ckpt.items())),))
    page = pages.render_page(f, atlas)  # without a printout the page counts the blocks from the config: capped
    assert "family llama" in page and 'max="1023"' in page and page.count('class="tick ') == 1024


def test_expression_names_and_checkpoint_stacks_are_bounded(spec_root: Path) -> None:
    edit(spec_root, "gpt2.yaml", "  vocab_size: vocab_size\n", "  vocab_size: vocab_size\n  klass: vocab_size.__class__\n")
    edit(spec_root, "llama.yaml", "      num_hidden_layers: 16\n", "      num_hidden_layers: 1000000\n")
    n1 = line_of(spec_root, "gpt2.yaml", "klass:")
    assert errors(spec_root) == [
        f"specs/gpt2.yaml:{n1}:10: config.klass: '__class__' starts with '__' (reserved for Python's own names)",
        f"specs/llama.yaml:{line_of(spec_root, 'llama.yaml', '- name: meta-llama/Llama-3.2-1B') + 1}:5: checkpoint meta-llama/Llama-3.2-1B: num_layers is 1000000; at most 1024 blocks "
        "(the printout builds each one)"]
