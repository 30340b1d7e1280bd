"""``nnatlas generate [--check]``, ``nnatlas docs [--serve]``; ``nnatlas cache`` is the runtime's
(``nnatlas.cache_cli``), handed its arguments whole."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import build_site, default_root, generate
from .errors import SpecError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache"]:  # the runtime's command (imports torch): its own parser reads the rest
        from nnatlas.cache_cli import main as cache_main

        return cache_main(argv[1:])
    parser = argparse.ArgumentParser(prog="nnatlas", description="The nnatlas spec compiler.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cache", add_help=False, help="run a model over a dataset and write its values to shards "
                   "(nnatlas cache --help)")
    gen = sub.add_parser("generate", help="validate specs/ and regenerate generated/")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when anything is stale")
    gen.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    docs = sub.add_parser("docs", help="build the static site into one folder (and serve it on loopback)")
    docs.add_argument("--out", type=Path, default=Path("site"), help="the folder to write (default: site)")
    docs.add_argument("--serve", action="store_true", help="then serve it on 127.0.0.1 until interrupted")
    docs.add_argument("--port", type=int, default=8000, help="the port for --serve (default 8000; 0 picks a free one)")
    docs.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
