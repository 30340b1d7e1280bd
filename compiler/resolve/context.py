"""The one family being resolved, as every part of its resolution sees it: its source, merged data and
pydantic model, the vocabulary and layouts, where problems go (``err``, which also marks the family not built)
and where a path sits in the files (``at``). The parts (hosts, identities, tiny, notes) are mixins over it.
"""

from __future__ import annotations

from nnatlas.spec import Layout

from ..errors import Problems
from ..language.models import FamilyRaw, NoteRaw, Vocabulary
from ..language.yamlpos import Path as DataPath
from .merge import Merged
from .sources import Source


class FamilyContext:
    """One merged family's data and where its problems go."""

    def __init__(self, src: Source, merged: Merged, raw: FamilyRaw, vocab: Vocabulary,
                 layouts: dict[str, Layout], found: Problems, shared: dict[str, list[NoteRaw]] | None = None):
        self.src, self.merged, self.raw, self.vocab, self.layouts, self.found = src, merged, raw, vocab, layouts, found
        self.shared = shared or {}
        self.ok = True
        self.groups: dict[str, str] = {}

    def at(self, path: DataPath, key: bool = False) -> tuple[str, int, int]:
        file, (line, col) = self.merged.pos(path, key)
        return (file, line, col)

    def err(self, path: DataPath, message: str, key: bool = False, col: int = 0) -> None:
        file, (line, c) = self.merged.pos(path, key)
        self.found.add(file, (line, c + col if col and not key else c), message)
        self.ok = False

