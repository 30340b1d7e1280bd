"""The spec expression grammar: whitelisted, compiled to source, evaluated without eval."""

from __future__ import annotations

import pytest

from nnatlas.compiler.language import expr


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "(lambda: 1)()", "x.__class__", "[i for i in x]", "a if b else c == d",
    "open('f')", "x.sum()", "f'{x}'", "a == b == c", "x[1:2:3:4]",
])
def test_identities_refuse_what_is_not_whitelisted(text: str) -> None:
    with pytest.raises(expr.ExprError):
        expr.compile_identity(text)


def test_identity_compiles_to_lookups_and_helpers() -> None:
    op, lhs, rhs = expr.compile_identity("layer_input + self_attn.attention_output == layers[0].layer_output")
    assert op == "==" and lhs.source == "(v['layer_input'] + v['self_attn.attention_output'])"
    assert rhs.names == ("layers[0].layer_output",)
    _, lhs, _ = expr.compile_identity("masked(attention_probabilities) == 0")
    assert lhs.source == "_fn.masked(v['attention_probabilities'], v)"


def test_config_and_when_evaluate_without_eval() -> None:
    config = {"n_inner": None, "n_embd": 8, "layer_types": ["linear_attention", "full_attention"],
              "text_config": {"depth": 3}}

    def look(name: str) -> object:
        node: object = config
        for part in name.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    assert expr.evaluate(expr.compile_config("n_inner or 4 * n_embd"), look) == 32
    assert expr.evaluate(expr.compile_config("text_config.depth - 1"), look) == 2
    assert expr.evaluate(expr.compile_config("count(layer_types, 'full_attention')"), look) == 1
    when = expr.compile_when("layer_types[i] == 'full_attention'")
    assert [expr.evaluate(when, look, i) for i in range(2)] == [False, True]
    with pytest.raises(expr.ExprError):
        expr.compile_config("__import__('os')")


def test_views_parse_to_ops() -> None:
    assert expr.parse_view("unflatten(-1, [num_heads, head_dim]).transpose(1, 2)") == [
        ("unflatten", (-1, ("num_heads", "head_dim"))), ("transpose", (1, 2))]
    with pytest.raises(expr.ExprError, match="unknown view 'reshape'"):
        expr.parse_view("reshape(-1)")


def test_compiled_texts_are_kept_but_errors_and_types_are_not_conflated() -> None:
    """The compilers keep each text's result (specs repeat their texts in every family extending them):
    the same answer again, an error raised again, and 1, 1.0 and True kept apart."""
    assert expr.compile_config(1) is expr.compile_config(1)
    assert expr.compile_config(1.0).source == "1.0" and expr.compile_config(1).source == "1"
    with pytest.raises(expr.ExprError, match="not a boolean"):
        expr.compile_config(True)
    for _ in range(2):
        with pytest.raises(expr.ExprError, match="an identity is one comparison"):
            expr.compile_identity("layer_input + mlp_output")
    view = expr.parse_view("unflatten(-1, [num_heads, head_dim])")
    view.append(("flatten", ()))  # a caller's list is its own: the kept result is not changed
    assert expr.parse_view("unflatten(-1, [num_heads, head_dim])") == [("unflatten", (-1, ("num_heads", "head_dim")))]
