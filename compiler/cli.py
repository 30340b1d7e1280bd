"""``nnatlas generate [--check]`` and ``nnatlas docs [--out DIR] [--serve [--port N]]``, ``nnatlas new FAMILY --from
BASE``, ``nnatlas status [--versions V,...] [--families F,... | --stale]`` (make status); ``nnatlas cache`` is the runtime's (``nnatlas.cli.cache``), handed its arguments whole.

Every subcommand runs through ``user_errors``: a mistake of the user's (a broken spec, a bad path
or port, a folder that is not nnatlas's) is one line on stderr and exit status 2, never a
traceback. A new subcommand gets the same by raising ``UserError("nnatlas: what is wrong")`` (or
letting a SpecError / OSError out) from its handler, registered like the ones below.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import build_site, compile_atlas, default_root, generate
from .emit import outdir
from .emit.serve import bind, serve_on
from .errors import SpecError, UserError

EXIT_USER = 2  # a user error: the message says what to change


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache"]:  # the runtime's command (imports torch): its own parser reads the rest
        from nnatlas.cli.cache import main as cache_main

        return cache_main(argv[1:])
    parser = argparse.ArgumentParser(prog="nnatlas", description="The nnatlas spec compiler.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cache", add_help=False, help="run a model over a dataset and write its values to shards "
                   "(nnatlas cache --help)")
    gen = sub.add_parser("generate", help="validate specs/ and regenerate generated/")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when anything is stale")
    gen.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    gen.set_defaults(handler=lambda a: _generate(a.root, a.check))
    docs = sub.add_parser("docs", help="build the static site into one folder (and serve it on loopback)")
    docs.add_argument("--out", type=Path, default=Path("site"),
                      help=f"the folder to write: new, empty, or one nnatlas wrote before (marked {outdir.MARKER}); default: site")
    docs.add_argument("--serve", action="store_true", help="then serve it on 127.0.0.1 until interrupted")
    docs.add_argument("--port", type=int, default=8000, help="the port for --serve (default 8000; 0 picks a free one)")
    docs.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    docs.set_defaults(handler=lambda a: _docs(a.root, a.out, a.serve, a.port))
    _add_new(sub)
    add_draft_parser(sub)
    _add_status(sub)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed usage and the error (or --help): return, do not exit
        return e.code if isinstance(e.code, int) else EXIT_USER
    return user_errors(lambda: args.handler(args))


def _add_new(sub: Any) -> None:
    new = sub.add_parser("new", help="write a starting spec for a family, extending an existing one")
    new.add_argument("family", help="the new family's name (a transformers model_type names its classes)")
    new.add_argument("--from", dest="base", required=True, help="the family it extends (llama, qwen3_5_text ...)")
    new.add_argument("--out", type=Path, default=None, help="the file to write (default: <root>/specs/FAMILY.yaml)")
    new.add_argument("--force", action="store_true", help="overwrite an existing file")
    new.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    new.set_defaults(handler=lambda a: _new(a.family, a.base, a.out, a.root, a.force))


def _new(family: str, base: str, out: Path | None, root: Path | None, force: bool) -> int:
    """``nnatlas new FAMILY --from BASE``: the starting spec, then how to go on."""
    from .newspec import NewSpecError, write_new

    root = checkout(root, "new")
    try:
        path = write_new(family, base, compile_atlas(root / "specs", root), out or root / "specs" / f"{family}.yaml", force)
    except NewSpecError as e:
        raise UserError(str(e)) from None
    print(f"nnatlas: wrote {path}; fill in its TODOs and summary, then `make generate` and `make test` "
          "(every key: docs/spec.md)")
    return 0


def _add_status(sub: Any) -> None:
    st = sub.add_parser("status", help="run every family's generated tests under each transformers version of "
                        "pyproject.toml ([tool.nnatlas] status-transformers), write generated/docs/status.json, regenerate")
    st.add_argument("--versions", default=None,
                    help="comma-separated transformers versions instead of pyproject's list (the first is the pinned one)")
    which = st.add_mutually_exclusive_group()
    which.add_argument("--families", default=None,
                       help="comma-separated families to run (the others keep their last runs from status.json)")
    which.add_argument("--stale", action="store_true",
                       help="run only the families whose last run is missing or saw another spec or other tests")
    st.add_argument("--tp", action="store_true",
                    help="instead: the tensor-parallel column, the TP oracle under torchrun (2 gloo processes) with "
                         "this interpreter's transformers only (no .venv-status)")
    st.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    st.set_defaults(handler=lambda a: _status(a.root, a.versions, a.families, a.stale, a.tp))


def _status(root: Path | None, chosen: str | None, families: str | None = None, only_stale: bool = False,
            tp: bool = False) -> int:
    """``nnatlas status``: the runs (one venv per version under .venv-status/), status.json, then generate;
    ``--tp``: the tensor-parallel column instead (this interpreter only)."""
    from . import compile_atlas
    from .status import status

    root = checkout(root, "status")
    wanted = [v.strip() for v in chosen.split(",") if v.strip()] if chosen else None
    picked = [f.strip() for f in families.split(",") if f.strip()] if families else None
    if tp:
        if wanted or only_stale:
            raise UserError("nnatlas status --tp runs this interpreter's transformers only: no --versions or --stale")
        result = status.run_tp(root, picked)
        cells = [c["result"] for c in result["tp"]["families"].values()]
        print(f"nnatlas: tensor parallel (transformers {result['tp']['transformers']}): "
              + ", ".join(f"{cells.count(r)} {r}" for r in ("pass", "refused", "fail")))
        print(f"nnatlas: wrote {status.PATH}")
        return _generate(root, False)
    if only_stale:
        atlas, previous = compile_atlas(root / "specs", root), status.read(root)
        picked = sorted({f for v in (wanted or status.versions(root)) for f in status.stale(atlas, previous, root, v)})
        print(f"nnatlas: stale: {', '.join(picked) or 'none'}")
    result = status.run(root, wanted, families=picked)
    for v in result["versions"]:
        said = (f"{v['passed']} passed, {v['failed']} failed, {v['collection_errors']} files not collected"
                if v["ran"] else f"did not run: {v['why']}")
        print(f"nnatlas: transformers {v['transformers']}: {said}")
    print(f"nnatlas: wrote {status.PATH}")
    return _generate(root, False)


def user_errors(run: Callable[[], int]) -> int:
    """Run one subcommand; a user error becomes its message on stderr and exit status 2.

    UserError (and GenerateError): its one line. SpecError: every problem, file:line:col, then a
    count. OSError (a path that does not exist, a folder not writable): what and where.
    Ctrl-C: "interrupted", 130. Anything else is a bug in nnatlas and keeps its traceback.
    """
    try:
        return run()
    except SpecError as e:
        print(str(e), file=sys.stderr)
        n = len(e.problems)
        print(f"nnatlas: {n} problem{'s' if n != 1 else ''} in the specs; nothing was written", file=sys.stderr)
        return EXIT_USER
    except UserError as e:
        message = str(e)
        print(message if message.startswith("nnatlas:") else f"nnatlas: {message}", file=sys.stderr)
        return EXIT_USER
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(f"nnatlas: {e.strerror or e}{where}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("nnatlas: interrupted", file=sys.stderr)
        return 130


def is_checkout(root: Path) -> bool:
    """A checkout of nnatlas (what generate, docs, new and status work in): its pyproject.toml and specs/. A
    pip-installed nnatlas carries its specs as package data, but no pyproject.toml and no generated/ to write."""
    return (root / "pyproject.toml").is_file() and (root / "specs" / "_vocabulary.yaml").is_file()


def checkout(root: Path | None, command: str = "", other: str = "") -> Path:
    """The checkout to read specs/ from: ``root`` when given (it must hold a specs/ folder), else the one nnatlas
    is installed from (an editable install), else the current folder when it is one; else one line saying so
    (``other``: what else would do)."""
    if root is None:
        for found in (default_root(), Path.cwd()):
            if is_checkout(found):
                return found
        raise UserError(f"nnatlas {command or 'this command'}: needs a checkout of nnatlas (its pyproject.toml, specs/ "
                        f"and generated/), and this nnatlas is installed without one ({default_root()}): run it inside "
                        f"a checkout, or give --root DIR{other}")
    if not (root / "specs").is_dir():
        what = "does not exist" if not root.exists() else "has no specs/ folder"
        raise UserError(f"nnatlas: --root {root} {what}; give the checkout that holds specs/")
    return root


def _docs(root: Path | None, out: Path, serve: bool, port: int) -> int:
    folder = out.resolve()
    root = checkout(root, "docs")
    outdir.check(folder)
    httpd = bind(port, folder) if serve else None  # a bad or busy port is said before the build
    try:
        written = build_site(folder, root)
        print(f"nnatlas: wrote {len(written)} files to {out}/ (open {out}/index.html)")
        if httpd is not None:
            serve_on(httpd, folder)
    finally:
        if httpd is not None:
            httpd.server_close()
    return 0


def _generate(root: Path | None, check: bool) -> int:
    start = time.perf_counter()
    result = generate(checkout(root, "generate"), check=check)
    took = (time.perf_counter() - start) * 1000
    if check:
        if result.changed or result.removed:
            sys.stdout.write(result.diff)
            print(f"nnatlas: {len(result.changed) + len(result.removed)} generated file(s) are stale; run `make generate`",
                  file=sys.stderr)
            return 1
        print(f"nnatlas: generated/ is up to date ({took:.0f} ms)")
        return 0
    for rel in result.changed:
        print(f"wrote {rel}")
    for rel in result.removed:
        print(f"removed {rel}")
    print(f"nnatlas: {len(result.changed)} written, {len(result.removed)} removed ({took:.0f} ms)")
    return 0


def add_draft_parser(sub: Any) -> None:
    d = sub.add_parser("draft", help="write a first spec for a transformers model type, by machine")
    d.add_argument("model_type", help="a transformers model type (mistral, qwen2, ...)")
    d.add_argument("--out", type=Path, default=None, help="the spec to write (default: specs/MODEL_TYPE.yaml)")
    d.add_argument("--extends", default=None, help="a family the draft extends (written as extends:)")
    d.add_argument("--model", default=None, help="a local checkpoint folder whose config to start from")
    d.add_argument("--config", default=None, help="a config.json or a checkpoint folder: the tiny model the draft "
                   "records and verifies is laid out as it (its structural options kept, its sizes shrunk)")
    d.add_argument("--no-test", action="store_true", help="write the draft only: no generate, no generated tests")
    d.add_argument("--force", action="store_true", help="overwrite --out when it exists (a hand-written spec, say)")
    d.add_argument("--root", type=Path, default=None, help="the checkout whose specs/ the draft compiles with")
    d.set_defaults(handler=run_draft)


def run_draft(args: Any) -> int:
    """``nnatlas draft``: draft, write, then generate and run the family's generated tests."""
    from .draft import DraftError, draft
    from .draft.check import compile_draft, run_tests

    # a checkout's specs/ (written into by default), else the specs a pip-installed nnatlas carries (--out needed)
    if args.root is not None or args.out is None:
        root = checkout(args.root, "draft", " (or --out FILE: the draft is then compiled with the specs this nnatlas carries)")
    else:
        root = next((r for r in (default_root(), Path.cwd()) if is_checkout(r)), default_root())
    try:
        d = draft(args.model_type, model_path=args.config or args.model, extends=args.extends)
    except DraftError as e:
        print(f"nnatlas draft: {e}", file=sys.stderr)
        return 2
    out = args.out or root / "specs" / f"{d.proposal.family}.yaml"
    if out.exists() and not args.force:
        print(f"nnatlas draft: {out} exists; give another --out, or --force to overwrite it", file=sys.stderr)
        return 2
    n_values = sum(len(h.values) for h in d.proposal.hosts.values())
    said = f"({len(d.proposal.hosts)} hosts, {n_values} values, {len(d.proposal.todos)} TODO)"
    if args.no_test:
        _write(out, d.text)
        print(f"nnatlas draft: wrote {out} {said}, untested")
        _todos(d.proposal.todos)
        return 0
    # generate and the generated tests first: only a draft that passes both is written where asked (specs/)
    failures: list[str] = []
    compiled = compile_draft(d.text, d.proposal.family, root / "specs", [args.extends] if args.extends else None)
    if compiled.family is None:
        failures = ["generate: " + line for line in compiled.error.splitlines()]
        report = f"generate: FAILED\n{compiled.error}"
    else:
        run = run_tests(compiled.family)
        report = (f"generate: ok\ngenerated tests: {'ok' if run.ok else 'FAILED'} ({run.passed} passed, {run.failed} "
                  f"failed, {run.errors} errors)")
        if not run.ok:
            failures = [f"generated test failed: {f}" for f in run.failures] or [run.output.strip().splitlines()[-1]]
            report += "\n" + run.output[-4000:]
    if not failures:
        _write(out, d.text)
        print(f"nnatlas draft: wrote {out} {said}")
        _todos(d.proposal.todos)
        print(report)
        return 0
    beside = failing_path(out)
    head = [f"# FAILING DRAFT: not written to {out} ({len(failures)} failure{'s' if len(failures) != 1 else ''}); "
            "fix these, then move it there:"] + [f"#   {' '.join(f.split())}" for f in failures] + ["#"]
    _write(beside, "\n".join(head) + "\n" + d.text)
    print(f"nnatlas draft: the draft FAILED; wrote it to {beside} with its failures at the top, not to {out} {said}")
    _todos(d.proposal.todos)
    print(report)
    return 1


def failing_path(out: Path) -> Path:
    """Where a failing draft is written instead of ``out``: never in a folder of specs (generate reads every
    ``*.yaml`` of specs/): ``drafts/NAME.failing.yaml`` beside a specs/ folder, else ``NAME.failing.yaml`` beside out."""
    name = f"{out.stem}.failing.yaml"
    return out.parent.parent / "drafts" / name if out.parent.name == "specs" else out.with_name(name)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _todos(todos: list[str]) -> None:
    for todo in todos:
        print(f"  TODO {todo}")

if __name__ == "__main__":
    sys.exit(main())
