"""The names a spec may give: the only spec text that reaches generated Python as code; and the names
of the classes an adapter declares for its hosts (``class_name``), none of which may take a name the
adapter itself uses (``RESERVED_CLASSES``).

Everything else a spec says is emitted as a string literal (``repr``) or a checked number.
A name is ASCII ``[A-Za-z_][A-Za-z0-9_]*``, not a Python keyword (soft keywords included),
not a builtin constant, and does not start with two underscores (no dunders, no class-private
name mangling); a dotted path (``layers[i].self_attn``) is names joined by ``.``, each optionally
followed by ``[i]`` (a block of a stack) or, for a host path, ``[0]`` (a fixed item of a list child:
``layers[i].self_attn[0]``). ``problem`` says what is wrong with a name, or None when it is fine.
"""

from __future__ import annotations

import keyword
import re

MAX_NAME = 100  # characters in one name
MAX_PATH = 400  # characters in one dotted path
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_ITEM = re.compile(r"\[(i|[0-9]+)\]$")  # a path part's index: [i] (a block) or [0] (a list item)
_RESERVED = frozenset({*keyword.kwlist, *keyword.softkwlist})


def problem(name: object, what: str = "name") -> str | None:
    """Why ``name`` cannot be a name in generated code, or None."""
    if not isinstance(name, str):
        return f"{what} must be a string, not {type(name).__name__}"
    shown = _shown(name)
    if not _NAME.fullmatch(name):
        return f"{what} {shown!r} is not a name (letters, digits and _, not starting with a digit)"
    if len(name) > MAX_NAME:
        return f"{what} {shown!r} is longer than {MAX_NAME} characters"
    if name in _RESERVED or name.lower() in ("none", "true", "false"):
        return f"{what} {name!r} is a Python keyword"
    if name.startswith("__"):
        return f"{what} {name!r} starts with '__' (reserved for Python's own names)"
    return None


def path_problem(path: object, what: str = "path", block_index: bool = True, digits: bool = False) -> str | None:
    """Why ``path`` is not names joined by '.' or None. ``block_index``: a name may be followed by
    ``[i]`` (``layers[i].self_attn``); ``digits``: a part may be a number (a native ``layers.0``)."""
    if not isinstance(path, str) or not path:
        return f"{what} must be a non-empty string"
    if len(path) > MAX_PATH:
        return f"{what} is longer than {MAX_PATH} characters"
    for part in path.split("."):
        name = _ITEM.sub("", part) if block_index else part
        if digits and name.isascii() and name.isdigit():
            continue
        bad = problem(name, f"{what} {_shown(path)!r}: part" if "." in path else what)
        if bad:
            return bad
    return None


def module_names(path: str) -> list[str]:
    """The module names a spec's dotted path gives (``layers[i].self_attn``: layers, self_attn), the root
    ``model`` left out: each is one of the vocabulary's modules: or the family's own."""
    return [n for n in (_ITEM.sub("", part) for part in path.split(".")) if n and n != "model"]


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def is_name(name: object) -> bool:
    return problem(name) is None


# the names a family adapter imports or defines at module level: no host class may take one
RESERVED_CLASSES = frozenset({"Any", "AtlasModel", "Condition", "Family", "FunctionGroup", "Host", "HostList",
                              "HostSpec", "Identity", "Layout", "Loader", "ReadPoint", "TypedHost", "TypedModel",
                              "Value", "ValueSlot", "ValueSpec", "ViewOp", "Wrapper"})


def class_name(path: str) -> str:
    if path == "model":
        return "Model"
    parts = [re.sub(r"\[([0-9]+)\]$", r"_\1", p.replace("[i]", "")) for p in path.split(".")]  # self_attn[0]: SelfAttn0
    parts[0] = parts[0].rstrip("s") if parts[0].endswith("layers") else parts[0]
    return "".join(w.capitalize() for p in parts for w in p.split("_"))
