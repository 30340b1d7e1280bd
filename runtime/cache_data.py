"""The documents of ``nnatlas cache``: read from a file, tokenized, cut into batches, split by rank.

Everything here is deterministic: every process computes the same plan from the same file, so a
rank knows which batches are its own, where its rows start, and where every other rank's do,
without talking to them; and a resumed run recomputes exactly the batches of the first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import NnatlasError

SUFFIXES = (".jsonl", ".txt", ".parquet")
POSITIONS = ("all", "last", "nonpad")


class CacheError(NnatlasError):
    """Bad input to ``nnatlas cache`` (a file, a field, a setting): said on one line, exit status 2."""


def read_texts(path: Path, text_field: str) -> list[str]:
    """The documents of ``path``: a JSON object per line (``.jsonl``, its ``text_field``), a document
    per non-blank line (``.txt``), or a column of a Parquet table (``.parquet``, needs pyarrow)."""
    if not path.is_file():
        raise CacheError(f"--data {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        texts = _jsonl(path, text_field)
    elif suffix == ".txt":
        texts = [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    elif suffix == ".parquet":
        texts = _parquet(path, text_field)
    else:
        raise CacheError(f"--data {path}: not a {', '.join(SUFFIXES)} file")
    if not texts:
        raise CacheError(f"--data {path} holds no documents")
    return texts


def _jsonl(path: Path, field: str) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise CacheError(f"--data {path}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(record, dict):
                raise CacheError(f"--data {path}:{n}: a {type(record).__name__}, not a JSON object")
            if field not in record:
                fields = ", ".join(sorted(record)) or "none"
                raise CacheError(f"--data {path}:{n} has no field {field!r} (its fields: {fields}); "
                                 "name the text with --text-field")
            text = record[field]
            if not isinstance(text, str):
                raise CacheError(f"--data {path}:{n}: field {field!r} is a {type(text).__name__}, not text")
            texts.append(text)
    return texts


def _parquet(path: Path, field: str) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CacheError(f"--data {path}: reading Parquet needs pyarrow, which is not installed "
                         "(pip install 'nnatlas[parquet]'), or pass .jsonl / .txt") from None
    try:
        schema = pq.read_schema(path)
    except Exception as e:  # pyarrow's errors have no common base worth naming
        raise CacheError(f"--data {path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if field not in schema.names:
        raise CacheError(f"--data {path} has no column {field!r} (its columns: {', '.join(schema.names)}); "
                         "name the text with --text-field")
    column = pq.read_table(path, columns=[field]).column(field).to_pylist()
    bad = next((i for i, t in enumerate(column) if not isinstance(t, str)), None)
    if bad is not None:
        raise CacheError(f"--data {path}: row {bad} of column {field!r} is a {type(column[bad]).__name__}, not text")
    return column  # type: ignore[no-any-return]


def tokenize(tokenizer: Any, texts: Sequence[str], seq_len: int, chunk: int = 1024) -> list[list[int]]:
    """Token ids of each document, cut to ``seq_len`` tokens (the tokenizer's special tokens included)."""
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        enc = tokenizer(list(texts[start:start + chunk]), truncation=True, max_length=seq_len)
        out += [list(ids) for ids in enc["input_ids"]]
    return out


@dataclass(frozen=True)
class Doc:
    index: int  # the document's record number in the data file (0-based)
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Batch:
    docs: tuple[Doc, ...]
    first_row: int  # the rank's row where this batch's rows start
    rows: int


@dataclass(frozen=True)
class Plan:
    """Every rank's batches: ``ranks[r]`` is rank r's, its rows numbered from 0."""

    docs: tuple[Doc, ...]
    ranks: tuple[tuple[Batch, ...], ...]

    @property
    def tokens(self) -> int:
        return sum(len(d.ids) for d in self.docs)

    def rows(self, rank: int) -> int:
        batches = self.ranks[rank]
        return batches[-1].first_row + batches[-1].rows if batches else 0

    def row_offset(self, rank: int) -> int:
        """Where rank ``rank``'s rows start in the whole run's order (rank 0's first)."""
        return sum(self.rows(r) for r in range(rank))


def rows_of(doc: Doc, positions: str) -> int:
    return len(doc.ids) if positions == "nonpad" else 1


def plan(ids: Sequence[Sequence[int]], batch_size: int, positions: str, world_size: int,
         max_tokens: int | None = None) -> Plan:
    """Documents in file order (empty ones left out; with ``max_tokens``, up to that many tokens, the
    last document cut to fit), in batches of ``batch_size``, split into ``world_size`` contiguous runs
    of batches: a batch is the same on one process or many, so its values are too."""
    docs: list[Doc] = []
    total = 0
    for i, doc_ids in enumerate(ids):
        if max_tokens is not None and total >= max_tokens:
            break
        keep = tuple(doc_ids) if max_tokens is None else tuple(doc_ids[:max_tokens - total])
        if keep:
            docs.append(Doc(i, keep))
            total += len(keep)
    if not docs:
        raise CacheError("no document has a token to run (every text tokenized to nothing)")
    batches = [tuple(docs[i:i + batch_size]) for i in range(0, len(docs), batch_size)]
    ranks = []
    for r in range(world_size):
        lo, hi = len(batches) * r // world_size, len(batches) * (r + 1) // world_size
        row = 0
        mine = []
        for b in batches[lo:hi]:
            n = sum(rows_of(d, positions) for d in b)
            mine.append(Batch(b, row, n))
            row += n
        ranks.append(tuple(mine))
    return Plan(tuple(docs), tuple(ranks))


def parse_layers(text: str | None) -> list[int] | None:
    """``0-3`` / ``0,2,5-7`` / ``all`` (or nothing): block indices, None for every block."""
    if text is None or text.strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                out += range(a, b + 1)
            else:
                out.append(int(lo))
        except ValueError:
            raise CacheError(f"--layers {text!r}: write block indices as 0-3, 0,2,5-7 or all") from None
    return out
