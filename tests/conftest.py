from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent

# Tiny models gain nothing from threads, and a batched LAPACK call (the delta rule's solve_triangular)
# runs ~400x slower with two threads on a loaded two-core machine: the tests set one thread themselves
# (nnatlas.testing changes no global setting)
torch.set_num_threads(1)


# The longest test files start first: `make test` hands whole files to its workers in collection order
# (pytest-xdist --dist loadfile --no-loadscope-reorder), and one long file started last is a tail the other
# workers wait through (the browser walk began 8 minutes into a 12-minute run)
FIRST = ("tests/browser/test_site.py", "tests/test_spec_fuzz.py", "tests/test_bench.py", "tests/test_interrupts.py",
         "tests/test_spec_injection_fuzz.py", "tests/browser/test_finding.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path)).resolve()
        name = path.relative_to(ROOT).as_posix() if ROOT in path.parents else ""
        return FIRST.index(name) if name in FIRST else len(FIRST)

    items.sort(key=rank)  # (stable: the rest keep their order)


@pytest.fixture
def spec_root(tmp_path: Path) -> Path:
    """A copy of the checkout's specs/ and generated/ in a temporary root, to break at will."""
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    shutil.copytree(ROOT / "generated", tmp_path / "generated", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def drop_families(root: Path, *names: str) -> None:
    """Remove these families' specs from ``root``, and every family that extends one of them."""
    gone = set(names)
    specs = sorted((root / "specs").glob("*.yaml"))
    while True:
        more = set()
        for p in specs:
            data = yaml.safe_load(p.read_text())
            bases = data.get("extends") if isinstance(data, dict) else None
            bases = [bases] if isinstance(bases, str) else (bases or [])
            if p.stem not in gone and set(bases) & gone:
                more.add(p.stem)
        if not more:
            break
        gone |= more
    for name in gone:
        (root / "specs" / f"{name}.yaml").unlink(missing_ok=True)
