"""Reading the spec folder: each file's text, sha256 and located data (``parse_sources``), pydantic's
errors as positioned problems, and the shared files every family reads: the vocabulary (checked here), the
shared notes, the papers and the parts (each validated on its own, before any family includes one).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nnatlas.spec import DTYPES, Layout
from nnatlas.trace import conditions

from ..errors import Problem, Problems, suggest
from ..language import names
from ..language.models import NoteRaw, PartRaw, Vocabulary
from ..language.yamlpos import Located, load
from ..language.yamlpos import Path as DataPath

VOCABULARY = "_vocabulary.yaml"
SHARED_NOTES = "_notes.yaml"  # groups of notes written once, referenced by families as {shared: NAME}
PAPERS = "_papers.yaml"  # checkpoint id -> the arXiv id of its paper, or {none: why}: the pages link both
_ARXIV = re.compile(r"\d{4}\.\d{4,5}")
PARTS = "parts"  # specs/parts/<part>.yaml: fragments families include (no family: nothing generated for one)


@dataclass
class Source:
    """One spec file: its text, sha256 and located data."""

    rel: str
    text: str
    sha256: str
    located: Located


def pydantic_problems(e: ValidationError, pos: Any) -> list[Problem]:
    out = []
    errors = e.errors()
    locs = [tuple(x for x in err["loc"] if not (isinstance(x, str) and x in _UNION_TAGS)) for err in errors]
    for err, loc in zip(errors, locs):
        if any(len(other) > len(loc) and other[: len(loc)] == loc for other in locs):
            continue  # a union's branch that did not take the shape: the deeper error says what is wrong
        file, (line, col) = pos(loc, err["type"] == "extra_forbidden")
        where = ".".join(str(x) for x in loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and loc[-1] in ("meaning", "layout") and "values" in loc[:-1]:
            msg = (f"'{loc[-1]}' does not belong in a family: a value's meaning and layout are written once, in "
                   f"specs/{VOCABULARY} (under values:, or streams.<stream>: for a host with a stream), so every page "
                   f"says the same; here say only where it is read (read, view, needs ...)")
        elif err["type"] == "extra_forbidden":
            parent = loc[:-1]
            msg = f"unknown key '{loc[-1]}'" + (f" under '{'.'.join(map(str, parent))}'" if parent else "")
        elif where:
            msg = f"{where}: {msg}"
        out.append(Problem(file, line, col, msg))
    # pydantic reports one error per union branch; keep the first per position and path
    seen: set[tuple[str, int, int, str]] = set()
    kept = []
    for p in out:
        key = (p.file, p.line, p.col, p.message.split(":")[0])
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


_UNION_TAGS = {"str", "ValueRaw", "IdentityRaw", "list[nullable[union[str,int,float,bool]]]", "list[str]",
               "int", "float", "bool", "none", "function-after[check(), ValueRaw]", "NoteRaw", "SharedNoteRaw",
               "UnavailableRaw"}


def read_sources(spec_dir: Path, root: Path) -> tuple[dict[str, Source], list[Problem]]:
    files = []
    for path in sorted(spec_dir.glob("*.yaml")):
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
        files.append((path.name, rel, path.read_bytes()))
    return parse_sources(files)


def parse_sources(files: list[tuple[str, str, bytes]]) -> tuple[dict[str, Source], list[Problem]]:
    """(file name, path shown in messages, bytes) for each spec file → its located data."""
    sources: dict[str, Source] = {}
    problems: list[Problem] = []
    for name, rel, raw in files:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(Problem(rel, 1, 1, f"not UTF-8: {e.reason}"))
            continue
        located, probs = load(text, rel)
        problems.extend(probs)
        if located is not None:
            sources[name] = Source(rel, text, hashlib.sha256(raw).hexdigest(), located)
    return sources, problems


def read_papers(src: Source | None, checkpoints: set[str], found: Problems) -> tuple[tuple[str, str], ...]:
    """specs/_papers.yaml: CHECKPOINT: ARXIV_ID (2407.21783), or CHECKPOINT: {none: why} where no paper is
    known. (checkpoint, arXiv id) for each checkpoint some family records that has a paper."""
    if src is None:
        return ()
    data = src.located.data
    if not isinstance(data, dict):
        found.add(src.rel, (1, 1), "the papers are a mapping CHECKPOINT: ARXIV_ID or CHECKPOINT: {none: why}")
        return ()
    out = []
    for name, paper in data.items():
        at = src.located.pos((name,))
        if isinstance(paper, str) and _ARXIV.fullmatch(paper):
            if name in checkpoints:  # a checkpoint no family records (its family removed) links nothing
                out.append((name, paper))
        elif not (isinstance(paper, dict) and list(paper) == ["none"] and isinstance(paper["none"], str)):
            found.add(src.rel, at, f"'{name}': an arXiv id such as 2407.21783, or {{none: why}}")
    return tuple(sorted(out))


def read_parts(sources: dict[str, Source], found: Problems) -> dict[str, tuple[Source, PartRaw]]:
    """specs/parts/*.yaml, validated on their own: name → (source, model)."""
    out: dict[str, tuple[Source, PartRaw]] = {}
    for fname, src in sources.items():
        loc = src.located
        name = loc.data.get("part")
        if name != fname.removesuffix(".yaml"):
            found.add(src.rel, loc.pos(("part",)), f"a part says its name: 'part: {fname.removesuffix('.yaml')}' "
                      f"(specs/{PARTS}/{fname})")
            continue
        try:
            raw = PartRaw.model_validate(loc.data)
        except ValidationError as e:
            found.extend(pydantic_problems(e, lambda p, key, loc=loc: (loc.file, loc.pos(p, key))))
            continue
        for path, h in raw.hosts.items():
            if h.cls is not None and h.cls not in raw.classes:
                found.add(src.rel, loc.pos(("hosts", path, "class")), f"part {name}: host '{path}' has class "
                          f"'{h.cls}', which is not one of the part's classes ({', '.join(raw.classes) or 'none'}): "
                          "list it under 'classes' for the families to map")
        out[name] = (src, raw)
    return out


def read_shared_notes(src: Source | None, found: Problems) -> dict[str, list[NoteRaw]]:
    """specs/_notes.yaml: NAME: [ {title, body}, ... ], each group written once for every page that names it."""
    if src is None:
        return {}
    data = src.located.data
    if not isinstance(data, dict):
        found.add(src.rel, (1, 1), "the shared notes are a mapping NAME: [ {title, body}, ... ]")
        return {}
    out: dict[str, list[NoteRaw]] = {}
    for name, group in data.items():
        if not isinstance(group, list) or not group:
            found.add(src.rel, src.located.pos((name,)), f"shared notes '{name}': a non-empty list of {{title, body}}")
            continue
        notes = []
        for k, item in enumerate(group):
            try:
                notes.append(NoteRaw.model_validate(item))
            except ValidationError as e:
                loc = src.located
                found.extend(pydantic_problems(
                    e, lambda p, key, k=k, name=name, loc=loc: (loc.file, loc.pos((name, k, *p), key))))
        out[name] = notes
    return out


def check_vocabulary(vocab: Vocabulary, src: Source, found: Problems) -> dict[str, Layout]:
    tables: list[tuple[DataPath, str, Any]] = [
        (("dims",), "dim", vocab.dims), (("layouts",), "layout", vocab.layouts), (("values",), "value", vocab.values),
        (("streams",), "stream", vocab.streams), (("conditions",), "condition", vocab.conditions),
        *((("streams", s), "value", t) for s, t in vocab.streams.items())]
    for at, what, table in tables:
        for name in table:
            bad = names.problem(name, f"{what} name")
            if bad:
                found.add(src.rel, src.located.pos((*at, name), key=True), bad)
    for cname, cond in vocab.conditions.items():
        if cond.attribute is not None and (bad := names.problem(cond.attribute, "attribute")):
            found.add(src.rel, src.located.pos(("conditions", cname, "attribute")), f"condition {cname}: {bad}")
        elif cond.attribute is None and not cond.never and not conditions.decided_here(cname, cond.kind):
            known = conditions.LOAD if cond.kind == "load" else conditions.CALL
            found.add(src.rel, src.located.pos(("conditions", cname), key=True),
                      f"condition {cname}: the runtime decides no {cond.kind} condition of that name (it decides "
                      f"{', '.join(known)}); name a config attribute and its values, or mark it never: true")
    layouts: dict[str, Layout] = {}
    for name, lay in vocab.layouts.items():
        dims = tuple(lay.dims.split())
        line, col = src.located.pos(("layouts", name, "dims"))
        for d in dims:
            if d not in vocab.dims and names.is_name(d):
                offset = f" {lay.dims} ".find(f" {d} ")  # the word's column inside a one-line value
                found.add(src.rel, (line, col + max(offset, 0)), f"layout {name}: unknown dim '{d}'" + suggest(d, vocab.dims))
        if lay.dtype not in ("float", "long", "bool", "object"):
            found.add(src.rel, src.located.pos(("layouts", name, "dtype")), f"layout {name}: dtype is float, long, bool or object")
        layouts[name] = Layout(name, dims, DTYPES.get(lay.dtype, "float"), lay.optional)  # (any other: reported above)
    value_tables: list[tuple[DataPath, Any]] = [(("values",), vocab.values)] + [(("streams", s), t) for s, t in vocab.streams.items()]
    for path, table in value_tables:
        for vname, v in table.items():
            if v.layout not in layouts:
                found.add(src.rel, src.located.pos((*path, vname, "layout")), f"value {vname}: unknown layout '{v.layout}'" + suggest(v.layout, layouts))
    return layouts
