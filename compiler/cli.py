"""``nnatlas generate [--check]``, ``nnatlas docs [--serve]`` and ``nnatlas new FAMILY --from BASE``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from . import build_site, compile_atlas, default_root, generate
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
    _add_new(sub)
    args = parser.parse_args(argv)
    if args.command == "new":
        return _new(args.family, args.base, args.out, args.root, args.force)
    if args.command == "generate":
        return _generate(args.root, args.check)
    if args.command == "docs":
        return _docs(args.root, args.out, args.serve, args.port)
    return 2


def _add_new(sub: Any) -> None:
    new = sub.add_parser("new", help="write a starting spec for a family, extending an existing one")
    new.add_argument("family", help="the new family's name (a transformers model_type names its classes)")
    new.add_argument("--from", dest="base", required=True, help="the family it extends (llama, qwen3_5_text ...)")
    new.add_argument("--out", type=Path, default=None, help="the file to write (default: <root>/specs/FAMILY.yaml)")
    new.add_argument("--force", action="store_true", help="overwrite an existing file")
    new.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")


def _new(family: str, base: str, out: Path | None, root: Path | None, force: bool) -> int:
    """``nnatlas new FAMILY --from BASE``: the starting spec, then how to go on."""
    from .newspec import NewSpecError, write_new

    root = root or default_root()
    try:
        path = write_new(family, base, compile_atlas(root / "specs", root), out or root / "specs" / f"{family}.yaml", force)
    except (SpecError, NewSpecError) as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"nnatlas: wrote {path}; fill in its TODOs and summary, then `make generate` and `make test` "
          "(every key: docs/spec.md)")
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
