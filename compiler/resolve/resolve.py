"""specs/*.yaml → a validated, resolved :class:`Atlas`.

Loads every file keeping positions, merges ``extends:`` chains, validates with pydantic and
then checks what pydantic cannot see (value names against the vocabulary, read points,
identities, views, draws, notes' code). Every problem is collected; one :class:`SpecError`
lists them all as ``file:line:col: message``.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from ..errors import Problem, Problems
from ..language import names
from ..language.ir import Atlas, FamilyIR
from ..language.models import FamilyRaw, Vocabulary
from .family import Family
from .merge import extends_chain
from .sources import (
    PAPERS,
    PARTS,
    SHARED_NOTES,
    VOCABULARY,
    Source,
    check_vocabulary,
    parse_sources,
    pydantic_problems,
    read_papers,
    read_parts,
    read_shared_notes,
    read_sources,
)

_FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]*")


def resolve(spec_dir: Path, root: Path | None = None) -> Atlas:
    root = root or spec_dir.parent
    return resolve_sources(*read_sources(spec_dir, root), spec_dir.name, read_sources(spec_dir / PARTS, root))


def resolve_texts(texts: dict[str, str], folder: str = "specs") -> Atlas:
    """The same from memory: file name (``gpt2.yaml``, ``parts/qwen_vit.yaml``) → its text, shown as
    ``folder/name``."""

    def parse(part: bool) -> tuple[dict[str, Source], list[Problem]]:
        return parse_sources([(name.removeprefix(f"{PARTS}/"), f"{folder}/{name}", text.encode("utf-8", "surrogatepass"))
                              for name, text in sorted(texts.items()) if name.startswith(f"{PARTS}/") == part])

    return resolve_sources(*parse(False), folder, parse(True))


def resolve_sources(sources: dict[str, Source], problems: list[Problem], folder: str,
             part_files: tuple[dict[str, Source], list[Problem]]) -> Atlas:
    found = Problems()
    found.extend(problems)
    vocab_src = sources.pop(VOCABULARY, None)
    if vocab_src is None:
        if not any(p.file.endswith(VOCABULARY) for p in problems):
            found.add(f"{folder}/{VOCABULARY}", (1, 1), "the shared vocabulary is missing")
        found.raise_if_any()
        raise AssertionError("unreachable")
    try:
        vocab = Vocabulary.model_validate(vocab_src.located.data)
    except ValidationError as e:
        loc = vocab_src.located
        found.extend(pydantic_problems(e, lambda p, key: (loc.file, loc.pos(p, key))))
        found.raise_if_any()
        raise AssertionError("unreachable") from None
    vocab_found = Problems()
    layouts = check_vocabulary(vocab, vocab_src, vocab_found)
    if vocab_found.items:  # every family reads the vocabulary: its problems would only echo there
        found.extend(vocab_found.items)
        found.raise_if_any()
    shared = read_shared_notes(sources.pop(SHARED_NOTES, None), found)
    papers_src = sources.pop(PAPERS, None)
    part_sources, part_problems = part_files
    found.extend(part_problems)
    parts = read_parts(part_sources, found)

    families: list[FamilyIR] = []
    by_name: dict[str, Source] = {}
    for fname, src in sources.items():
        name = src.located.data.get("family")
        if not isinstance(name, str) or not _FAMILY_NAME.fullmatch(name) or not names.is_name(name):
            found.add(src.rel, src.located.pos(("family",)), "'family' must be a lowercase name like qwen3_next "
                      "(not a Python keyword)")
            continue
        if name != fname.removesuffix(".yaml"):
            found.add(src.rel, src.located.pos(("family",)), f"family '{name}' must live in specs/{name}.yaml")
            continue
        by_name[name] = src
    orders: dict[str, list[str] | None] = {}
    for name, src in by_name.items():
        merged = extends_chain(name, by_name, found, orders, parts)
        if merged is None:
            continue
        try:
            raw = FamilyRaw.model_validate(merged.data)
        except ValidationError as e:
            found.extend(pydantic_problems(e, merged.pos))
            continue
        fam = Family(src, merged, raw, vocab, layouts, found, shared).build()
        if fam is not None:
            families.append(fam)
    papers = read_papers(papers_src, {c.name for f in families for c in f.checkpoints}, found)
    found.raise_if_any()
    all_sources = sorted([(vocab_src.rel, vocab_src.sha256), *((s.rel, s.sha256) for s in sources.values()),
                          *((s.rel, s.sha256) for s, _ in parts.values()),
                          *([(papers_src.rel, papers_src.sha256)] if papers_src else [])])
    return Atlas(tuple(sorted(families, key=lambda f: f.name)), tuple(layouts.values()),
                 tuple(vocab.dims.items()), vocab_src.rel, vocab_src.sha256, tuple(all_sources), papers)


__all__ = ["resolve", "resolve_texts", "resolve_sources"]
