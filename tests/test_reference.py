"""The spec reference (docs/spec.md, the site's spec.html): generated from the compiler's models and
tables, complete, and checked for staleness by `nnatlas generate --check` (so by `make check`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from nnatlas.compiler.emit import reference
from nnatlas.compiler.language import expr, models, readpoint
from nnatlas.compiler.language.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
SPEC_MD = ROOT / reference.PATH


def _all_models() -> list[type[models.BaseModel]]:
    return [m for _, root, prefix in reference.files() for m, _ in reference.walk(root, prefix)]


def test_every_key_of_every_model_is_described_in_docs_spec_md() -> None:
    text = SPEC_MD.read_text(encoding="utf-8")
    seen = _all_models()
    assert {models.FamilyRaw, models.HostRaw, models.ValueRaw, models.IdentityRaw, models.KindRaw, models.TinyRaw,
            models.Vocabulary, models.ConditionRaw, models.UnavailableRaw, models.NoteRaw, models.SharedNoteRaw} <= set(seen)
    for model in seen:
        for name, info in model.model_fields.items():
            key = info.alias or name
            assert info.description, f"{model.__name__}.{name}: add Field(description=...) (the spec reference shows it)"
            row = f"| `{key}` | {reference._md_cell(reference.type_text(info.annotation))} |"
            assert row in text, f"{model.__name__}.{key} is not in {reference.PATH}"
            assert reference._md_cell(reference.rst(" ".join(info.description.split()))) in text


def test_every_model_of_models_py_is_in_the_reference() -> None:
    assert set(reference.all_models()) == set(_all_models())
    assert models.FamilyRaw in reference.all_models() and models.Strict not in reference.all_models()


def test_a_new_kind_of_spec_file_gets_its_own_section(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root model no other refers to (the specv2 branch's parts) is listed under the file its docstring names."""

    class PieceRaw(models.Strict):
        """A shared fragment (``specs/pieces/<piece>.yaml``)."""

        piece: str = Field(description="its name")
        hosts: dict[str, models.HostRaw] = Field(default={}, description="hosts written once")

    PieceRaw.__module__ = models.__name__
    monkeypatch.setattr(models, "PieceRaw", PieceRaw, raising=False)
    (entry,) = [f for f in reference.files() if f[1] is PieceRaw]
    assert entry == ("specs/pieces/<piece>.yaml", PieceRaw, "")
    text = "\n".join(s.title for s in reference.sections())
    assert "Piece · specs/pieces/<piece>.yaml" in text


def test_value_forms_name_the_models_and_the_defaults() -> None:
    rows = {r[0]: r for r in reference.field_rows(models.HostRaw)}
    assert rows["class"][1:3] == ("string or null", "null")  # the YAML key, not the Python name
    assert rows["values"][1] == "mapping of NAME → string or Value or null"
    assert rows["identities"][1] == "list of (string or Identity)"
    rows = {r[0]: r for r in reference.field_rows(models.TinyRaw)}
    assert rows["seq"][1:3] == ("[integer, integer]", "[1, 8]") and rows["model_class"][2] == "required"
    where = dict((m, w) for m, w in reference.walk(models.FamilyRaw))
    assert where[models.KindRaw] == "hosts.NAME.kinds.NAME" and where[models.IdentityRaw] == "hosts.NAME.identities[n]"


def test_a_model_added_later_is_picked_up_without_touching_the_reference() -> None:
    """What the specv2 branch adds (parts, explicit append/replace keys) appears once it is in the models."""

    class PartRaw(models.Strict):
        """A shared fragment included by families."""

        file: str = Field(description="specs/parts/NAME.yaml")
        classes: dict[str, str] = Field(default={}, description="class map")

    class FamilyPlus(models.FamilyRaw):
        parts: list[PartRaw] = Field(default=[], description="the parts this family includes")
        identities_append: list[str] = Field(default=[], alias="identities+", description="appended to the base's")

    walked = dict(reference.walk(FamilyPlus))
    assert walked[PartRaw] == "parts[n]"
    sections = reference.model_sections(FamilyPlus, "specs/FAMILY.yaml")
    part = next(s for s in sections if s.title.startswith("Part"))
    (_, table), = [b for b in part.blocks if b[0] == "table"]
    assert [r[0] for r in table.rows] == ["`file`", "`classes`"] and table.rows[1][1:] == (
        "mapping of NAME → string", "{}", "class map")
    top = next(b for b in sections[0].blocks if b[0] == "table")[1]
    assert ("`identities+`", "list of string", "[]", "appended to the base's") in top.rows


def test_the_expression_whitelist_read_points_and_presets_are_all_there() -> None:
    text = SPEC_MD.read_text(encoding="utf-8")
    for table in (expr.FUNCTIONS, expr.CONFIG_FUNCTIONS, expr.VIEW_OPS):
        for fn in table.values():
            assert f"| `{fn.signature}` | {reference._md_cell(fn.doc)} |" in text
    grammar = (readpoint.__doc__ or "").split("\n\n")[1]
    for line in grammar.splitlines():
        assert line.strip() in text  # the read-point grammar, with its examples
    for name, preset in PRESETS.items():
        assert f"| `{name}` |" in text and preset.doc in text
    for heading in ("## Read points", "## Expressions", "## extends: merging a family over its bases", "## Presets",
                    "### Value · `hosts.NAME.values.NAME`", "### Condition · `conditions.NAME`"):
        assert f"\n{heading}\n" in text
    assert "`missing`" in text and "{unavailable: why}" in text


def test_the_site_page_is_linked_and_escaped() -> None:
    docs = ROOT / "generated" / "docs"
    page = (docs / "spec.html").read_text(encoding="utf-8")
    assert '<a href="spec.html">the spec language</a>' in (docs / "index.html").read_text(encoding="utf-8")
    assert "(spec.html)" in (docs / "llms.txt").read_text(encoding="utf-8")
    assert "model.&lt;value&gt;" in page and "<value>" not in page
    assert "<code>masked(pattern, window=None, chunk=None, sinks=0)</code>" in page
    assert "](docs/spec.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_a_stale_reference_fails_generate_check(spec_root: Path) -> None:
    shutil.copytree(ROOT / "docs", spec_root / "docs")
    check = [sys.executable, "-m", "nnatlas.compiler.cli", "generate", "--check", "--root", str(spec_root)]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    md = spec_root / reference.PATH
    md.write_text(md.read_text(encoding="utf-8").replace("| `view` |", "| `vieww` |", 1), encoding="utf-8")
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"--- a/{reference.PATH}" in proc.stdout and "+| `view` |" in proc.stdout
    md.unlink()
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 1 and f"+++ b/{reference.PATH}" in proc.stdout
