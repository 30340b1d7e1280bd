"""Installing nnatlas into an existing environment swaps nothing there: pyproject.toml declares ranges (the ones
the status matrix supports), and the exact versions the tests ran against live in constraints.txt, which the
README's commands (the Makefile) install with."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from nnatlas.compiler.status import status

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            found[req.name.lower()] = Version(spec.version)
    return found


def requirements() -> list[Requirement]:
    extras = PROJECT["project"]["optional-dependencies"]
    return [Requirement(r) for r in [*PROJECT["project"]["dependencies"], *(r for rs in extras.values() for r in rs)]]


def test_dependencies_are_ranges_not_pins() -> None:
    for req in requirements():
        assert all(s.operator != "==" for s in req.specifier), f"{req}: a pin swaps the user's own version"
    core = {r.name: r for r in map(Requirement, PROJECT["project"]["dependencies"])}
    assert core["torch"].specifier and core["transformers"].specifier


def test_every_pin_lies_in_its_range_and_is_what_is_installed() -> None:
    ranges = {r.name.lower(): r.specifier for r in requirements()}
    for name, version in pins().items():
        if name in ranges:
            assert ranges[name].contains(version, prereleases=True), f"constraints.txt {name}=={version} is outside {ranges[name]}"
        installed = Version(importlib.metadata.version(name))
        assert Version(installed.base_version) == version, f"{name}: {installed} installed, constraints.txt pins {version}"


def test_the_status_matrix_versions_are_inside_the_declared_range() -> None:
    (transformers,) = [r for r in map(Requirement, PROJECT["project"]["dependencies"]) if r.name == "transformers"]
    tested = status.versions(ROOT)
    assert tested[0] == str(pins()["transformers"])  # the pinned one first: the one CI runs
    for v in tested:
        assert transformers.specifier.contains(v), f"make status runs transformers {v}, outside {transformers.specifier}"
    assert status.pinned(ROOT, "torch") == f"torch=={pins()['torch']}"


def test_the_makefile_installs_under_the_constraints() -> None:
    make = (ROOT / "Makefile").read_text()
    installs = [line for line in make.splitlines() if re.search(r"\bpip install\b|\$\(PIP\)", line)]
    assert installs and all("constraints.txt" in line or "$(PIP)" in line for line in installs), installs
    assert "-c constraints.txt" in make
