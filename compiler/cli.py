"""``nnatlas generate [--check]`` and ``nnatlas docs [--serve]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from . import build_site, default_root, generate
from .errors import SpecError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nnatlas", description="The nnatlas spec compiler.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="validate specs/ and regenerate generated/")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when anything is stale")
    gen.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    docs = sub.add_parser("docs", help="build the static site into one folder (and serve it on loopback)")
    docs.add_argument("--out", type=Path, default=Path("site"), help="the folder to write (default: site)")
    docs.add_argument("--serve", action="store_true", help="then serve it on 127.0.0.1 until interrupted")
    docs.add_argument("--port", type=int, default=8000, help="the port for --serve (default 8000; 0 picks a free one)")
    docs.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    add_draft_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "draft":
        return run_draft(args)
    if args.command == "generate":
        return _generate(args.root, args.check)
    if args.command == "docs":
        return _docs(args.root, args.out, args.serve, args.port)
    return 2


def _docs(root: Path | None, out: Path, serve: bool, port: int) -> int:
    try:
        written = build_site(out.resolve(), root or default_root())
    except SpecError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"nnatlas: wrote {len(written)} files to {out}/ (open {out}/index.html)")
    if serve:
        serve_dir(out.resolve(), port)
    return 0


def serve_dir(folder: Path, port: int) -> None:
    """Serve ``folder`` on 127.0.0.1 only (never on every interface) until interrupted."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        host, real_port = str(httpd.server_address[0]), httpd.server_address[1]
        print(f"nnatlas: serving {folder} at http://{host}:{real_port}/ (Ctrl-C stops)", flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def _generate(root: Path | None, check: bool) -> int:
    start = time.perf_counter()
    try:
        result = generate(root or default_root(), check=check)
    except SpecError as e:
        print(str(e), file=sys.stderr)
        n = len(e.problems)
        print(f"nnatlas: {n} problem{'s' if n != 1 else ''} in the specs; nothing was written", file=sys.stderr)
        return 2
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
    d.add_argument("--no-test", action="store_true", help="write the draft only: no generate, no generated tests")
    d.add_argument("--force", action="store_true", help="overwrite --out when it exists (a hand-written spec, say)")
    d.add_argument("--root", type=Path, default=None, help="the checkout whose specs/ the draft compiles with")


def run_draft(args: Any) -> int:
    """``nnatlas draft``: draft, write, then generate and run the family's generated tests."""
    from .draft import DraftError, draft
    from .draft.check import compile_draft, run_tests

    root = args.root or default_root()
    try:
        d = draft(args.model_type, model_path=args.model, extends=args.extends)
    except DraftError as e:
        print(f"nnatlas draft: {e}", file=sys.stderr)
        return 2
    out = args.out or root / "specs" / f"{d.proposal.family}.yaml"
    if out.exists() and not args.force:
        print(f"nnatlas draft: {out} exists; give another --out, or --force to overwrite it", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(d.text, encoding="utf-8")
    n_values = sum(len(h.values) for h in d.proposal.hosts.values())
    print(f"nnatlas draft: wrote {out} ({len(d.proposal.hosts)} hosts, {n_values} values, "
          f"{len(d.proposal.todos)} TODO)")
    for todo in d.proposal.todos:
        print(f"  TODO {todo}")
    if args.no_test:
        return 0
    compiled = compile_draft(d.text, d.proposal.family, root / "specs", [args.extends] if args.extends else None)
    if compiled.family is None:
        print(f"generate: FAILED\n{compiled.error}")
        return 1
    print("generate: ok")
    run = run_tests(compiled.family)
    print(f"generated tests: {'ok' if run.ok else 'FAILED'} ({run.passed} passed, {run.failed} failed, "
          f"{run.errors} errors)")
    if not run.ok:
        print(run.output[-4000:])
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
