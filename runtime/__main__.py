"""``python -m nnatlas``: the ``nnatlas`` command, so that ``torchrun -m nnatlas cache ...`` runs it.

``cache`` runs here in the runtime; every other command (``generate``, ``docs``) is the compiler's,
imported only when asked for.
"""

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cache"]:
        from nnatlas.cli.cache import main as cache_main

        return cache_main(argv[1:])
    from nnatlas.compiler.cli import main as compiler_main

    return compiler_main(argv)


def exit_process(code: int) -> None:
    """Exit with ``code``. Under torchrun (WORLD_SIZE > 1) the process leaves without running C++
    static destructors: with the process group already destroyed, gloo's leftover threads made
    interpreter shutdown abort a rank now and then under load ("terminate called without an active
    exception", SIGABRT), failing a run whose every file was written."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
