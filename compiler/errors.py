"""Spec problems with their positions, collected so that one run reports them all."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Problem:
    file: str
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


def suggest(name: str, options: Any) -> str:
    """"; did you mean 'x'?" naming the closest option (or the few equally close ones)."""
    scored = sorted(((difflib.SequenceMatcher(None, name, o).ratio(), o) for o in options), key=lambda t: (-t[0], t[1]))
    best = scored[0][0] if scored else 0.0
    close = [o for r, o in scored if r >= 0.6 and r >= best - 0.03][:3]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class SpecError(Exception):
    """One or more problems in the specs; ``str()`` lists each as ``file:line:col: message``."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(set(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


class Problems:
    """A collector: ``add`` as many as you find, then ``raise_if_any``."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, file: str, pos: tuple[int, int], message: str) -> None:
        self.items.append(Problem(file, pos[0], pos[1], message))

    def extend(self, other: list[Problem]) -> None:
        self.items.extend(other)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(self.items)


class UserError(Exception):
    """A mistake in what the user asked (a path, a port, a folder): the CLI prints ``str()`` as one
    line on stderr and exits 2, never a traceback."""


class GenerateError(UserError):
    """A generate that must not write: rendered Python that does not parse, an output folder that
    is not nnatlas's own. Nothing was written."""
