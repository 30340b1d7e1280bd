"""specs/*.yaml → a validated, resolved :class:`Atlas`.

Loads every file keeping positions, merges ``extends:`` chains, validates with pydantic and
then checks what pydantic cannot see (value names against the vocabulary, read points,
identities, views, draws, notes' code). Every problem is collected; one :class:`SpecError`
lists them all as ``file:line:col: message``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nnatlas.spec import CALL_DIMS, DTYPES, INPUT_DIMS, Condition, Layout, ReadPoint
from nnatlas.trace import conditions

from ..errors import Problem, Problems, SpecError
from ..language import expr, names, readpoint
from ..language.ir import (
    DEFAULT_BLOCK,
    DEFAULT_TEXT,
    MAX_BLOCKS,
    REQUIRED_CONFIG,
    Atlas,
    CheckpointIR,
    DiagramIR,
    DrawIR,
    FamilyIR,
    FunctionIR,
    HostIR,
    IdentityIR,
    NoteIR,
    TinyIR,
    ValueIR,
    config_value,
)
from ..language.models import (
    FamilyRaw,
    HostRaw,
    IdentityRaw,
    NoteRaw,
    PartRaw,
    SharedNoteRaw,
    UnavailableRaw,
    ValueRaw,
    Vocabulary,
)
from ..language.presets import PRESETS
from ..language.yamlpos import Located, load
from ..language.yamlpos import Path as DataPath

VOCABULARY = "_vocabulary.yaml"
EXPERTS_IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")  # what transformers runs on CPU
SHARED_NOTES = "_notes.yaml"  # groups of notes written once, referenced by families as {shared: NAME}
PAPERS = "_papers.yaml"  # checkpoint id -> the arXiv id of its paper, or {none: why}: the pages link both
_ARXIV = re.compile(r"\d{4}\.\d{4,5}")
PARTS = "parts"  # specs/parts/<part>.yaml: fragments families include (no family: nothing generated for one)
_EDITS = ("logits", "later", "none")
MIN_EXAMPLES, MAX_EXAMPLES = 3, 1000  # hypothesis examples per generated test (fewer draws too little of the config space)
MAX_TINY_RANGE = 4096  # the largest batch or sequence a generated test may draw
_HOST_PATH = re.compile(r"model|[a-z_][a-z0-9_]*(\[i\])?(\.[a-z_][a-z0-9_]*(\[(i|[0-9]{1,4})\])?)*")
# a list item of a block (layers[i].self_attn[0]: LongCat-Flash's two attentions a block): a fixed index, below [i]
_LIST_ITEM = re.compile(r"\[([0-9]+)\]")
_FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]*")
_CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
# the note every family's page ends with (its examples run in every family's generated tests)
GRADIENTS_BODY = (Path(__file__).resolve().parent.parent / "emit" / "templates" / "note_gradients.md").read_text(encoding="utf-8")
GRADIENTS_NOTE = NoteIR("Gradients", GRADIENTS_BODY.strip(), tuple(_CODE_BLOCK.findall(GRADIENTS_BODY)))


def suggest(name: str, options: Any) -> str:
    """"; did you mean 'x'?" naming the closest option (or the few equally close ones)."""
    scored = sorted(((difflib.SequenceMatcher(None, name, o).ratio(), o) for o in options), key=lambda t: (-t[0], t[1]))
    best = scored[0][0] if scored else 0.0
    close = [o for r, o in scored if r >= 0.6 and r >= best - 0.03][:3]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


@dataclass
class Source:
    """One spec file: its text, sha256 and located data."""

    rel: str
    text: str
    sha256: str
    located: Located


@dataclass
class Merged:
    """A family's data after ``extends:``, each path remembering the file that set it."""

    data: dict[str, Any]
    where: dict[DataPath, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    keys: dict[DataPath, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    parts: list[Source] = field(default_factory=list)  # the parts the family includes

    def pos(self, path: DataPath, key: bool = False) -> tuple[str, tuple[int, int]]:
        p = tuple(path)
        while True:
            if key and p in self.keys:
                return self.keys[p]
            if not key and p in self.where:
                return self.where[p]
            if p in self.keys:
                return self.keys[p]
            if not p:
                return next(iter(self.where.values()))
            p = p[:-1]


def _droppable(path: DataPath) -> bool:
    return bool(path) and (path[-1] == "values"
                           or path in (("hosts",), ("rename",), ("config",), ("tiny",), ("tiny", "draw")))


def _layer(loc: Located) -> Merged:
    """One file's data as a merge layer: every path positioned in that file."""
    return Merged(_deepcopy(loc.data), {p: (loc.file, v) for p, v in loc.values.items()},
                  {p: (loc.file, v) for p, v in loc.keys.items()})


OWN_ONLY = ("notes", "checkpoints")  # never inherited: a family's own, or the base's and its own with `notes+:`
EXPLICIT = ("identities",)  # over inherited ones, say how: `identities+:` appends, `identities=:` replaces


def _merge(base: Merged, top: Merged, found: Problems | None = None, inheriting: bool = True) -> Merged:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) is replaced;
    ``name: null`` drops an inherited entry of ``values``, ``hosts``, ``rename``, ``config``, ``tiny``
    or ``tiny.draw`` (elsewhere null is a value: ``tiny.config`` passes it to the config class).
    ``name+: [...]`` appends to an inherited list, ``name=: [...]`` replaces it; over inherited
    identities one of the two is required (a plain ``identities:`` there is an error).
    Positions follow what was set."""
    return _Merge(base, top, found, inheriting).out


class _Merge:
    """One ``_merge`` (methods, not nested functions: a recursive closure is a reference cycle, which
    would keep every merge's position tables alive until the cycle collector runs)."""

    def __init__(self, base: Merged, top: Merged, found: Problems | None, inheriting: bool):
        self.base, self.top, self.found, self.inheriting = base, top, found, inheriting
        self.out = Merged(_deepcopy(base.data), dict(base.where), dict(base.keys))
        self.walk(self.out.data, top.data, ())
        if () in top.where:
            self.out.where.setdefault((), top.where[()])

    def err(self, path: DataPath, message: str) -> None:
        if self.found is not None:
            file, pos = self.top.pos(path, key=True)
            self.found.add(file, pos, message)

    def moved(self, tp: DataPath, p: DataPath, value: Any, offset: int) -> None:
        """``value``, top's at ``tp``, now sits at ``p``, a list's items ``offset`` further on: its positions go
        with it, looked up path by path over its own entries (a table of top's paths by prefix cost each merge
        top's size times its depth, squared: a third of the compile)."""
        where, keys = self.top.where, self.top.keys
        stack: list[tuple[DataPath, Any]] = [((), value)]
        while stack:
            rest, v = stack.pop()
            q, moved = (*tp, *rest), rest
            if rest and isinstance(rest[0], int):
                moved = (rest[0] + offset, *rest[1:])
            if q in where:
                self.out.where[(*p, *moved)] = where[q]
            if q in keys:
                self.out.keys[(*p, *moved)] = keys[q]
            if isinstance(v, dict):
                stack.extend(((*rest, k), x) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend(((*rest, i), x) for i, x in enumerate(v))

    def walk(self, dst: dict[str, Any], src: dict[str, Any], path: DataPath) -> None:
        for key, value in src.items():
            name, how = (key[:-1], key[-1]) if len(key) > 1 and key[-1] in "+=" else (key, None)
            p, tp = (*path, name), (*path, key)
            self.out.keys[p] = self.top.pos(tp, key=True)
            if how is not None:
                if name in src:
                    self.err(tp, f"'{key}' and '{name}' in one mapping: give one")
                    continue
                if not isinstance(value, list):
                    self.err(tp, f"'{key}' takes a list ({name}{how} {'appends to' if how == '+' else 'replaces'} "
                                 f"the inherited {name})")
                    continue
                if how == "+" and isinstance(dst.get(name), list):
                    offset = len(dst[name])
                    dst[name] = dst[name] + _deepcopy(value)
                else:
                    offset = 0
                    dst[name] = _deepcopy(value)
                self.moved(tp, p, value, offset)
                self.out.where[p] = self.top.where.get(tp, self.top.pos(tp))
                continue
            if value is None and key in dst and _droppable(path):
                del dst[key]  # `name: null` drops an inherited entry
                continue
            if (key in EXPLICIT and self.inheriting and isinstance(dst.get(key), list) and dst[key]
                    and isinstance(value, list)):
                file = self.base.where.get(p, ("a base", (0, 0)))[0]
                where = ".".join(str(x) for x in path[1:]) or "the family"
                n = len(dst[key])
                self.err(tp, f"{where}: {n} {key if n > 1 else key.removesuffix('ies') + 'y'} {'are' if n > 1 else 'is'} inherited here (from {file}); write '{key}+:' to add "
                             f"to them or '{key}=:' to replace them")
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                self.walk(dst[key], value, p)
            else:
                dst[key] = _deepcopy(value)
                self.moved(tp, p, value, 0)
            self.out.where[p] = self.top.where.get(p, self.top.pos(p))


def _deepcopy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deepcopy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_deepcopy(x) for x in v]
    return v


def _pydantic_problems(e: ValidationError, pos: Any) -> list[Problem]:
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


def resolve(spec_dir: Path, root: Path | None = None) -> Atlas:
    root = root or spec_dir.parent
    return _resolve(*read_sources(spec_dir, root), spec_dir.name, read_sources(spec_dir / PARTS, root))


def resolve_texts(texts: dict[str, str], folder: str = "specs") -> Atlas:
    """The same from memory: file name (``gpt2.yaml``, ``parts/qwen_vit.yaml``) → its text, shown as
    ``folder/name``."""

    def parse(part: bool) -> tuple[dict[str, Source], list[Problem]]:
        return parse_sources([(name.removeprefix(f"{PARTS}/"), f"{folder}/{name}", text.encode("utf-8", "surrogatepass"))
                              for name, text in sorted(texts.items()) if name.startswith(f"{PARTS}/") == part])

    return _resolve(*parse(False), folder, parse(True))


def _resolve(sources: dict[str, Source], problems: list[Problem], folder: str,
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
        found.extend(_pydantic_problems(e, lambda p, key: (loc.file, loc.pos(p, key))))
        found.raise_if_any()
        raise AssertionError("unreachable") from None
    vocab_found = Problems()
    layouts = _check_vocabulary(vocab, vocab_src, vocab_found)
    if vocab_found.items:  # every family reads the vocabulary: its problems would only echo there
        found.extend(vocab_found.items)
        found.raise_if_any()
    shared = _shared_notes(sources.pop(SHARED_NOTES, None), found)
    papers_src = sources.pop(PAPERS, None)
    part_sources, part_problems = part_files
    found.extend(part_problems)
    parts = _parts(part_sources, found)

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
        merged = _extends_chain(name, by_name, found, orders, parts)
        if merged is None:
            continue
        try:
            raw = FamilyRaw.model_validate(merged.data)
        except ValidationError as e:
            found.extend(_pydantic_problems(e, merged.pos))
            continue
        fam = _Family(src, merged, raw, vocab, layouts, found, shared).build()
        if fam is not None:
            families.append(fam)
    papers = _papers(papers_src, {c.name for f in families for c in f.checkpoints}, found)
    found.raise_if_any()
    all_sources = sorted([(vocab_src.rel, vocab_src.sha256), *((s.rel, s.sha256) for s in sources.values()),
                          *((s.rel, s.sha256) for s, _ in parts.values()),
                          *([(papers_src.rel, papers_src.sha256)] if papers_src else [])])
    return Atlas(tuple(sorted(families, key=lambda f: f.name)), tuple(layouts.values()),
                 tuple(vocab.dims.items()), vocab_src.rel, vocab_src.sha256, tuple(all_sources), papers)


def _papers(src: Source | None, checkpoints: set[str], found: Problems) -> tuple[tuple[str, str], ...]:
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


def _parts(sources: dict[str, Source], found: Problems) -> dict[str, tuple[Source, PartRaw]]:
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
            found.extend(_pydantic_problems(e, lambda p, key, loc=loc: (loc.file, loc.pos(p, key))))
            continue
        for path, h in raw.hosts.items():
            if h.cls is not None and h.cls not in raw.classes:
                found.add(src.rel, loc.pos(("hosts", path, "class")), f"part {name}: host '{path}' has class "
                          f"'{h.cls}', which is not one of the part's classes ({', '.join(raw.classes) or 'none'}): "
                          "list it under 'classes' for the families to map")
        out[name] = (src, raw)
    return out


def _part_layer(fam: Source, k: int, inc: Any, parts: dict[str, tuple[Source, PartRaw]], seen: set[str],
                found: Problems) -> Merged | None:
    """The layer of ``include[k]`` of family ``fam``: the part's data with its classes mapped."""
    loc = fam.located
    at: DataPath = ("include", k)
    if not isinstance(inc, dict) or not isinstance(inc.get("part"), str):
        return None  # pydantic reports the shape
    name = inc["part"]
    if name in seen:
        found.add(fam.rel, loc.pos((*at, "part")), f"include names part '{name}' twice")
        return None
    seen.add(name)
    if name not in parts:
        found.add(fam.rel, loc.pos((*at, "part")), f"unknown part '{name}' (specs/{PARTS}/{name}.yaml)"
                  + suggest(name, parts))
        return None
    src, raw = parts[name]
    got = inc.get("classes")
    mapping: dict[str, Any] = got if isinstance(got, dict) else {}
    layer = _layer(src.located)
    for key in ("part", "about", "classes"):
        layer.data.pop(key, None)
    for placeholder in mapping:
        if placeholder not in raw.classes:
            found.add(fam.rel, loc.pos((*at, "classes", placeholder), key=True), f"include {name}: the part has no "
                      f"class '{placeholder}' to map (its classes: {', '.join(raw.classes)})" + suggest(placeholder, raw.classes))
    unmapped = [c for c in raw.classes if c not in mapping]
    if unmapped:
        found.add(fam.rel, loc.pos(at), f"include {name}: map every class of the part to this family's: "
                  f"{', '.join(unmapped)} not mapped (classes: {{{unmapped[0]}: ...}})")
    for path, host in layer.data.get("hosts", {}).items():
        cls = host.get("class") if isinstance(host, dict) else None
        if isinstance(cls, str) and cls in mapping:
            host["class"] = mapping[cls]
            layer.where[("hosts", path, "class")] = (fam.rel, loc.pos((*at, "classes", cls)))
    return layer


def _shared_notes(src: Source | None, found: Problems) -> dict[str, list[NoteRaw]]:
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
                found.extend(_pydantic_problems(
                    e, lambda p, key, k=k, name=name, loc=loc: (loc.file, loc.pos((name, k, *p), key))))
        out[name] = notes
    return out


def _check_vocabulary(vocab: Vocabulary, src: Source, found: Problems) -> dict[str, Layout]:
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


def _bases(src: Source) -> tuple[list[str], list[DataPath]]:
    """A family's ``extends:``: one name or a list of names, each with its path in the file."""
    ext = src.located.data.get("extends")
    if ext is None:
        return [], []
    if isinstance(ext, list):
        return [x if isinstance(x, str) else repr(x) for x in ext], [("extends", k) for k in range(len(ext))]
    return [ext if isinstance(ext, str) else repr(ext)], [("extends",)]


def _extends_chain(name: str, by_name: dict[str, Source], found: Problems,
                   orders: dict[str, list[str] | None], parts: dict[str, tuple[Source, PartRaw]] | None = None
                   ) -> Merged | None:
    """A family's data merged over its bases.

    ``extends: base`` or ``extends: [a, b, ...]``: the spec files are merged one over the other in
    the order of a left-to-right, depth-first walk of the bases, each file once, every base before
    the specs that extend it and the family's own file last; so a later base overrides an earlier
    one, and a ``name: null`` drop in any file stays dropped. Notes and checkpoints are each
    file's own: a file that names neither ``notes`` nor ``notes+`` drops the bases' (the same for
    checkpoints), so no page shows another family's printout or runs its examples by accident.
    A base named twice, an unknown base and a cycle are errors at the ``extends`` entry that names them.

    ``include: [{part: NAME, classes: {...}}]``: the family's parts (``specs/parts/``) are merged
    just before its own file, in the order listed (so the file overrides them); a base's parts
    are not inherited: a family is made of the parts it includes.
    """
    order = _linearize(name, by_name, found, orders, ())
    if order is None:
        return None
    merged: Merged | None = None
    used: list[Source] = []
    before: dict[str, list[str]] = {}
    for fam in order:
        own = _layer(by_name[fam].located)
        layers = [own]
        includes = own.data.get("include") if fam == name else None  # parts are not inherited
        if includes:
            before = {sec: list((merged.data if merged else {}).get(sec) or {}) for sec in _ORDERED}
            seen: set[str] = set()
            got = [(inc, x) for k, inc in enumerate(includes if isinstance(includes, list) else [])
                   if (x := _part_layer(by_name[name], k, inc, parts or {}, seen, found)) is not None]
            layers = [x for _, x in got] + [own]
            used = [(parts or {})[inc["part"]][0] for inc, _ in got]
        for layer in layers:
            if merged is None:
                merged = _merge(Merged({}, {(): layer.where.get((), layer.pos(()))}), layer, found, inheriting=False)
                continue
            if layer is own:
                for key in OWN_ONLY:  # a base's notes and checkpoints are not this file's, unless it says `key+:`
                    if not any(k in own.data for k in (key, f"{key}+", f"{key}=")):
                        merged.data.pop(key, None)
            merged = _merge(merged, layer, found)
    assert merged is not None
    if used:  # keys in the order of the bases and the file; what only the parts bring after them
        own_data = by_name[name].located.data
        for sec in _ORDERED:
            table = merged.data.get(sec)
            if isinstance(table, dict):
                mine = [k for k in (own_data.get(sec) or {}) if k in table]
                first = [k for k in before.get(sec, []) if k in table] + [k for k in mine if k not in before.get(sec, [])]
                merged.data[sec] = {k: table[k] for k in [*first, *(k for k in table if k not in first)]}
    merged.parts = used
    merged.data["family"] = name
    merged.data["extends"] = by_name[name].located.data.get("extends")
    merged.data["include"] = by_name[name].located.data.get("include") or []
    return merged


_ORDERED = ("rename", "config", "functions", "hosts")


def _linearize(name: str, by_name: dict[str, Source], found: Problems, done: dict[str, list[str] | None],
               stack: tuple[str, ...]) -> list[str] | None:
    """The spec files a family is merged from, in merge order (see ``_extends_chain``)."""
    if name in done:
        return done[name]
    src = by_name[name]
    bases, paths = _bases(src)
    ok = True
    if not bases and "extends" in src.located.data:
        found.add(src.rel, src.located.pos(("extends",)), "extends names no family: give a name or a list of names")
        ok = False
    seen: set[str] = set()
    order: list[str] = []
    for base, at in zip(bases, paths):
        pos = src.located.pos(at)
        if base in seen:
            found.add(src.rel, pos, f"extends names '{base}' twice")
            ok = False
            continue
        seen.add(base)
        if base not in by_name:
            if not any(p.file.endswith(f"/{base}.yaml") for p in found.items):  # not one whose errors are listed
                found.add(src.rel, pos, f"extends unknown family '{base}'" + suggest(base, by_name))
            ok = False
            continue
        if base == name or base in stack:
            chain = [*stack[stack.index(base):], name, base] if base in stack else [name, base]
            found.add(src.rel, pos, f"extends cycle: {' -> '.join(chain)}")
            ok = False
            continue
        got = _linearize(base, by_name, found, done, (*stack, name))
        if got is None:
            ok = False
            continue
        order += [f for f in got if f not in order]
    done[name] = [*order, name] if ok else None
    return done[name]


class _Family:
    """Checks one merged family and builds its IR; problems go to ``found``."""

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

    def build(self) -> FamilyIR | None:
        r = self.raw
        for req in ("title", "lines", "summary", "traits", "loads", "tiny"):
            if getattr(r, req) is None:
                self.err((), f"family {r.family}: '{req}' is required (here or in the spec it extends)")
        for req in ("title", "summary"):
            if getattr(r, req) is not None and not getattr(r, req).strip():
                self.err((req,), f"{req} is empty: say it in words")
        if r.lines is not None and not r.lines:
            self.err(("lines",), "lines is empty: name at least one product line")
        for k, line in enumerate(r.lines or []):
            if not line.strip():
                self.err(("lines", k), "lines: an empty product line")
        self.check_names()
        for trait in r.traits or []:
            if trait not in self.vocab.traits:
                self.err(("traits", (r.traits or []).index(trait)), f"unknown trait '{trait}'" + suggest(trait, self.vocab.traits))
        if r.loads is not None and r.loads.attention is not None and "eager" not in r.loads.attention:
            self.err(("loads", "attention"), "loads.attention: every class accepts 'eager' (the reference the tests run); list it")
        config = self.config()
        if "model" not in r.hosts:
            self.err(("hosts",), "the hosts must include 'model' (the root)")
        functions = self.functions()
        self.groups = {f.name: f.words for f in functions}
        hosts = [x for path, h in r.hosts.items() for x in self.host(path, h, config)]
        tiny = self.tiny() if r.tiny else None
        notes = self.notes()
        if not self.ok or tiny is None:
            return None
        hosts_ir = tuple(h for h in hosts if h is not None)
        self.check_identities(hosts_ir, {k for k, _, _ in config})
        self.check_kind_whens(hosts_ir)
        self.check_checkpoint_sizes(config)
        self.check_positional_reads(hosts_ir)
        diagram = self.diagram(hosts_ir)
        if not self.ok:
            return None
        assert r.title and r.lines and r.summary and r.traits is not None and r.loads
        extends = () if r.extends is None else (r.extends,) if isinstance(r.extends, str) else tuple(r.extends)
        return FamilyIR(
            name=r.family, file=self.src.rel, sha256=self.src.sha256, extends=extends, title=r.title,
            lines=tuple(r.lines), summary=r.summary.strip(),
            traits=tuple((t, self.vocab.traits[t]) for t in r.traits),
            model_types=tuple(r.loads.model_types), classes=tuple(r.loads.classes),
            rename=tuple((k, tuple(v) if isinstance(v, list) else (v,)) for k, v in r.rename.items()),
            config=tuple(config), functions=functions, hosts=hosts_ir, tiny=tiny,
            checkpoints=tuple(CheckpointIR(c.name, tuple(c.config.items())) for c in r.checkpoints),
            notes=notes, docstring=(r.docstring or r.summary).strip(), diagram=diagram,
            attention=tuple(r.loads.attention) if r.loads.attention is not None else None,
            rename_at=tuple((k, self.at(("rename", k))) for k in r.rename), tiny_at=self.at(("tiny", "model_class")),
            parts=tuple((s.rel, s.sha256) for s in self.merged.parts),
        )

    def module_name_problem(self, path: str, what: str) -> str | None:
        """A module name outside the vocabulary's modules: is a typo or an unmade choice (self_attn_2, dense_mlp)."""
        known = {**self.vocab.modules, **self.raw.modules}
        for name in names.module_names(path):
            if name not in known:
                return (f"{what} '{path}': '{name}' is not a standard module name" + (suggest(name, known) or ".")
                        + f" A new module name is declared once in specs/{VOCABULARY}, under modules:, with its "
                        "one-line meaning (what any family's module of that name is), or for this family alone "
                        "under modules: in its spec")
        return None

    def check_names(self) -> None:
        """Every spec name that becomes a Python name (or a name the runtime looks up) is a name."""
        r = self.raw

        def check(at: DataPath, bad: str | None, key: bool = False) -> None:
            if bad:
                self.err(at, bad, key=key)

        for key, natives in r.rename.items():
            check(("rename", key), names.path_problem(key, "rename key") or self.module_name_problem(key, "rename key"),
                  key=True)
            items = natives if isinstance(natives, list) else [natives]
            for k, native in enumerate(items):
                at = ("rename", key, k) if isinstance(natives, list) else ("rename", key)
                check(at, names.path_problem(native, "native path", block_index=False, digits=True))
        for key in r.config:
            check(("config", key), names.problem(key, "config key"), key=True)
        for path, h in r.hosts.items():
            if h.cls is not None:
                check(("hosts", path, "class"), names.problem(h.cls, "class"))
            if path not in r.rename and not names.path_problem(path, "host path"):  # (those are said elsewhere)
                check(("hosts", path), self.module_name_problem(path, "host"), key=True)
            for kname, kind in h.kinds.items():
                if kind.cls is not None:
                    check(("hosts", path, "kinds", kname, "class"), names.problem(kind.cls, "class"))
        if r.loads is not None:
            for k, cls in enumerate(r.loads.classes):
                check(("loads", "classes", k), names.problem(cls, "class"))
        for name, fn in r.functions.items():
            check(("functions", name), names.problem(name, "function group"), key=True)
            if fn.route is not None:
                for fld in ("torch", "state_arg", "final_state_flag"):
                    value = getattr(fn.route, fld)
                    if value is not None:
                        check(("functions", name, "route", fld), names.problem(value, f"route.{fld}"))
        t = r.tiny
        if t is not None:
            loads: list[tuple[DataPath, Any]] = [(("tiny",), t)]
            if t.image_text is not None:
                loads.append((("tiny", "image_text"), t.image_text))
            for base, load in loads:
                for fld in ("model_class", "config_class"):
                    check((*base, fld), names.problem(getattr(load, fld), fld))
                if load.processor is not None:
                    check((*base, "processor", "class"), names.problem(load.processor.cls, "class"))
                    check((*base, "processor", "image_processor"), names.problem(load.processor.image_processor, "image_processor"))
                for key in load.draw:
                    check((*base, "draw", key), names.path_problem(key, "draw key", block_index=False), key=True)
            if not MIN_EXAMPLES <= t.examples <= MAX_EXAMPLES:
                self.err(("tiny", "examples"), f"tiny.examples: between {MIN_EXAMPLES} and {MAX_EXAMPLES}")
            if t.image_text is not None and not MIN_EXAMPLES <= t.image_text.examples <= MAX_EXAMPLES:
                self.err(("tiny", "image_text", "examples"),
                         f"tiny.image_text.examples: between {MIN_EXAMPLES} and {MAX_EXAMPLES}")
        classes: dict[str, str] = {}
        for path in r.hosts:
            if not _HOST_PATH.fullmatch(path) or names.path_problem(path):
                continue  # host() says so
            cls = names.class_name(path)
            if cls in names.RESERVED_CLASSES:
                self.err(("hosts", path), f"host '{path}': its class would be named {cls}, which the adapter "
                         "uses already", key=True)
            elif cls in classes:
                self.err(("hosts", path), f"hosts '{classes[cls]}' and '{path}' would both be class {cls} in the "
                         "adapter: rename one", key=True)
            classes.setdefault(cls, path)

    def check_checkpoint_sizes(self, config: list[tuple[str, expr.Compiled, str]]) -> None:
        """A checkpoint's stacks are built block by block on the meta device for its printout and
        drawn on its page: a stack of more than MAX_BLOCKS blocks is a SpecError."""
        stacks = [(key, c) for key, c, _ in config if key == "num_layers" or key.endswith("_num_layers")]
        for k, ckpt in enumerate(self.raw.checkpoints):
            values = dict(ckpt.config)

            def lookup(name: str, values: dict[str, Any] = values) -> Any:
                return config_value(values, name)

            for key, c in stacks:
                try:
                    n = expr.evaluate(c, lookup)
                except Exception:  # noqa: BLE001 - the recorded config does not say: transformers' default
                    continue
                if isinstance(n, int) and not isinstance(n, bool) and n > MAX_BLOCKS:
                    self.err(("checkpoints", k, "config"), f"checkpoint {ckpt.name}: {key} is {n}; at most "
                             f"{MAX_BLOCKS} blocks (the printout builds each one)", key=True)

    def diagram(self, hosts: tuple[HostIR, ...]) -> DiagramIR:
        """The optional ``diagram:`` section: every part it names must be a part of the family."""
        d = self.raw.diagram
        rename = set(self.raw.rename)

        def known(prefix: str, host: str, name: str) -> bool:
            full = f"{prefix}.{name}" if prefix else name
            if full in rename or any(h.path == full or h.path.startswith(full + "[i]") for h in hosts):
                return True
            return any(v.read is not None and v.read.module[:1] == (name,) and
                       (h.path == host and not v.read.up or v.read.up == 1 and h.path.rsplit(".", 1)[0] == host)
                       for h in hosts for v in h.values)

        out = {"text": DEFAULT_TEXT, "block": DEFAULT_BLOCK, "vision": (), "vision_block": DEFAULT_BLOCK}
        checks = {"text": ("", "model", ()), "block": ("layers[i]", "layers[i]", ("add", "mixer")),
                  "vision": ("vision", "vision", ()), "vision_block": ("vision.layers[i]", "vision.layers[i]", ("add", "mixer"))}
        for key, (prefix, host, words) in checks.items():
            items = getattr(d, key) if d is not None else None
            if items is None:
                continue
            values = {v.name for h in hosts if h.path == host for v in h.values}
            for k, item in enumerate(items):
                name, _, cond = item.partition(" if ")
                if cond and cond.strip() not in values:
                    self.err(("diagram", key, k), f"diagram.{key}: '{item}': '{cond.strip()}' is no value of {host}")
                    continue
                if words and name.startswith("mul:"):  # a product with a value of the block
                    if name[4:] not in values:
                        self.err(("diagram", key, k), f"diagram.{key}: '{item}': '{name[4:]}' is no value of {host}")
                    continue
                ok = name in words or known(prefix, host, name) or (key == "vision" and known("", "model", name)) or \
                    any(t.split(".")[0] == name for h in hosts if h.path == host for i in h.identities for t in i.terms)
                if not ok:
                    where = f"{prefix} " if prefix else ""
                    self.err(("diagram", key, k), f"diagram.{key}: '{name}' is no {where}part of this family "
                             f"(a rename entry, a host, or a module a value is read at" +
                             (", or add / mixer)" if words else ")"))
            out[key] = tuple(items)
        facts = d.vision_facts if d is not None and d.vision_facts else {}
        if facts and not any(h.path == "vision" for h in hosts):
            self.err(("diagram", "vision_facts"), "diagram.vision_facts: this family has no vision host to say them of")
        return DiagramIR(out["text"], out["block"], out["vision"], out["vision_block"],
                         tuple((k, " ".join(v.split())) for k, v in facts.items()))

    def config(self) -> list[tuple[str, expr.Compiled, str]]:
        out = []
        entries = dict(self.raw.config)
        unknown_preset = False
        for k, name in enumerate(self.raw.presets):
            preset = PRESETS.get(name)
            if preset is None:
                self.err(("presets", k), f"unknown preset '{name}' (presets: {', '.join(sorted(PRESETS))})"
                         + suggest(name, PRESETS))
                unknown_preset = True
                continue
            for key, entry in preset.config(self.raw.title or self.raw.family).items():
                entries.setdefault(key, entry)
        for key in REQUIRED_CONFIG:
            if key not in entries and not unknown_preset:  # a misspelt preset: its error says it all
                hint = (" (an attention-free family takes them all with `presets: [no_attention]`)"
                        if key in dict(PRESETS["no_attention"].reasons) else "")
                self.err(("config",), f"config: the normalized attribute '{key}' is required{hint}", key=True)
        for key, text in entries.items():
            if isinstance(text, UnavailableRaw):
                out.append((key, expr.Compiled(f"_fn.config_unavailable({text.unavailable!r})", ()),
                            f"Unavailable: {text.unavailable}"))
                continue
            try:
                out.append((key, expr.compile_config(text), str(text)))
            except expr.ExprError as e:
                self.err(("config", key), f"config.{key}: {e}", col=e.col)
        return out

    def functions(self) -> tuple[FunctionIR, ...]:
        out = []
        for name, fn in self.raw.functions.items():
            at = ("functions", name)
            if not fn.names:
                self.err((*at, "names"), f"functions.{name}: list at least one function name")
            for n in fn.names:
                if bad := names.problem(n, "function"):
                    self.err((*at, "names"), f"functions.{name}: {bad}")
            route = None
            if fn.route is not None:
                route = tuple(fn.route.model_dump().items())
            out.append(FunctionIR(name, tuple(fn.names), fn.words.strip(), route))
        return tuple(out)

    def host(self, path: str, h: HostRaw, config: list[tuple[str, expr.Compiled, str]]) -> list[HostIR]:
        at = ("hosts", path)
        if not _HOST_PATH.fullmatch(path):
            self.err(at, f"host path '{path}' is not 'model' or a dotted path like layers[i].self_attn (or "
                     "layers[i].self_attn[0], an item of a list child of the block)", key=True)
            return []
        if (m := _LIST_ITEM.search(path)) and "[i]" not in path[:m.start()]:
            self.err(at, f"host '{path}': a list item [{m.group(1)}] is an item of a list child inside a block "
                     "(layers[i].self_attn[0]); a stack of blocks is indexed [i]", key=True)
            return []
        if bad := names.path_problem(path, "host path"):
            self.err(at, bad, key=True)
            return []
        if path != "model" and path.split(".")[0].removesuffix("[i]") not in self.raw.rename:
            first = path.split(".")[0].removesuffix("[i]")
            self.err(at, f"host '{path}': '{first}' is not in rename (say which native module it is)" + suggest(first, self.raw.rename), key=True)
        if h.cls is None and not (h.kinds and all(k.cls is not None for k in h.kinds.values())):
            self.err(at, f"host '{path}': 'class' (the native class) is required" +
                     (" (here, or on every one of its kinds)" if h.kinds else ""), key=True)
        common_v: list[tuple[DataPath, str, Any]] = [((*at, "values", k), k, v) for k, v in h.values.items()]
        common_i: list[tuple[DataPath, Any]] = [((*at, "identities", k), x) for k, x in enumerate(h.identities)]
        if h.kind is not None:
            for other in ("when", "kinds"):
                if getattr(h, other):
                    self.err((*at, "kind"), f"host '{path}': give either 'kind' (the blocks of a kind of an enclosing "
                             f"host) or '{other}'")
                    return []
            when_text = self.enclosing_kind_when(path, h.kind, (*at, "kind"))
            if when_text is None:
                return []
            built = self.host_kind(path, h, config, when_text, (*at, "kind"), common_v, common_i, h.kind)
            return [built] if built is not None else []
        if not h.kinds:
            built = self.host_kind(path, h, config, h.when, (*at, "when"), common_v, common_i, None)
            return [built] if built is not None else []
        if h.when is not None:
            self.err((*at, "when"), f"host '{path}': give either 'when' or 'kinds' (each kind has its own when)")
        out = []
        for kname, kind in h.kinds.items():
            kat = (*at, "kinds", kname)
            if not re.fullmatch(r"[a-z][a-z0-9_]*", kname) or not names.is_name(kname):
                self.err(kat, f"kind '{kname}' must be a lowercase name (model.{kname}_layers lists its blocks)", key=True)
            when_text = kind.when if kind.when is not None else self.enclosing_kind_when(path, kname, kat)
            if when_text is None:
                continue
            dropped = {k for k, v in kind.values.items() if v is None}
            for vname, v in kind.values.items():
                if v is not None and h.values.get(vname) is not None:
                    hfile, hline, _ = self.at((*at, "values", vname))
                    self.err((*kat, "values", vname),
                             f"kind '{kname}' of host '{path}': value '{vname}' is read on the host too "
                             f"({hfile}:{hline}); a kind's read does not replace the host's: set '{vname}: null' on the "
                             f"host and give every kind its own read, or drop it here", key=True)
            kv = [x for x in common_v if x[1] not in dropped] + [((*kat, "values", k), k, v) for k, v in kind.values.items()]
            ki = common_i + [((*kat, "identities", k), x) for k, x in enumerate(kind.identities)]
            own = {f: getattr(kind, f) for f in ("cls", "stream", "needs", "reached") if getattr(kind, f) is not None}
            eff = h.model_copy(update={**own, "dims": {**h.dims, **kind.dims}}) if own or kind.dims else h
            built = self.host_kind(path, eff, config, when_text, (*kat, "when") if kind.when is not None else kat,
                                   kv, ki, kname, own=kat,
                                   own_keys={*("class" if f == "cls" else f for f in own), *(f"dims.{d}" for d in kind.dims)})
            if built is not None:
                out.append(built)
        return out

    def enclosing_kind_when(self, path: str, kname: str, at: DataPath) -> str | None:
        """The when of kind ``kname`` of the nearest host enclosing ``path`` that declares it (following a
        when left out there too); None, with the problem said at ``at``, when none does."""
        p, seen = path, []
        while "." in p:
            p = p.rsplit(".", 1)[0]
            host = self.raw.hosts.get(p)
            if host is None:
                continue
            seen += [k for k in host.kinds if k not in seen]
            kind = host.kinds.get(kname)
            if kind is not None:
                return kind.when if kind.when is not None else self.enclosing_kind_when(p, kname, at)
        self.err(at, f"host '{path}': kind '{kname}' has no when, and no host enclosing it declares a kind "
                 f"'{kname}' to take it from (" + (f"their kinds: {', '.join(seen)}" if seen else "none declares kinds")
                 + "): give when: here, or declare the kind on the host whose blocks it selects (layers[i])"
                 + suggest(kname, seen), key=at[-1] != "kind")
        return None

    def check_kind_whens(self, hosts: tuple[HostIR, ...]) -> None:
        """One kind name selects one set of blocks (model.<kind>_layers lists them): the same kind on
        two host paths with two different whens is an error at the second."""
        first: dict[str, HostIR] = {}
        for h in hosts:
            if h.kind is None or h.when_text is None:
                continue
            prev = first.setdefault(h.kind, h)
            if prev.when_text != h.when_text:
                file, line, col = h.at or (self.src.rel, 1, 1)
                pfile, pline, _ = prev.at or (self.src.rel, 1, 1)
                self.found.add(file, (line, col), (
                    f"{h.path}: kind '{h.kind}' selects the blocks where {h.when_text}, but on {prev.path} "
                    f"({pfile}:{pline}) kind '{h.kind}' selects those where {prev.when_text}: model.{h.kind}_layers "
                    f"lists one set of blocks. Give the kind one when (leave when out below {prev.path} to take its), "
                    "or name the kinds apart"))
                self.ok = False

    def host_kind(self, path: str, h: HostRaw, config: list[tuple[str, expr.Compiled, str]], when_text: str | None,
                  when_at: DataPath, value_items: Sequence[tuple[DataPath, str, Any]],
                  identity_items: Sequence[tuple[DataPath, Any]], kind: str | None, own: DataPath | None = None,
                  own_keys: set[str] | frozenset[str] = frozenset()) -> HostIR | None:
        at = ("hosts", path)

        def where(key: str) -> DataPath:
            """The position of a host key: on the kind when the kind gives it, else on the host."""
            return (*own, *key.split(".")) if own is not None and key in own_keys else (*at, *key.split("."))

        when = None
        if when_text is not None:
            try:
                when = expr.compile_when(when_text)
            except expr.ExprError as e:
                self.err(when_at, f"when: {e}", col=e.col)
        table = self.vocab.values
        if h.stream is not None:
            if h.stream not in self.vocab.streams:
                self.err(where("stream"), f"unknown stream '{h.stream}'" + suggest(h.stream, self.vocab.streams))
            else:
                table = {**table, **self.vocab.streams[h.stream]}
        config_names = {k for k, _, _ in config}
        for dim, entry in h.dims.items():
            if dim not in self.vocab.dims:
                self.err(where(f"dims.{dim}"), f"host '{path}': unknown dim '{dim}'" + suggest(dim, self.vocab.dims), key=True)
            if entry not in config_names:
                self.err(where(f"dims.{dim}"), f"host '{path}': dim {dim} sized by '{entry}', which is not a config entry"
                         + suggest(entry, config_names))
        values: list[ValueIR] = []
        for vat, vname, v in value_items:
            if v is None:
                continue
            if vname not in table:
                section = f"streams.{h.stream}: (this host's stream) or values:" if h.stream else "values:"
                near = suggest(vname, table)
                self.err(vat, f"unknown value '{vname}'" + (near + " " if near else ". ") + "A new standard value is declared "
                         f"once in specs/{VOCABULARY}, under {section}, with its layout and its one-line meaning",
                         key=True)
                continue
            value = v if isinstance(v, ValueRaw) else ValueRaw(read=v)
            defaults = {k: getattr(h, k) for k in ("needs", "reached") if getattr(h, k) is not None and getattr(value, k) is None}
            if defaults:
                value = value.model_copy(update=defaults)
            built = self.value(vname, value, table[vname], vat, config_names)
            depth = 0 if path == "model" else len(path.split("."))
            if built is not None and built.read is not None and built.read.up > depth:
                self.err(vat, f"{vname}: '{built.read.text}' climbs {built.read.up} host(s) up, but {path} has "
                         f"{'no parent' if not depth else f'only {depth} above it'}", key=isinstance(v, ValueRaw))
                continue
            if built is not None:
                unsized = [d for d in built.layout.dims if d not in INPUT_DIMS and d not in config_names
                           and d not in h.dims] if built.missing is None else []
                if unsized:
                    self.err(vat, f"{vname}: its layout {built.layout.name} has "
                             + ", ".join(repr(d) for d in unsized) + ", which is not a config entry of this family "
                             "nor sized by the call's inputs: add it under config: (the config attribute that sizes "
                             "it), or size it on this host with dims:", key=isinstance(v, ValueRaw))
                values.append(dataclasses.replace(built, at=self.at((*vat, "read"))))
        names = [x.name for x in values]
        root_names = self.root_value_names()
        for x in values:
            for dep in x.derived.names if x.derived else ():
                if dep in config_names or (dep.startswith("model.") and dep[len("model."):] in root_names):
                    continue
                if dep not in names:
                    self.err((*at, "values", x.name, "derived"), f"{x.name}: derived from '{dep}', which this host does not have" + suggest(dep, names))
        identities = []
        for iat, ident in identity_items:
            item = ident if isinstance(ident, IdentityRaw) else IdentityRaw(check=ident)
            try:
                op, lhs, rhs = expr.compile_identity(item.check)
            except expr.ExprError as e:
                self.err(iat if isinstance(ident, str) else (*iat, "check"), f"identity: {e}", col=e.col)
                continue
            identities.append(IdentityIR(item.check, op, lhs, rhs, float(item.atol), float(item.rtol), at=self.at(iat)))
        return HostIR(path, h.cls or "", when, when_text, tuple(values), tuple(identities), dims=tuple(h.dims.items()),
                      at=self.at(where("class")),
                      kind=kind)

    def value(self, name: str, v: ValueRaw, vocab_value: Any, at: DataPath, config_names: set[str]) -> ValueIR | None:
        if v.missing is not None:
            if v.read is not None or v.derived is not None or v.view is not None or v.needs is not None:
                self.err(at, f"{name}: a missing value has only its reason ('missing'), no read, derived, view or needs", key=True)
                return None
            if not v.missing.strip():
                self.err((*at, "missing"), f"{name}: say why the family has no {name}")
                return None
            lay = self.layouts.get(vocab_value.layout)
            if lay is None:
                return None
            return ValueIR(name, lay, vocab_value.meaning, None, None, None, (), None, None,
                           missing=" ".join(v.missing.split()))
        if (v.read is None) == (v.derived is None):
            self.err(at, f"{name}: give exactly one of 'read' (a read point), 'derived' (an expression) or 'missing' "
                     "(why the family has none)", key=True)
            return None
        read = derived = None
        try:
            if v.read is not None:
                read = readpoint.parse(v.read, self.groups)
            else:
                derived = expr.compile_derived(v.derived or "")
        except expr.ExprError as e:
            sub = () if isinstance(self.merged_value(at), str) else ("read" if v.read is not None else "derived",)
            self.err((*at, *sub), f"{name}: {e}", col=e.col)
            return None
        if read is not None:
            for part in (*read.module, *(a for a in read.access if isinstance(a, str)), read.param or ""):
                if part.startswith("__"):
                    sub = () if isinstance(self.merged_value(at), str) else ("read",)
                    self.err((*at, *sub), f"{name}: '{part}' starts with '__' (reserved for Python's own names)")
                    return None
        view: list[tuple[str, tuple[Any, ...]]] = []
        if v.view is not None:
            try:
                view = expr.parse_view(v.view)
            except expr.ExprError as e:
                self.err((*at, "view"), f"{name}: view: {e}", col=e.col)
            for _, args in view:
                for a in _flat(args):
                    if isinstance(a, str) and a not in config_names and a not in CALL_DIMS:
                        self.err((*at, "view"), f"{name}: view names '{a}', which is not a config entry nor a "
                                 f"call dim ({', '.join(CALL_DIMS)})" + suggest(a, [*config_names, *CALL_DIMS]))
        needs = reached = None
        for field_name, kind in (("needs", "load"), ("reached", "call")):
            cname = getattr(v, field_name)
            if cname is None:
                continue
            cond = self.vocab.conditions.get(cname)
            if cond is None:
                self.err((*at, field_name), f"{name}: unknown condition '{cname}'" + suggest(cname, self.vocab.conditions))
            elif cond.kind != kind:
                self.err((*at, field_name), f"{name}: '{cname}' is a {cond.kind} condition; '{field_name}' takes a {kind} condition")
            elif kind == "load":
                needs = Condition(cname, cond.says, cond.fix, cond.attribute, tuple(cond.values), cond.kind, cond.never)
            else:
                reached = Condition(cname, cond.says, cond.fix, kind=cond.kind)
        if v.edit not in _EDITS:
            self.err((*at, "edit"), f"{name}: edit is one of {', '.join(_EDITS)} (what an edit of the value reaches)")
        if v.recompute is not None:
            read = self.recompute(name, v, read, needs, at)
        layout = self.layouts.get(vocab_value.layout)
        if layout is None:
            return None
        if vocab_value.optional and not layout.optional:
            layout = dataclasses.replace(layout, optional=True)
        if v.readonly is not None and v.derived is not None:
            self.err((*at, "readonly"), f"{name}: a derived value is read-only already")
        return ValueIR(name, layout, vocab_value.meaning, read, derived, v.derived, tuple(view), v.view, needs,
                       reached=reached, readonly_why=v.readonly, edit=v.edit, copy=v.served_copy)

    def recompute(self, name: str, v: ValueRaw, read: ReadPoint | None, needs: Condition | None,
                  at: DataPath) -> ReadPoint | None:
        """``recompute: sdpa``: the read, marked, when it is eager's softmax in the host's own forward."""
        where = (*at, "recompute")
        if v.recompute != "sdpa":
            self.err(where, f"{name}: recompute takes 'sdpa' (the load under which the host's forward calls "
                     f"scaled_dot_product_attention in place of eager's softmax), not {v.recompute!r}")
        elif read is None or read.kind != "op" or read.op != "softmax" or read.call is not None or \
                (read.side, read.access) not in (("input", (0,)), ("output", ())):
            inside = read is not None and read.kind == "op" and read.call is not None
            self.err(where, f"{name}: recompute: sdpa stands for eager's softmax in the host's own forward: read "
                     "op:softmax.input[0] (the scores) or op:softmax.output (the probabilities)"
                     + ("; a read inside eager attention (call:attention > op:...) is recomputed without it"
                        if inside else ""))
        elif needs is None or needs.name != "eager":
            self.err(where, f"{name}: recompute: sdpa recomputes what only eager attention forms: the value "
                     "needs eager ('needs: eager')")
        else:
            return dataclasses.replace(read, recompute="sdpa")
        return read

    def root_value_names(self) -> set[str]:
        root = self.raw.hosts.get("model")
        return {k for k, v in root.values.items() if v is not None} if root else set()

    def merged_value(self, path: DataPath) -> Any:
        node: Any = self.merged.data
        for p in path:
            node = node[p]
        return node

    def check_identities(self, hosts: tuple[HostIR, ...], config_names: set[str]) -> None:
        by_path: dict[str, set[str]] = {}
        for h in hosts:
            by_path.setdefault(h.path, set()).update(v.name for v in h.values)
        for h in hosts:
            for k, ident in enumerate(h.identities):
                for term in ident.terms:
                    known = sorted(by_path.get(h.path, set()))
                    if term not in config_names and not self.term_exists(h.path, term, by_path) \
                            and not self.tensor_term(term) and not self.own_tensor_term(term, known):
                        self.err(("hosts", h.path, "identities", k), f"identity term '{term}' names nothing on host {h.path}" + suggest(term.split(".")[-1], known))

    def check_positional_reads(self, hosts: tuple[HostIR, ...]) -> None:
        """Every value read by position (``op:add#5``, ``method:f#i``) must be named by an identity:
        transformers adding or removing one such call would otherwise shift the read, silently, onto
        another tensor that may even have the same shape."""
        pinned: set[tuple[str, str]] = set()
        for h in hosts:
            for ident in h.identities:
                for term in ident.terms:
                    pinned.add(_term_value(h.path, term))
        for h in hosts:
            for v in h.values:
                if v.read is None or not v.read.by_position or (h.path, v.name) in pinned:
                    continue
                file, line, col = v.at or (self.src.rel, 1, 1)
                self.found.add(file, (line, col), (
                    f"{h.path}: {v.name}: '{v.read.text}' is read by its position among the calls of the forward, "
                    f"and no identity names {v.name}: a transformers release that adds or removes one such call would "
                    f"shift the read onto another tensor unnoticed. Add an identity that pins it (to a child's "
                    f"boundary, a parameter or another value), or read it by name (a child's .input/.output, "
                    f"call:attention.args[N], fn:NAME.args.PARAM)"))
                self.ok = False

    @staticmethod
    def tensor_term(term: str) -> bool:
        """A term that may name a parameter or buffer of a child module of the host's
        (``gate.e_score_correction_bias``): a plain path of two parts or more, not from the root; checked on the module tree
        of the tiny model and of every checkpoint by treecheck (``make generate``)."""
        parts = term.split(".")
        return len(parts) > 1 and parts[0] != "model" and "[" not in term and parts[-1] not in ("input", "output")

    @staticmethod
    def own_tensor_term(term: str, known: list[str]) -> bool:
        """A one-word term that is not a value's name a letter or two off may name a parameter or buffer of the
        host's own module (MiniMax-M2's ``e_score_correction_bias``, AFMoE's ``expert_bias``, beside the value
        ``expert_indices``): checked on the module tree by treecheck, as a child's is; a near miss of a value's name
        (``mlp_activaton``) is reported here as the typo it likely is."""
        typo = any(difflib.SequenceMatcher(None, term, k).ratio() >= 0.85 for k in known)
        return "." not in term and "[" not in term and term.isidentifier() and not typo

    @staticmethod
    def term_exists(host: str, term: str, by_path: dict[str, set[str]]) -> bool:
        parts = term.split(".")
        if parts[-1] in ("input", "output"):
            return True  # a module boundary: checked on the live model by the generated tests
        if parts[0] == "model" and len(parts) > 1:  # a path from the root
            host, parts = "model", parts[1:]
        prefix = _term_prefix(host, parts[:-1])
        target = host if not prefix else (prefix if host == "model" else f"{host}.{prefix}")
        return parts[-1] in by_path.get(target, set())

    def tiny(self) -> TinyIR | None:
        t = self.raw.tiny
        assert t is not None
        todo: list[tuple[DataPath, Any]] = [(("tiny",), self.merged.data.get("tiny"))]
        while todo:  # every integer of a tiny model is small (sizes, counts): the generated tests build it
            at, node = todo.pop()
            if at in (("tiny", "batch"), ("tiny", "seq")):
                continue  # ranges, checked below
            if isinstance(node, dict):
                todo.extend(((*at, k), v) for k, v in node.items())
            elif isinstance(node, list):
                todo.extend(((*at, k), v) for k, v in enumerate(node))
            elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_TINY_RANGE:
                self.err(at, f"{'.'.join(map(str, at))}: {node} is not tiny (at most {MAX_TINY_RANGE}): the "
                         "generated tests build this model")
        draws = []
        known: set[str] = set(t.config)
        for key, spec in self.draw_order(t.draw):
            at = ("tiny", "draw", key)
            if isinstance(spec, list):
                if not spec:
                    self.err(at, f"tiny.draw.{key}: an empty list has nothing to draw")
                draws.append(DrawIR(key, tuple(spec), None))
            else:
                try:
                    c = expr.compile_config(spec)
                except expr.ExprError as e:
                    self.err(at, f"tiny.draw.{key}: {e}", col=e.col)
                    continue
                for n in c.names:
                    if n not in known and n.split(".")[0] not in known:
                        self.err(at, f"tiny.draw.{key}: '{n}' is not drawn or fixed before it")
                draws.append(DrawIR(key, None, c))
            known.add(key)  # a dotted key (text_config.hidden_size) sets one entry of a nested config
        for rng, name in ((t.batch, "batch"), (t.seq, "seq")):
            if not 1 <= rng[0] <= rng[1] <= MAX_TINY_RANGE:
                self.err(("tiny", name), f"tiny.{name}: a range [low, high] with 1 <= low <= high <= {MAX_TINY_RANGE}")
        for k, impl in enumerate(t.experts):
            if impl not in EXPERTS_IMPLEMENTATIONS:
                self.err(("tiny", "experts", k), f"tiny.experts: unknown experts implementation '{impl}' (CPU: "
                         f"{', '.join(EXPERTS_IMPLEMENTATIONS)})" + suggest(impl, EXPERTS_IMPLEMENTATIONS))
        processor: tuple[tuple[str, Any], ...] | None = None
        images: tuple[tuple[str, Any], ...] | None = None
        if t.processor is not None:
            processor = _processor(t.processor)
        if t.images is not None:
            if t.processor is None:
                self.err(("tiny", "images"), "tiny.images: image inputs need tiny.processor (how to build them)")
            if not t.images.count or not t.images.sizes:
                self.err(("tiny", "images"), "tiny.images: count and sizes each need at least one choice")
            images = (("count", tuple(t.images.count)), ("sizes", tuple(tuple(x) for x in t.images.sizes)))
        image_text = None
        if t.image_text is not None:
            it = t.image_text
            it_draws: list[tuple[str, Any, Any]] = []
            for key, spec in it.draw.items():
                iat: DataPath = ("tiny", "image_text", "draw", key)
                if isinstance(spec, list):
                    it_draws.append((key, tuple(spec), None))
                    continue
                try:
                    it_draws.append((key, None, expr.compile_config(spec)))
                except expr.ExprError as e:
                    self.err(iat, f"tiny.image_text.draw.{key}: {e}", col=e.col)
            image_text = (("model_class", it.model_class), ("config_class", it.config_class),
                          ("config", dict(it.config)), ("draw", tuple(it_draws)),
                          ("processor", _processor(it.processor)),
                          ("images", (("count", tuple(it.images.count)), ("sizes", tuple(tuple(x) for x in it.images.sizes)))),
                          ("examples", it.examples))
        factors = []
        for key, fr in t.factors.items():
            fat: DataPath = ("tiny", "factors", key)
            if (fr.range is None) == (fr.pin is None):
                self.err(fat, f"tiny.factors.{key}: give one of range: [low, high] or pin: value (with its reason)")
                continue
            if fr.pin is not None and not fr.reason:
                self.err(fat, f"tiny.factors.{key}: a pinned factor says why (reason: ...), true of the released checkpoints")
                continue
            if fr.range is not None and not fr.range[0] < fr.range[1]:
                self.err(fat, f"tiny.factors.{key}: range [low, high] needs low < high")
                continue
            rule: dict[str, Any] = {"range": tuple(fr.range)} if fr.range is not None else {"pin": fr.pin}
            if fr.reason:
                rule["reason"] = fr.reason
            factors.append((key, rule))
        layouts = []
        for key, lr in t.layouts.items():
            lat: DataPath = ("tiny", "layouts", key)
            if (lr.options is None) == (lr.pin is None):
                self.err(lat, f"tiny.layouts.{key}: give one of options: [...] or pin: value (with its reason)")
                continue
            if not lr.reason:
                self.err(lat, f"tiny.layouts.{key}: a narrowed or pinned structural option says why (reason: ...), "
                              "true of the released checkpoints")
                continue
            if lr.options is not None and not lr.options:
                self.err(lat, f"tiny.layouts.{key}: options: give at least one value")
                continue
            lrule: dict[str, Any] = {"options": tuple(lr.options)} if lr.options is not None else {"pin": lr.pin}
            lrule["reason"] = lr.reason
            layouts.append((key, lrule))
        return TinyIR(t.model_class, t.config_class, tuple(t.config.items()), tuple(draws), t.batch, t.seq, t.examples,
                      experts=tuple(t.experts), processor=processor, images=images, image_text=image_text,
                      factors=tuple(factors), layouts=tuple(layouts))

    def draw_order(self, draw: dict[str, Any]) -> list[tuple[str, Any]]:
        """The draws in an order that follows their dependencies (each after every draw its
        expression names), otherwise in the order written: a family overriding one draw of its
        base, or adding one a base's expression names, needs no care for the merged key order."""
        keys = list(draw)
        deps: dict[str, set[str]] = {}
        for key, spec in draw.items():
            deps[key] = set()
            if isinstance(spec, str):
                try:
                    names = expr.compile_config(spec).names
                except expr.ExprError:
                    continue  # reported where the draw is compiled
                deps[key] = {d for n in names for d in (n, n.split(".")[0]) if d in draw and d != key}
        order: list[str] = []
        while len(order) < len(keys):
            ready = next((k for k in keys if k not in order and deps[k] <= set(order)), None)
            if ready is None:
                stuck = [k for k in keys if k not in order]
                self.err(("tiny", "draw", stuck[0]), "tiny.draw: these draws depend on each other in a cycle: "
                         + ", ".join(f"{k} (needs {', '.join(sorted(deps[k] - set(order)))})" for k in stuck))
                order += stuck
                break
            order.append(ready)
        return [(k, draw[k]) for k in order]

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


def _term_value(host: str, term: str) -> tuple[str, str]:
    """The (host path, value name) an identity term on ``host`` names: ``self_attn.attention_output`` on
    ``layers[i]`` → ("layers[i].self_attn", "attention_output"); ``model.layers[i+1].layer_input`` →
    ("layers[i]", "layer_input"); ``layers[0].input`` on model → ("layers[i]", "input")."""
    parts = term.split(".")
    if parts[0] == "model" and len(parts) > 1:
        host, parts = "model", parts[1:]
    prefix = _term_prefix(host, parts[:-1])
    target = host if not prefix else (prefix if host == "model" else f"{host}.{prefix}")
    return target, parts[-1]


def _term_prefix(host: str, parts: Sequence[str]) -> str:
    """The host path a term's parts name below ``host``, with a stack's index as ``[i]`` (``layers[0]``,
    ``layers[i+1]``: a block of the stack) and a list item's kept (``self_attn[0]`` inside a block: the host
    ``layers[i].self_attn[0]``): an index is a list item's when the path is inside a block already."""
    inside = host != "model" and "[i]" in host
    out = []
    for part in parts:
        m = re.fullmatch(r"(.*)\[(\d+|i|i[+-]\d+)\]", part)
        if m is None:
            out.append(part)
        elif inside and m.group(2).isdigit():
            out.append(part)  # a list item of a block
        else:
            out.append(f"{m.group(1)}[i]")
            inside = True
    return ".".join(out)


def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, tuple) else [a])
    return out


__all__ = ["resolve", "resolve_texts", "SpecError", "suggest"]


def _processor(p: Any) -> tuple[tuple[str, Any], ...]:
    """A tiny processor's entries (its class's own keyword arguments only when it has some)."""
    out: tuple[tuple[str, Any], ...] = (("class", p.cls), ("image_processor", p.image_processor),
                                        ("image_processor_config", dict(p.image_processor_config)),
                                        ("tokens", tuple(p.tokens)))
    if p.config:
        out = (*out, ("config", dict(p.config)))
    if p.token_names:
        out = (*out, ("token_names", dict(p.token_names)))
    return out
