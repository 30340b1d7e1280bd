"""A small Markdown subset for the notes, rendered with everything escaped.

Paragraphs, fenced code blocks (```python / ```), `inline code`, **bold**, and "- " lists.
"""

from __future__ import annotations

import html
import re
from typing import Any

from markupsafe import Markup

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()]))
        if m.group(1) is not None:
            out.append(f"<code>{html.escape(m.group(1))}</code>")
        else:
            out.append(f"<strong>{html.escape(m.group(2))}</strong>")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def render(text: str) -> Markup:
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            blocks.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            blocks.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in items) + "</ul>")
            items.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            lang = line[3:].strip()
            j = i + 1
            code = []
            while j < len(lines) and not lines[j].startswith("```"):
                code.append(lines[j])
                j += 1
            cls = f' class="language-{html.escape(lang)}"' if lang else ""
            runs = ' data-runs="true"' if lang == "python" else ""
            blocks.append(f"<pre{runs}><code{cls}>{html.escape(chr(10).join(code))}</code></pre>")
            i = j + 1
            continue
        if line.startswith("|"):  # a pipe table: header row, a |---| row, body rows
            flush()
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            body = [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            head = "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
            trs = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
            blocks.append(f"<div class=\"scroll\"><table class=\"note-table\"><thead><tr>{head}</tr></thead>"
                          f"<tbody>{trs}</tbody></table></div>")
            continue
        if not line.strip():
            flush()
        elif line.startswith("- "):
            if para:
                flush()
            items.append(line[2:].strip())
        else:
            if items:
                flush()
            para.append(line.strip())
        i += 1
    flush()
    return Markup("\n".join(blocks))


def inline_text(text: str) -> str:
    """A spec string on one line of a Markdown page: newlines folded, HTML and emphasis inert."""
    text = " ".join(str(text).split())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cell(text: Any) -> str:
    return inline_text(str(text)).replace("|", "\\|")


def code_span(text: str) -> str:
    return " ".join(str(text).split()).replace("`", "'")


def code_cell(text: Any) -> str:
    """A code span's text inside a GFM table cell: a '|' is escaped, or it would split the row."""
    return code_span(str(text)).replace("|", "\\|")


_SPAN = re.compile(r"(`+)(.+?)\1")


def _inert(text: str) -> str:
    """Markdown prose outside code spans with its HTML made text (``<think>`` stays on the page)."""
    out, pos = [], 0
    for m in _SPAN.finditer(text):
        out.append(text[pos:m.start()].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
        out.append(m.group(0))
        pos = m.end()
    out.append(text[pos:].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def body(text: str) -> str:
    """A note's body on a Markdown page: prose with HTML inert, fenced code as it is."""
    out, fenced = [], False
    for line in str(text).split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:
            out.append(_inert(line))
    return "\n".join(out)


def inline(text: str) -> Markup:
    """One line of a spec (a note's title) with its `code` and **bold** drawn, everything else escaped."""
    return Markup(_inline(" ".join(str(text).split())))
