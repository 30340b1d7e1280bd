"""search.js, the site's search index: its entries packed into rows per family (``pack_search``), and read back
(``unpack_search``, ``read_search_script``) as atlas.js's unpackSearch reads them in the browser."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .templating import script_json


# search.js, packed (issue 30: 1.54 MB as one object per entry, its keys, family, page and the text's repeats in
# each): per family a list of rows, each a kind's letter and the fields the entry cannot be derived without;
# atlas.js's unpackSearch and unpack_search below rebuild the entries, and pack_search keeps a row only where
# it rebuilds its entry exactly (else the entry's fields as they are, the row "x").
#   c name                      checkpoint: where sizes, #sizes
#   l name                      load class: where model, #support
#   h cls label native anchor   native class: text "cls label[ model.native]", where label, #anchor
#   v name path                 value of the last h: text "name label.name[ path]", where "label (cls)",
#                               #v-{the h's anchor after host-}-name
#   n title body anchor         note: text "title body", where notes
#   t hook nnsight row          TransformerLens hook: text "hook nnsight", kind "is {row's label.name}",
#                               where TransformerLens, the v row's page (row: its index in the family's rows)
#   r std native                rename: text "std native", kind "standard name of native", where rename, #support
#   g title words page href     a section of the manual (family "manual"): text "title words", kind section, where page
#   x name text kind where href any other entry, as it is ("" text: the name)
def _unpack_row(page: str, row: list[Any], host: list[Any], made: list[dict[str, str]]) -> dict[str, str]:
    """One packed row's entry (``host``: the family's last h row; ``made``: the family's entries so far)."""
    k = row[0]
    if k == "c":
        return {"name": row[1], "kind": "checkpoint", "where": "sizes", "href": page + "sizes"}
    if k == "l":
        return {"name": row[1], "kind": "load class", "where": "model", "href": page + "support"}
    if k == "h":
        return {"name": row[1], "text": f"{row[1]} {row[2]}" + (f" model.{row[3]}" if row[3] else ""),
                "kind": "native class", "where": row[2], "href": page + row[4]}
    if k == "v":
        return {"name": row[1], "text": f"{row[1]} {host[2]}.{row[1]}" + (f" {row[2]}" if row[2] else ""),
                "kind": "value", "where": f"{host[2]} ({host[1]})",
                "href": page + "v-" + host[4].removeprefix("host-") + "-" + row[1], "label": host[2]}
    if k == "n":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": "note", "where": "notes", "href": page + row[3]}
    if k == "t":
        v = made[row[3]]
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": f"is {v['label']}.{v['name']}",
                "where": "TransformerLens", "href": v["href"]}
    if k == "r":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": f"standard name of {row[2]}",
                "where": "rename", "href": page + "support"}
    if k == "g":
        return {"name": row[1], "text": f"{row[1]} {row[2]}", "kind": "section", "where": row[3], "href": row[4]}
    return {"name": row[1], "text": row[2] or row[1], "kind": row[3], "where": row[4], "href": row[5]}


def _entry(family: str, e: dict[str, str]) -> dict[str, str]:
    entry = {"family": family, **{key: val for key, val in e.items() if key != "label"}}
    if entry.get("text") == entry["name"]:
        del entry["text"]
    return entry


def unpack_search(packed: Mapping[str, list[list[Any]]]) -> list[dict[str, str]]:
    """The search entries from search.js's packed rows (what atlas.js's unpackSearch makes of them)."""
    out: list[dict[str, str]] = []
    for family, rows in packed.items():
        made: list[dict[str, str]] = []
        host: list[Any] = ["", "", "", "", ""]
        for row in rows:
            if row[0] == "h":
                host = row
            made.append(_unpack_row(f"{family}.html#", row, host, made))
        out.extend(_entry(family, e) for e in made)
    return out


def pack_search(entries: list[dict[str, str]]) -> dict[str, list[list[Any]]]:
    """search.js's packed rows for ``entries`` (each family's entries in one run, in their order); every row
    is checked to unpack to its entry, else it is kept whole (row "x")."""
    packed: dict[str, list[list[Any]]] = {}
    made: dict[str, list[dict[str, str]]] = {}  # family -> its rows unpacked (what a t row refers to)
    values: dict[str, dict[str, int]] = {}  # family -> a value's page anchor -> its row
    host: list[Any] = []
    for e in entries:
        family = e["family"]
        rows = packed.setdefault(family, [])
        page = f"{family}.html#"
        href = e["href"].removeprefix(page)
        kind, name, text = e["kind"], e["name"], e.get("text", e["name"])
        row: list[Any]
        if kind == "checkpoint":
            row = ["c", name]
        elif kind == "load class":
            row = ["l", name]
        elif kind == "native class":
            label = e["where"]
            native = text.removeprefix(f"{name} {label}").removeprefix(" model.")
            row = ["h", name, label, native, href]
        elif kind == "value" and host:
            row = ["v", name, text.removeprefix(f"{name} {host[2]}.{name}").removeprefix(" ")]
        elif kind == "note":
            row = ["n", name, text.removeprefix(f"{name} "), href]
        elif kind.startswith("is ") and href in values.get(family, {}):
            row = ["t", name, text.removeprefix(f"{name} "), values[family][href]]
        elif kind.startswith("standard name of "):
            row = ["r", name, kind.removeprefix("standard name of ")]
        elif kind == "section" and family == "manual":
            row = ["g", name, text.removeprefix(f"{name} "), e["where"], e["href"]]
        else:
            row = ["x", name, "", kind, e["where"], e["href"]]
        done = made.setdefault(family, [])
        back = _unpack_row(page, row, row if row[0] == "h" else host, done)
        if row[0] != "x" and _entry(family, back) != e:
            row = ["x", name, "" if text == name else text, kind, e["where"], e["href"]]
            back = _unpack_row(page, row, host, done)
        if row[0] == "h":
            host = row
        if row[0] == "v":
            values.setdefault(family, {})[href] = len(rows)
        rows.append(row)
        done.append(back)
    return packed


def search_script(entries: list[dict[str, str]]) -> str:
    """search.js: the packed entries as one compact JSON object, safe inside <script> (script_json)."""
    text = script_json(pack_search(entries), compact=True)
    head = ("/* Generated by nnatlas from specs/: the index's search entries, packed (atlas.js's unpackSearch), loaded "
            "on the search's first use. Do not edit: edit the specs, then run `make generate`. */\n")
    return f"{head}window.nnatlasSearchPacked = {text};\n"


def read_search_script(text: str) -> list[dict[str, str]]:
    """The entries a search.js holds (tests; the browser's are atlas.js's unpackSearch of the same rows)."""
    start = text.index("window.nnatlasSearchPacked = ") + len("window.nnatlasSearchPacked = ")
    return unpack_search(json.loads(text[start:].rstrip().rstrip(";")))
