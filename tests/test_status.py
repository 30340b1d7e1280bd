"""The status: the pytest plugin that records outcomes, the fold into status.json, the page and
the index's status row, and generate's determinism with a committed status.json."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from nnatlas.compiler import compile_atlas, generate, render
from nnatlas.compiler.status import status

ROOT = Path(__file__).resolve().parent.parent
SHA = "0" * 64


def _record(atlas: object, family: str = "llama", sha: str | None = None) -> dict[str, object]:
    f = next(x for x in atlas.families if x.name == family)  # type: ignore[attr-defined]
    base = f"generated/tests/test_{family}.py::"
    return {"transformers": "5.24.0", "torch": "2.13.0", "python": "3.11", "date": "2026-12-01 10:00 UTC",
            "specs": {family: sha or f.sha256},
            "errors": {"generated/tests/test_gpt2.py": "ImportError: cannot import name 'GPT2LMHeadModel'"},
            "tests": {base + "test_value_shapes": "passed", base + "test_identity[layers[i]-0]": "passed",
                      base + "test_identity[layers[i]-1]": "failed", base + "test_oracle[hidden_states-eager]": "passed",
                      base + "test_oracle[attentions-eager]": "failed",
                      base + "test_support_agrees_with_trace[eager]": "passed",
                      base + "test_note_example[The block, in order-0]": "passed"}}


def test_fold_counts_each_group_per_family_and_version() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    st = status.fold(atlas, [("5.24.0", _record(atlas), None), ("5.23.0", None, "could not install: no wheel")])
    assert st["pinned"] == "5.24.0"
    assert st["versions"][0]["passed"] == 5 and st["versions"][0]["failed"] == 2
    assert st["versions"][1] == {"transformers": "5.23.0", "ran": False, "why": "could not install: no wheel"}
    llama = st["families"]["llama"]
    assert llama["oracle_checks"] == ["attentions-eager", "hidden_states-eager"] and llama["loads"] == ["eager"]
    run = llama["runs"]["5.24.0"]
    assert run["result"] == "fail" and (run["passed"], run["total"]) == (5, 7)
    assert run["groups"]["identities"] == [1, 2] and run["groups"]["oracle"] == [1, 2] and run["groups"]["notes"] == [1, 1]
    assert run["failed"] == ["test_identity[layers[i]-1]", "test_oracle[attentions-eager]"]
    assert run["oracle"] == {"attentions-eager": "failed", "hidden_states-eager": "passed"}
    assert st["families"]["gpt2"]["runs"]["5.24.0"]["result"] == "error"
    assert st["families"]["gemma2"]["runs"]["5.24.0"]["result"] == "not run"
    assert llama["values"] > 20 and llama["identities"] >= 10


def test_page_and_index_show_the_status_and_mark_a_stale_spec() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    st = status.fold(atlas, [("5.24.0", _record(atlas, sha=SHA), None), ("5.23.0", None, "could not install: no wheel")])
    # the tensor-parallel column (nnatlas status --tp): a pass with its largest difference, a refusal with the
    # runtime's reason, a failure with its error; a later run of the generated tests keeps it
    cells = {"llama": {"values": 59, "max_value_diff": 7e-7, "max_edit_logit_diff": 5e-8, "max_cache_diff": 0.0,
                       "max_generate_diff": None, "max_grad_diff": 4e-5, "sharded_values": ["q: num_heads"]},
             "gpt2": {"refused": "GPT2Config has no tensor-parallel plan (base_model_tp_plan)"},
             "qwen2": {"error": "AssertionError: qwen2 layers[0].mlp.mlp_neurons: differs from one process by 0.3"}}
    st["tp"] = {"transformers": "5.24.0", "torch": "2.13.0", "ranks": 2, "backend": "gloo", "date": "2026-12-03",
                "families": {k: {**status._tp_entry(v), "spec_sha256": SHA} for k, v in cells.items()}}
    assert st["tp"]["families"]["llama"]["max_diff"] == 7e-7 and st["tp"]["families"]["llama"]["sharded_values"] == 1
    kept = status.merge(json.loads(status.dumps(st)), status.fold(atlas, [("5.24.0", _record(atlas), None)]), ["llama"])
    assert kept["tp"] == json.loads(status.dumps(st))["tp"]
    out = render(atlas, None, json.loads(status.dumps(st)))
    page = out["generated/docs/status.html"]
    assert '<td data-tp="pass"><span class="st-pass"' in page and "✓ max diff 7.0e-07" in page and "grad 4.0e-05" in page
    assert '<td data-tp="refused">' in page and "GPT2Config has no tensor-parallel plan" in page
    assert '<td data-tp="fail">' in page and "differs from one process by 0.3" in page
    assert '<td data-tp="not run">' in page and "transformers <code>5.24.0</code>, torch 2.13.0" in page
    assert '<tr id="llama" data-family="llama" data-result="fail">' in page
    assert "✗ 2 failed of 7" in page and "stale" in page and "could not install: no wheel" in page
    assert "✓</span> hidden_states (eager)" in page and "✗</span> attentions (eager)" in page
    assert 'data-col-family="llama" data-result="fail"' in out["generated/docs/matrix.html"]
    assert 'href="status.html"' in out["generated/docs/index.html"]
    empty = render(atlas)["generated/docs/status.html"]
    assert 'id="no-run"' in empty


def test_every_family_header_has_a_badge_linking_its_status() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    st = json.loads(status.dumps(status.fold(atlas, [("5.24.0", _record(atlas, sha=SHA), None)])))
    out = render(atlas, None, st)
    llama = out["generated/docs/llama.html"]
    assert '<p class="badge" data-result="fail"><a href="status.html#llama">' in llama
    assert "✗ 5/7 tests passed</span> (transformers 5.24.0)" in llama and "stale: the spec changed" in llama
    assert "2 oracle checks" in llama
    for f in atlas.families:
        page = out[f"generated/docs/{f.name}.html"]
        assert f'<a href="status.html#{f.name}">' in page and " values · " in page, f.name
    assert '<p class="badge" data-result="error">' in out["generated/docs/gpt2.html"]  # its tests did not import
    assert "tests not run in the last status run" in out["generated/docs/mistral.html"]  # not in the record


def test_generate_keeps_and_reads_a_committed_status(spec_root: Path) -> None:
    atlas = compile_atlas(spec_root / "specs", spec_root)
    st = status.fold(atlas, [("5.24.0", _record(atlas), None)])
    (spec_root / status.PATH).write_text(status.dumps(st))
    generate(spec_root)
    assert (spec_root / status.PATH).read_text() == status.dumps(st)  # never an orphan, never rewritten
    assert 'data-result="fail"' in (spec_root / "generated/docs/status.html").read_text()
    again = generate(spec_root, check=True)
    assert not again.changed and not again.removed


def test_plugin_records_outcomes_errors_and_spec_hashes(tmp_path: Path) -> None:
    tests = tmp_path / "generated" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_good.py").write_text(f"# Generated by nnatlas from specs/good.yaml (sha256 {SHA}).\n"
                                        "import pytest\n\n\ndef test_a():\n    pass\n\n\ndef test_b():\n    assert 0\n\n\n"
                                        "@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n\n"
                                        "def test_c(broken):\n    pass\n")
    (tests / "test_bad.py").write_text("from transformers import NoSuchModel\n")
    out = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "generated/tests", "-p", "nnatlas.compiler.status.status_plugin",
                           f"--nnatlas-status={out}", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "-c", "/dev/null", "--continue-on-collection-errors"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["tests"] == {"generated/tests/test_good.py::test_a": "passed",
                               "generated/tests/test_good.py::test_b": "failed",
                               "generated/tests/test_good.py::test_c": "failed"}
    assert "NoSuchModel" in record["errors"]["generated/tests/test_bad.py"]
    assert record["specs"] == {"good": SHA}
    assert record["test_files"]["good"] == hashlib.sha256((tests / "test_good.py").read_bytes()).hexdigest()
    assert record["transformers"] and record["torch"]


def test_a_partial_run_keeps_the_other_families_runs_and_sums_each_version() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    first = json.loads(status.dumps(status.fold(atlas, [("5.24.0", _record(atlas), None)])))
    gpt2 = _record(atlas, "gpt2")
    gpt2["errors"] = {}
    gpt2["test_files"] = {"gpt2": SHA}
    gpt2["date"] = "2026-12-02 09:00 UTC"
    merged = status.merge(first, status.fold(atlas, [("5.24.0", gpt2, None)]), ["gpt2"])
    assert merged["families"]["llama"] == first["families"]["llama"]  # kept whole
    run = merged["families"]["gpt2"]["runs"]["5.24.0"]
    assert run["result"] == "fail" and run["tests_sha256"] == SHA and run["date"] == "2026-12-02 09:00 UTC"
    version = merged["versions"][0]
    assert (version["passed"], version["failed"], version["collection_errors"]) == (10, 4, 0)
    assert version["date"] == "2026-12-02 09:00 UTC"
    # a version that did not run now keeps what it said before
    again = status.merge(merged, status.fold(atlas, [("5.24.0", None, "could not install")]), ["gpt2"])
    assert again["versions"][0]["passed"] == 10
    # a run of another version alone keeps the pinned version's column, first
    older = _record(atlas, "gpt2")
    older.update(transformers="5.23.0", errors={})
    both = status.merge(merged, status.fold(atlas, [("5.23.0", older, None)]), ["llama", "gpt2"],
                        ["5.24.0", "5.23.0", "5.22.2"])
    assert both["pinned"] == "5.24.0" and [v["transformers"] for v in both["versions"]] == ["5.24.0", "5.23.0", "5.22.2"]
    assert both["versions"][0] == merged["versions"][0] and both["versions"][2]["ran"] is False
    assert both["families"]["gpt2"]["runs"]["5.24.0"] == run and both["families"]["gpt2"]["runs"]["5.23.0"]["total"] == 7
    assert both["versions"][1]["passed"] == 5


def test_stale_names_the_families_whose_spec_or_tests_changed_since_their_run() -> None:
    atlas = compile_atlas(ROOT / "specs", ROOT)
    record = _record(atlas)
    record["test_files"] = {"llama": hashlib.sha256((ROOT / "generated/tests/test_llama.py").read_bytes()).hexdigest()}
    st = json.loads(status.dumps(status.fold(atlas, [("5.24.0", record, None)])))
    stale = status.stale(atlas, st, ROOT, "5.24.0")
    assert "llama" not in stale and "gpt2" in stale and len(stale) == len(atlas.families) - 1
    st["families"]["llama"]["runs"]["5.24.0"]["tests_sha256"] = SHA  # its tests changed since
    assert "llama" in status.stale(atlas, st, ROOT, "5.24.0")
    assert status.stale(atlas, st, ROOT, "5.23.0") == [f.name for f in atlas.families]


def test_a_run_of_other_generated_tests_is_stale_and_the_page_marks_what_status_stale_reruns() -> None:
    """A run that saw the same spec but other generated tests (the compiler or its templates changed them)
    is stale, and says which changed; the committed status page marks stale (or not run) exactly the
    families `nnatlas status --stale` reruns under the pinned version (it marked 22 of the 67 when the
    generated tests of 45 more had changed since the run, their counts shown as current)."""
    import re

    from nnatlas.compiler.emit import emit

    atlas = compile_atlas(ROOT / "specs", ROOT)
    llama = next(f for f in atlas.families if f.name == "llama")
    record = {**_record(atlas), "test_files": {"llama": SHA}}
    st = json.loads(status.dumps(status.fold(atlas, [("5.24.0", record, None)])))
    cell = status.row(llama, st, status.tests_digest(emit.render_tests(llama)))["pinned"]
    assert cell["stale"] and cell["stale_why"].startswith("the generated tests changed since the run")
    assert not status.row(llama, st, SHA)["pinned"]["stale"]  # the tests it ran are the tests now
    committed = status.read(ROOT)
    assert committed is not None
    page = (ROOT / "generated" / "docs" / "status.html").read_text(encoding="utf-8")
    pinned = committed["pinned"]
    marked = set()
    for fam, result, body in re.findall(r'<tr id="([a-z0-9_]+)" data-family="[^"]+" data-result="([a-z ]+)">(.*?)</tr>', page, re.S):
        cell_html = re.search(rf'<td data-version="{re.escape(pinned)}">(.*?)</td>', body, re.S)
        assert cell_html is not None, fam
        if 'class="st-stale"' in cell_html.group(1) or result == "not run":
            marked.add(fam)
    assert marked == set(status.stale(atlas, committed, ROOT, pinned))
    if marked:
        assert 'id="stale-note"><span class="st-stale">stale</span> ' in page and "nnatlas status --stale" in page
