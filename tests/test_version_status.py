"""An honest version range: a family the status matrix records failing under the installed transformers warns
once at load, in one line naming the versions where it passes; one that passes nowhere is refused with that line.
The status here is a fixture (``make status`` installs venvs and takes long); the carried file is the generated one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import transformers

import nnatlas
from nnatlas import testing
from nnatlas.loading import version_status
from nnatlas.loading.version_status import UnsupportedVersion, VersionWarning

ROOT = Path(__file__).resolve().parent.parent
NOW = transformers.__version__


def _status(**families: dict[str, tuple[str, int, int]]) -> dict[str, Any]:
    """A status fixture: family → version → (result, passed, total)."""
    return {"versions": ["5.24.0", "5.23.0", "5.22.2"],
            "families": {f: {v: {"result": r, "passed": p, "total": t} for v, (r, p, t) in runs.items()}
                         for f, runs in families.items()}}


STATUS = _status(gptj={"5.24.0": ("pass", 42, 42), "5.23.0": ("fail", 24, 42), "5.22.2": ("fail", 24, 42)},
                 broken={"5.24.0": ("fail", 3, 40), "5.23.0": ("fail", 3, 40)},
                 empty={"5.24.0": ("pass", 40, 40), "5.23.0": ("fail", 0, 40)})


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    version_status._warned.clear()
    yield
    version_status._warned.clear()


def test_a_failing_version_warns_once_in_one_line() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            version_status.check("gptj", "5.23.0", STATUS)
    assert len(seen) == 1 and seen[0].category is VersionWarning
    said = str(seen[0].message)
    assert "\n" not in said
    assert said == ("nnatlas: family gptj fails its generated tests under transformers 5.23.0 (18 of 42 failed in "
                    "the status matrix); it passes under transformers 5.24.0")
    with warnings.catch_warnings(record=True) as seen:  # another version of the same family: its own line, once
        warnings.simplefilter("always")
        version_status.check("gptj", "5.22.2", STATUS)
        version_status.check("gptj", "5.22.2", STATUS)
    assert [str(w.message).split(" (")[0] for w in seen] == [
        "nnatlas: family gptj fails its generated tests under transformers 5.22.2"]


def test_passing_unrecorded_and_user_families_say_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        version_status.check("gptj", "5.24.0", STATUS)  # passes there
        version_status.check("gptj", "5.21.0", STATUS)  # a version the matrix did not run
        version_status.check("llama", "5.23.0", STATUS)  # a family the matrix did not run
        version_status.check("broken", "5.24.0", STATUS, shipped=False)  # a user's spec reusing a shipped name


def test_a_family_that_passes_nowhere_is_refused() -> None:
    with pytest.raises(UnsupportedVersion) as nowhere:
        version_status.check("broken", "5.23.0", STATUS)
    assert str(nowhere.value) == ("nnatlas: family broken fails its generated tests under transformers 5.23.0 (37 of 40 "
                                  "failed in the status matrix); it passes under no version the matrix ran")
    with pytest.raises(UnsupportedVersion, match=r"\(40 of 40 failed .*it passes under transformers 5.24.0$"):
        version_status.check("empty", "5.23.0", STATUS)  # not one of its tests passes under the installed version
    assert isinstance(nowhere.value, nnatlas.NnatlasError)


def test_wrap_checks_the_installed_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The load path (wrap, which load calls) consults the status under the installed transformers."""
    model = testing.build("gptj")
    fixture = _status(gptj={NOW: ("fail", 24, 42), "5.24.0" if NOW != "5.24.0" else "5.23.0": ("pass", 42, 42)})
    monkeypatch.setattr(version_status, "carried", lambda: fixture)
    with pytest.warns(VersionWarning, match=rf"^nnatlas: family gptj fails its generated tests under transformers {NOW} "):
        nnatlas.wrap(model.native)
    monkeypatch.setattr(version_status, "carried", lambda: _status(gptj={NOW: ("fail", 0, 42)}))
    with pytest.raises(UnsupportedVersion, match="passes under no version"):
        nnatlas.wrap(model.native)


def test_the_carried_status_is_the_matrix_seen_from_the_specs() -> None:
    """The shipped file holds every fresh pass and fail of status.json, and nothing else."""
    matrix = json.loads((ROOT / "generated" / "docs" / "status.json").read_text())
    carried = version_status.carried()
    assert carried["versions"] == [v["transformers"] for v in matrix["versions"]]
    for family, runs in carried["families"].items():
        for version, cell in runs.items():
            run = matrix["families"][family]["runs"][version]
            assert (cell["result"], cell["passed"], cell["total"]) == (run["result"], run["passed"], run["total"])
    assert set(carried["families"]) <= set(nnatlas.families.FAMILIES)
    for family, runs in carried["families"].items():  # a recorded failure is said; a pass is not
        for version, cell in runs.items():
            assert (version_status.verdict(family, version, carried) is None) == (cell["result"] == "pass")
