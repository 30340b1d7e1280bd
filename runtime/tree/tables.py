"""Notebook views (``_repr_html_``) of what the text printouts show: a title, a few facts, tables of rows, a
preformatted text; every string escaped. The callers hand over the same rows their ``__repr__`` prints
(``Support``'s values, a cache's values and shapes, a model's facts and blocks), so the two never drift."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

STYLE = ("<style>.nnatlas-view{font:12px/1.35 system-ui,sans-serif}.nnatlas-view table{border-collapse:collapse;"
         "margin:4px 0 8px}.nnatlas-view th,.nnatlas-view td{text-align:left;padding:1px 8px;border-bottom:1px solid #ddd;"
         "vertical-align:top}.nnatlas-view caption{text-align:left;font-weight:600}.nnatlas-view pre{font-size:11px}</style>")


def table(columns: Sequence[str], rows: Iterable[Sequence[str]], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def view(title: str, parts: Sequence[str], facts: Sequence[tuple[str, str]] = (), text: str = "",
         text_label: str = "") -> str:
    """One view: ``title``, ``facts`` (name, value) as a small table, ``parts`` (from :func:`table`), and ``text``
    (a printout) folded under ``text_label``."""
    out = [f'<div class="nnatlas-view">{STYLE}<strong>{html.escape(title)}</strong>']
    if facts:
        out.append("<table><tbody>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                            for k, v in facts) + "</tbody></table>")
    out += parts
    if text:
        out.append(f"<details><summary>{html.escape(text_label)}</summary><pre>{html.escape(text)}</pre></details>")
    out.append("</div>")
    return "".join(out)
