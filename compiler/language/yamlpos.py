"""YAML to plain data, keeping where every key and value stands.

Safe by construction: only the safe loader's scalars, mappings and sequences; anchors and
aliases are refused (no alias bombs), as are duplicate keys, tabs in indentation, multiple
documents and a document that is not a mapping. Bounded: nesting deeper than ``MAX_DEPTH`` is
refused while parsing (before anything recursive sees it), scalars are strings, integers, finite
floats, booleans or null (no dates, binary or sets), strings hold at most ``MAX_STRING`` characters
and integers at most ``MAX_INT`` in magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import Problem

#: Why a spec has no anchors: every entry must stand where it is read, so that an error, a page and a
#: reviewer each point at the one line that says it (an alias's line is not where its words are), and so
#: that a spec's size is the size of its text (no alias bombs).
ANCHORS_WHY = ("anchors and aliases are not allowed in specs: each entry must stand on the line that an error or "
               "a page points to. Share between families with extends: (or a part under specs/parts/), else "
               "write the entry again")

Path = tuple[str | int, ...]
MAX_BYTES = 1 << 20
MAX_DEPTH = 32  # mappings and sequences inside each other (the specs use 7)
MAX_STRING = 20_000  # characters in one string (the longest note body is ~3,400)
MAX_INT = 2**53  # |integer| (exact in a float and in JSON: the pages carry config values as JSON)
# libyaml's parser when PyYAML was built with it (30x faster), else the pure-Python one; both
# resolve scalars with the same safe resolver, and the nesting is bounded before composing
_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SCALAR_TAGS = {"tag:yaml.org,2002:" + t: t for t in ("str", "int", "float", "bool", "null")}


@dataclass
class Located:
    """A document's data and the (line, col) of each path, 1-based; ``keys`` holds mapping keys."""

    file: str
    data: dict[str, Any]
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def pos(self, path: Path, key: bool = False) -> tuple[int, int]:
        """The position of ``path``, or of its nearest ancestor that has one."""
        table = self.keys if key else self.values
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if not key and p in self.keys:
                return self.keys[p]
            p = p[:-1]
        return self.values.get((), (1, 1))


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def load(text: str, file: str) -> tuple[Located | None, list[Problem]]:
    problems: list[Problem] = []
    if len(text.encode()) > MAX_BYTES:
        return None, [Problem(file, 1, 1, f"spec is larger than {MAX_BYTES} bytes")]
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if stripped.startswith("\t"):
            problems.append(Problem(file, n, len(line) - len(stripped) + 1, "tab in indentation; indent with spaces"))
    if problems:
        return None, problems
    try:
        depth = 0
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                what = "alias" if isinstance(event, yaml.AliasEvent) else "anchor"
                m = event.start_mark
                problems.append(Problem(file, m.line + 1, m.column + 1, f"{what} '{event.anchor}': " + ANCHORS_WHY))
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    m = event.start_mark
                    problems.append(Problem(file, m.line + 1, m.column + 1,
                                            f"nested deeper than {MAX_DEPTH} levels of mappings and lists"))
                    break  # composing it would recurse that deep
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        if problems:
            return None, problems
        docs = list(yaml.compose_all(text, Loader=_LOADER))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at_line, at_col = (int(mark.line) + 1, int(mark.column) + 1) if mark else (1, 1)
        if "nesting depth" in str(e.problem):  # libyaml's own limit, met while it reads ahead
            return None, [Problem(file, at_line, at_col, f"nested deeper than {MAX_DEPTH} levels of mappings and lists")]
        return None, [Problem(file, at_line, at_col, f"invalid YAML: {e.problem or e.context}")]
    except yaml.YAMLError as e:  # a reader error: a character YAML does not allow
        return None, [Problem(file, 1, 1, f"invalid YAML: {str(e).splitlines()[0]}")]
    if len(docs) != 1 or docs[0] is None:
        where = _mark(docs[1]) if len(docs) > 1 else (1, 1)
        return None, [Problem(file, *where, "a spec is exactly one YAML document")]
    root = docs[0]
    if not isinstance(root, yaml.MappingNode):
        return None, [Problem(file, *_mark(root), "a spec must be a mapping of keys to values")]
    builder = _Builder(file, problems)
    located = builder.located
    located.data = builder.build(root, ())
    return (located if not problems else None), problems


class _Builder:
    """A spec's data from its YAML nodes, each path positioned (methods, not nested functions: a
    recursive closure is a reference cycle, which would keep every parsed node alive until the cycle
    collector runs)."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file, self.problems = file, problems
        self.located = Located(file, {})
        self.seen: set[int] = set()
        self.scalars = yaml.constructor.SafeConstructor()

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.located.values[path] = _mark(node)
        if id(node) in self.seen:  # the composer hands an alias back as the anchored node itself
            self.problems.append(Problem(self.file, *_mark(node), ANCHORS_WHY))
            return None
        self.seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                if knode.tag == "tag:yaml.org,2002:merge":
                    self.problems.append(Problem(self.file, *_mark(knode), "merge keys (<<) are not allowed in specs"))
                    continue
                if not isinstance(knode, yaml.ScalarNode):
                    self.problems.append(Problem(self.file, *_mark(knode), "mapping keys must be plain strings"))
                    continue
                key = str(knode.value)
                if len(key) > MAX_STRING:
                    self.problems.append(Problem(self.file, *_mark(knode),
                                                 f"a key of {len(key)} characters (at most {MAX_STRING})"))
                    continue
                if key in out:
                    first = self.located.keys[(*path, key)]
                    self.problems.append(
                        Problem(self.file, *_mark(knode), f"duplicate key '{key}' (first at line {first[0]})")
                    )
                    continue
                self.located.keys[(*path, key)] = _mark(knode)
                out[key] = self.build(vnode, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.scalar(node)

    def scalar(self, node: yaml.Node) -> Any:
        kind = _SCALAR_TAGS.get(node.tag)
        if kind is None:
            what = node.tag.rsplit(":", 1)[-1]
            self.problems.append(Problem(self.file, *_mark(node), f"a {what!r} value: a spec holds strings, numbers, "
                                         "booleans and null only (quote it to make it a string)"))
            return None
        raw = str(node.value)
        if kind == "int" and len(raw) > 24:  # int() of thousands of digits is slow, then refused
            self.problems.append(Problem(self.file, *_mark(node), f"integer too large (at most {MAX_INT} in magnitude)"))
            return None
        try:
            value = self.scalars.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as e:
            self.problems.append(Problem(self.file, *_mark(node), f"invalid scalar: {str(e).splitlines()[0]}"))
            return None
        if isinstance(value, str) and len(value) > MAX_STRING:
            self.problems.append(Problem(self.file, *_mark(node),
                                         f"a string of {len(value)} characters (at most {MAX_STRING})"))
            return None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            self.problems.append(Problem(self.file, *_mark(node), f"integer too large (at most {MAX_INT} in magnitude)"))
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problems.append(Problem(self.file, *_mark(node), f"{raw!r} is not a finite number"))
            return None
        return value
