"""The documents of ``nnatlas cache``: read from a file, tokenized, cut into batches, split by rank.

Everything here is deterministic: every process computes the same plan from the same file, so a
rank knows which batches are its own, where its rows start, and where every other rank's do,
without talking to them; and a resumed run recomputes exactly the batches of the first. By default
the documents are sorted longest first before they are batched (``order="length"``: a batch pads its
documents to about their own length), so rows are stored in that order, not the file's; each row's
``meta.doc`` (and ``meta.position``) says where it is from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NnatlasError

SUFFIXES = (".jsonl", ".txt", ".parquet")
POSITIONS = ("all", "last", "nonpad")


class CacheError(NnatlasError):
    """Bad input to ``nnatlas cache`` (a file, a field, a setting): said on one line, exit status 2."""


def read_texts(path: Path, text_field: str, errors: str = "strict") -> list[str]:
    """The documents of ``path``: a JSON object per line (``.jsonl``, its ``text_field``), a document
    per non-blank line (``.txt``), or a column of a Parquet table (``.parquet``, needs pyarrow).

    Text files are UTF-8: a byte that is not is refused with its line and byte offset, or, with
    ``errors="replace"``, read as U+FFFD (as is a lone surrogate a JSON string escapes)."""
    if not path.is_file():
        raise CacheError(f"--data {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        texts = _jsonl(path, text_field, errors)
    elif suffix == ".txt":
        data = path.read_bytes()
        try:
            whole = data.decode("utf-8", errors)
        except UnicodeDecodeError as e:
            raise _not_utf8(path, data, e) from None
        texts = [line.rstrip("\r\n") for line in whole.splitlines() if line.strip()]
    elif suffix == ".parquet":
        texts = _parquet(path, text_field)
    else:
        raise CacheError(f"--data {path}: not a {', '.join(SUFFIXES)} file")
    if not texts:
        raise CacheError(f"--data {path} holds no documents")
    return texts


def _not_utf8(path: Path, data: bytes, e: UnicodeDecodeError, base: int = 0, line: int = 0) -> CacheError:
    """``e`` raised decoding ``data`` (which starts at byte ``base`` of the file, on line ``line``; 0: count)."""
    at = base + e.start
    if not line:
        line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1)
    return CacheError(f"--data {path}:{line}: byte 0x{data[e.start]:02x} at byte {column} of the line (byte {at} "
                      "of the file) is not UTF-8; fix the file, or pass --errors replace to read such bytes as "
                      "U+FFFD")


def _jsonl(path: Path, field: str, errors: str = "strict") -> list[str]:
    texts = []
    offset = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8", errors)
            except UnicodeDecodeError as e:
                raise _not_utf8(path, raw, e, offset, n) from None
            offset += len(raw)
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
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # a JSON escape of half a surrogate pair: "\ud800"
                if errors == "strict":
                    raise CacheError(f"--data {path}:{n}: field {field!r} holds a lone surrogate "
                                     f"({text[e.start]!r} at character {e.start}), which is no text; fix the "
                                     "file, or pass --errors replace to read it as U+FFFD") from None
                text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
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


# a long text is tokenized in a prefix of PIECE characters per token wanted, grown GROW times while it holds
# too few tokens, up to MOST characters per token; the tokens kept end MARGIN tokens before the cut
PIECE, GROW, MOST, MARGIN = 8, 4, 512, 32


def tokenize(tokenizer: Any, texts: Sequence[str], seq_len: int, chunk: int = 1024) -> list[list[int]]:
    """Token ids of each document, cut to ``seq_len`` tokens (the tokenizer's special tokens included).

    A text is tokenized whole only when it is short (``PIECE * (seq_len + MARGIN)`` characters at most);
    a longer one, in a prefix that is grown until it holds ``MARGIN`` tokens more than are kept, so a
    50 MB line costs memory and time in proportion to ``seq_len``, not to the line. The kept tokens are
    then those of the whole text (tokenizers split text into words before they merge it into tokens,
    and the cut falls ``MARGIN`` tokens after the last one kept), except in a text of more than ``MOST``
    characters per token (one word of megabytes: the prefix stops growing there, and a word the cut
    splits ends where the cut is).
    """
    want = seq_len + MARGIN
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        part = [_prefix(tokenizer, t, want) for t in texts[start:start + chunk]]
        enc = tokenizer(part, truncation=True, max_length=seq_len)
        out += [list(ids) for ids in enc["input_ids"]]
    return out


def _prefix(tokenizer: Any, text: str, want: int) -> str:
    """``text``, or a prefix of it that tokenizes to at least ``want`` tokens (see :func:`tokenize`)."""
    size = PIECE * want
    while len(text) > size:
        if len(tokenizer(text[:size], truncation=True, max_length=want)["input_ids"]) >= want:
            return text[:size]
        if size >= MOST * want:
            return text[:size]
        size = min(size * GROW, MOST * want)
    return text


@dataclass(frozen=True)
class Doc:
    index: int  # the document's record number in the data file (0-based)
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Batch:
    docs: tuple[Doc, ...]
    first_row: int  # the rank's row where this batch's rows start
    rows: int


ORDERS = ("length", "file")


@dataclass(frozen=True)
class Plan:
    """Every rank's batches: ``ranks[r]`` is rank r's, its rows numbered from 0."""

    docs: tuple[Doc, ...]
    ranks: tuple[tuple[Batch, ...], ...]
    order: str = "file"  # the batches' order: "length" (longest documents first) or "file"

    @property
    def tokens(self) -> int:
        return sum(len(d.ids) for d in self.docs)

    def rows(self, rank: int) -> int:
        batches = self.ranks[rank]
        return batches[-1].first_row + batches[-1].rows if batches else 0

    def row_offset(self, rank: int) -> int:
        """Where rank ``rank``'s rows start in the whole run's order (rank 0's first)."""
        return sum(self.rows(r) for r in range(rank))

    def padded(self, rank: int, width: int | None = None) -> int:
        """Token positions rank ``rank``'s forwards run, padding included: each batch as wide as its longest
        document, or ``width`` (``--positions all`` pads every batch to ``--seq-len``)."""
        return sum(_cost(b.docs, width) for b in self.ranks[rank])


def rows_of(doc: Doc, positions: str) -> int:
    return len(doc.ids) if positions == "nonpad" else 1


def _cost(docs: Sequence[Doc], width: int | None = None) -> int:
    return len(docs) * (width or max(len(d.ids) for d in docs))


def plan(ids: Sequence[Sequence[int]], batch_size: int, positions: str, world_size: int,
         max_tokens: int | None = None, order: str = "file", width: int | None = None) -> Plan:
    """The run's documents (file order; empty ones left out; with ``max_tokens``, up to that many tokens,
    the last document cut to fit) in batches of ``batch_size``, split into ``world_size`` contiguous runs
    of batches of about the same cost (token positions, padding included; ``width``: every batch padded to
    it): a batch is the same on one process or many, so its values are too, and the rows' order as well.

    ``order="length"``: the documents sorted longest first (ties in file order) before they are cut into
    batches, so a batch pads its documents to about their own length; the rows are then stored in that
    order (``meta.doc`` says each row's document). ``"file"``: in file order."""
    if order not in ORDERS:
        raise CacheError(f"order {order!r}: one of {', '.join(ORDERS)}")
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
    ordered = sorted(docs, key=lambda d: -len(d.ids)) if order == "length" else docs  # (a stable sort)
    batches = [tuple(ordered[i:i + batch_size]) for i in range(0, len(ordered), batch_size)]
    costs = [_cost(b, width) for b in batches]
    whole = sum(costs)
    ranks: list[list[Batch]] = [[] for _ in range(world_size)]
    before = 0
    for b, cost in zip(batches, costs):
        # the rank whose share of the whole cost holds this batch's middle: contiguous, about even
        r = min(world_size - 1, (2 * before + cost) * world_size // (2 * whole))
        mine = ranks[r]
        row = mine[-1].first_row + mine[-1].rows if mine else 0
        mine.append(Batch(b, row, sum(rows_of(d, positions) for d in b)))
        before += cost
    return Plan(tuple(docs), tuple(tuple(r) for r in ranks), order)


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
