"""A family's notes: its own and the shared groups it names, each example block parsed (the generated tests
run them), and the gradients note every page ends with.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ..errors import suggest
from ..language.ir import NoteIR
from ..language.models import NoteRaw, SharedNoteRaw
from .context import FamilyContext
from .sources import SHARED_NOTES

_CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# the note every family's page ends with (its examples run in every family's generated tests)
GRADIENTS_BODY = (Path(__file__).resolve().parent.parent / "emit" / "templates" / "note_gradients.md").read_text(encoding="utf-8")
GRADIENTS_NOTE = NoteIR("Gradients", GRADIENTS_BODY.strip(), tuple(_CODE_BLOCK.findall(GRADIENTS_BODY)))


class NoteChecks(FamilyContext):
    """The notes of a family's page."""

    def notes(self) -> tuple[NoteIR, ...]:
        flat: list[tuple[int, NoteRaw, str | None]] = []
        for k, item in enumerate(self.raw.notes):
            if isinstance(item, SharedNoteRaw):
                group = self.shared.get(item.shared)
                if group is None:
                    self.err(("notes", k, "shared"), f"unknown shared notes '{item.shared}' (specs/{SHARED_NOTES})"
                             + suggest(item.shared, self.shared))
                    continue
                flat += [(k, n, item.shared) for n in group]
            else:
                flat.append((k, item, None))
        out = []
        for k, note, shared in flat:
            examples = []
            for block in _CODE_BLOCK.findall(note.body):
                try:
                    ast.parse(block)
                except SyntaxError as e:
                    where = f" (shared notes '{shared}')" if shared else ""
                    self.err(("notes", k) if shared else ("notes", k, "body"),
                             f"note '{note.title}'{where}: example does not parse: {e.msg} (line {e.lineno} of the block)")
                    continue
                examples.append(block)
            out.append(NoteIR(note.title, note.body.strip(), tuple(examples), shared, note.load))
        return (*out, GRADIENTS_NOTE)
