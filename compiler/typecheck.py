"""``make check``'s type check: mypy over the package ``nnatlas`` as an installed wheel lays it out.

pyproject's package-dir maps ``runtime/`` to ``nnatlas``, ``compiler/`` to ``nnatlas.compiler`` and
``generated/families/`` to ``nnatlas.families``. The editable install serves that mapping through an
import hook, which mypy cannot see: checked as folders, ``from nnatlas.spec import ...`` in the compiler
or a generated adapter would resolve to nothing and every cross-package type would be ``Any``. So the
check lays the package out as links into the checkout (:func:`package_tree`) and runs ``mypy -p nnatlas``
over it; each error is reported at the checkout's own path (``runtime/model.py``, ``compiler/emit/emit.py``).

    python -m nnatlas.compiler.typecheck [MYPY ARGS...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"  # (build/ is ignored by git; the tree is remade on every run)


def package_tree(site: Path, root: Path = ROOT) -> Path:
    """``site/nnatlas``: the runtime's modules and rooms, ``compiler/`` and ``families/`` as links into
    ``root``; returns ``site`` (a folder for mypy's search path). ``site/nnatlas`` is made afresh."""
    pkg = site / "nnatlas"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    for path in sorted((root / "runtime").iterdir()):
        if path.suffix == ".py" or (path / "__init__.py").is_file():  # a module, or a room (a subpackage)
            (pkg / path.name).symlink_to(path)
    (pkg / "compiler").symlink_to(root / "compiler")
    (pkg / "families").symlink_to(root / "generated" / "families")
    return site


# where each link of the tree leads, longest first: a path mypy prints under the tree, as the checkout's
_SOURCES = (("nnatlas/compiler/", "compiler/"), ("nnatlas/families/", "generated/families/"),
            ("nnatlas/testing/", "runtime/testing/"), ("nnatlas/", "runtime/"))


def source_path(text: str, site: Path) -> str:
    """``text`` (mypy's output) with every path under ``site`` named as the checkout names it."""
    for prefix in (str(site) + os.sep, str(site.relative_to(ROOT)) + os.sep if site.is_relative_to(ROOT) else None):
        if prefix is None:
            continue
        for link, source in _SOURCES:
            text = text.replace(prefix + link, source)
    return text


def main(argv: list[str] | None = None) -> int:
    site = package_tree(TREE)
    env = {**os.environ, "MYPYPATH": str(site)}
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *(argv or []), "-p", "nnatlas"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True, text=True)
    sys.stdout.write(source_path(done.stdout, site))
    sys.stderr.write(source_path(done.stderr, site))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
