"""Does the loaded family pass its tests under the installed transformers? The status matrix says.

``make status`` runs every family's generated tests under each transformers version pyproject.toml lists
(``generated/docs/status.json``); ``nnatlas generate`` writes what of it the runtime carries,
``nnatlas/families/version_status.json`` (package data, shipped in the wheel): per family and version, the
result of the run that saw the family's current spec and tests. Loading a family the matrix records failing under
the installed version warns once per family and version, in one line naming the versions where it passes; a family
that passes nowhere (under no recorded version, or not one of its tests under the installed one) is refused with
that line. A version or family the matrix did not run, or ran on another spec, says nothing.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ..errors import NnatlasError

FILE = "version_status.json"
_warned: set[tuple[str, str]] = set()


class VersionWarning(UserWarning):
    """The status matrix records the family's generated tests failing under the installed transformers."""


class UnsupportedVersion(NnatlasError):
    """The family passes its generated tests under no transformers version the status matrix ran."""


@functools.cache
def carried() -> Mapping[str, Any]:
    """The status shipped with nnatlas (empty when the file is missing: a checkout before its first generate)."""
    try:
        text = resources.files("nnatlas.families").joinpath(FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError):
        return {}
    data: Mapping[str, Any] = json.loads(text)
    return data


def verdict(family: str, version: str, status: Mapping[str, Any]) -> tuple[str, bool] | None:
    """The one line a load of ``family`` under transformers ``version`` says, and whether it refuses; None when the
    status records no failure there."""
    runs = status.get("families", {}).get(family, {})
    run = runs.get(version)
    if not run or run.get("result") != "fail":
        return None
    passes = [v for v in status.get("versions", []) if runs.get(v, {}).get("result") == "pass"]
    passed, total = run.get("passed", 0), run.get("total", 0)
    where = f"it passes under transformers {', '.join(passes)}" if passes else "it passes under no version the matrix ran"
    said = (f"nnatlas: family {family} fails its generated tests under transformers {version} "
            f"({total - passed} of {total} failed in the status matrix); {where}")
    return said, not passes or passed == 0


def check(family: str, version: str | None = None, status: Mapping[str, Any] | None = None,
          shipped: bool = True) -> None:
    """Warn (once per family and version) or refuse, as the module says; ``version``: the installed transformers'
    by default, ``status``: the carried status by default. A family not ``shipped`` (a user's spec or a draft, which
    may reuse a shipped name) has no status: nothing is said."""
    if not shipped:
        return
    if version is None:
        import transformers

        version = transformers.__version__
    found = verdict(family, version, carried() if status is None else status)
    if found is None:
        return
    said, refuse = found
    if refuse:
        raise UnsupportedVersion(said)
    if (family, version) not in _warned:
        _warned.add((family, version))
        warnings.warn(said, VersionWarning, stacklevel=3)
