"""Python source from what a spec says: literals (``pylit``, ``dictlit``), names checked as they are written
(``checked_name``, ``identifier``, ``docline``), and objects of the runtime's data model as the expressions that build
them (``construct``). Pure: text in memory.

What a spec says reaches generated Python only as literals (``repr``, ``pylit``) or as names
``compiler.names`` accepted (the resolver checks them at their file:line:col); the ``name``
filter checks each such name again as it is written, so a name that slipped past the resolver
stops the render instead of becoming code.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nnatlas.spec import Condition, Layout

from ..language import names


class EmitError(ValueError):
    """Something the resolver should have refused reached a template (a bug, never written out)."""


def checked_name(text: Any) -> str:
    """``text`` if it may stand as a name in Python source, else EmitError."""
    bad = names.problem(text)
    if bad:
        raise EmitError(f"refusing to write {bad} into generated Python")
    return str(text)


def pylit(value: Any) -> str:
    """A deterministic Python literal: tuples for sequences, sorted-nothing dicts in given order."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise EmitError(f"no Python literal for {value!r}")
        return repr(value)
    if isinstance(value, list | tuple):
        inner = ", ".join(pylit(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{pylit(k)}: {pylit(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


def dictlit(value: Any) -> str:
    """A JSON-like config mapping as a Python literal with lists (configs want lists)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{pylit(k)}: {dictlit(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dictlit(v) for v in value) + "]"
    return pylit(value)


@dataclass(frozen=True)
class Ref:
    """A name of the generated module (a function it defines) standing where the runtime's data model
    holds that object: ``construct`` writes the name."""

    name: str

    def __call__(self, *args: Any) -> Any:
        raise EmitError(f"{self.name} is a name of the generated source; nothing calls it while generating")


def construct(obj: Any, names: Mapping[Any, str] | None = None, indent: int = 0,
              multiline: tuple[type, ...] = ()) -> str:
    """An object of the runtime's data model (``nnatlas.spec``: frozen dataclasses, tuples, mappings,
    literals) as the Python expression that builds it: required fields by position, the others by keyword
    where they differ from their default. ``names``: objects the module names once (a shared ``Layout``);
    a :class:`Ref` is written as its name. Instances of ``multiline`` classes take one line per field."""
    names = names or {}
    if isinstance(obj, Ref):
        return checked_name(obj.name)
    if isinstance(obj, Layout | Condition) and obj in names:
        return names[obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        args: list[str] = []
        inner = indent + 4 if isinstance(obj, multiline) else indent
        for name, has_default, default in _fields(type(obj)):
            value = getattr(obj, name)
            if not has_default:
                args.append(construct(value, names, inner, multiline))
            elif type(value) is not type(default) or value != default:
                args.append(f"{name}={construct(value, names, inner, multiline)}")
        return _call(type(obj).__name__, args, indent, isinstance(obj, multiline))
    if isinstance(obj, tuple | list):
        items = [construct(v, names, indent + 4, multiline) for v in obj]
        inline = f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        if any("\n" in it for it in items) or (len(items) > 1 and len(inline) > 100):
            return _call("", items, indent, True)
        return inline
    if isinstance(obj, Mapping):
        return "{" + ", ".join(f"{pylit(k)}: {construct(v, names, indent, multiline)}" for k, v in obj.items()) + "}"
    return pylit(obj)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, bool, Any], ...]:
    """(name, whether it has a default, the default) of each field of a data-model class, once per class."""
    out: list[tuple[str, bool, Any]] = []
    for fld in dataclasses.fields(cls):
        if fld.default is not dataclasses.MISSING:
            out.append((fld.name, True, fld.default))
        elif fld.default_factory is not dataclasses.MISSING:
            out.append((fld.name, True, fld.default_factory()))
        else:
            out.append((fld.name, False, None))
    return tuple(out)


def _call(name: str, args: list[str], indent: int, multiline: bool) -> str:
    if not multiline:
        return f"{name}({', '.join(args)})"
    pad = " " * (indent + 4)
    return f"{name}(\n" + "".join(f"{pad}{a},\n" for a in args) + " " * indent + ")"


def identifier(text: str) -> str:
    """ASCII letters, digits and _ only (``\\W`` would keep non-ASCII letters and digits)."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")


def docline(text: str) -> str:
    """Text for inside a triple-quoted docstring: printable ASCII, no quote or backslash."""
    return re.sub(r"[^ -~]|[\"\\]", "?", text)
