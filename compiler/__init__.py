"""The nnatlas spec compiler: specs/*.yaml → adapters, tests and pages under generated/.

    from nnatlas.compiler import compile_atlas, generate
    atlas = compile_atlas(Path("specs"))          # validate and resolve (raises SpecError)
    generate(root)                                 # write what changed; generate(root, check=True) only compares
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import emit, files
from .errors import Problem, SpecError
from .ir import Atlas
from .resolve import resolve

OWNED = ("generated/families", "generated/tests", "generated/docs")


def default_root() -> Path:
    """The checkout this package was installed from (compiler/ sits at its top level)."""
    return Path(__file__).resolve().parent.parent


def compile_atlas(spec_dir: Path, root: Path | None = None) -> Atlas:
    return resolve(spec_dir, root)


def render(atlas: Atlas) -> dict[str, str]:
    """Every generated file, path relative to the root → text."""
    out: dict[str, str] = {"generated/families/__init__.py": emit.render_registry(atlas)}
    for f in atlas.families:
        out[f"generated/families/{f.name}.py"] = emit.render_family(f)
        out[f"generated/tests/test_{f.name}.py"] = emit.render_tests(f)
        out[f"generated/docs/{f.name}.html"] = emit.render_page(f, atlas)
    out["generated/docs/index.html"] = emit.render_index(atlas)
    out["generated/docs/atlas.css"] = emit.env().get_template("atlas.css.j2").render()
    return out


@dataclass
class Result:
    changed: list[str]
    removed: list[str]
    diff: str


def generate(root: Path | None = None, check: bool = False) -> Result:
    """Validate every spec and regenerate; with ``check`` write nothing and report the diff.

    All files are rendered in memory first: a spec error writes nothing at all.
    """
    root = root or default_root()
    atlas = compile_atlas(root / "specs", root)
    outputs = render(atlas)
    changed, orphans = files.stale(root, outputs, OWNED)
    result = Result(changed, orphans, files.diff(root, outputs, changed, orphans) if check else "")
    if not check:
        files.write(root, outputs, changed, orphans)
    return result


__all__ = ["Atlas", "Problem", "Result", "SpecError", "compile_atlas", "default_root", "generate", "render"]
