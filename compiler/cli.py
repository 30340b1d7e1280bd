"""``nnatlas generate [--check]`` and ``nnatlas docs [--serve]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import default_root, generate
from .errors import SpecError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nnatlas", description="The nnatlas spec compiler.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="validate specs/ and regenerate generated/")
    gen.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when anything is stale")
    gen.add_argument("--root", type=Path, default=None, help="the checkout (default: the one nnatlas is installed from)")
    args = parser.parse_args(argv)
    if args.command == "generate":
        return _generate(args.root, args.check)
    return 2


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
