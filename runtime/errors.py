"""The errors a researcher meets, each saying what went wrong and what fixes it.

The runtime's own: a spec's problems are the compiler's (``nnatlas.compiler.SpecError``), which the
runtime never raises and never imports.
"""

from __future__ import annotations


class NnatlasError(Exception):
    """Base class of nnatlas' runtime errors."""


class Unavailable(NnatlasError):
    """A value this load cannot serve: says why, and which load or call serves it."""


class OutOfOrderError(NnatlasError):
    """A value was asked for after a value that the forward computes later, or used before it exists."""

    def __init__(self, earlier: str, later: str, detail: str = ""):
        self.earlier, self.later = earlier, later
        msg = (f"{later} is computed before {earlier} in the forward, but the trace asked for {earlier} first; "
               f"ask for values in the order the forward computes them (read {later} before {earlier})")
        super().__init__(msg + (f". {detail}" if detail else ""))


class NotReached(NnatlasError):
    """The forward finished without computing a value the trace asked for."""


class InputError(NnatlasError, ValueError):
    """An input or an edit that cannot be what the forward takes: says what was expected."""


class UnknownName(NnatlasError, AttributeError):
    """A standard or native name that does not exist on this host; names the nearest ones."""


__all__ = ["InputError", "NnatlasError", "Unavailable", "OutOfOrderError", "NotReached", "UnknownName"]
