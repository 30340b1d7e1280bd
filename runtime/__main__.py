"""``python -m nnatlas``: the ``nnatlas`` command, so that ``torchrun -m nnatlas cache ...`` runs it.

``cache`` runs here in the runtime; every other command (``generate``, ``docs``) is the compiler's,
imported only when asked for.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache"]:
        from nnatlas.cache_cli import main as cache_main

        return cache_main(argv[1:])
    from nnatlas.compiler.cli import main as compiler_main

    return compiler_main(argv)


if __name__ == "__main__":
    sys.exit(main())
