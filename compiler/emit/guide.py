"""The manual: every page of docs/ as a guide page of the site, beside the family pages.

``docs/NAME.md`` becomes ``generated/docs/guide-NAME.html`` (the hyphen keeps the name apart from every family's
page: a family's name is an identifier), but for the two pages the site renders its own way: ``spec.md``, which
the compiler writes from its own models (``compiler/emit/reference.py``, ``spec.html``), and ``cookbook.md``
(``compiler/emit/cookbook.py``, ``cookbook.html``). A page is Markdown in the subset the notes use
(``compiler/emit/markdown.py``: paragraphs, ``- `` lists, pipe tables, fenced code, `code`, **bold**), plus ``## `` and
``### `` headings and links: ``[text](other.md#anchor)`` to a page of docs/ becomes a link to its site page, one to
a page the site does not have (the README, a source file, an address outside) stays its text. Everything is
escaped as the notes are. The index lists the pages in reading order (``ORDER``; a page it does not name after
them, by name) and its search finds each section's words (``entries``: search.js's ``g`` rows).

tests/test_docs.py runs every page's python blocks, and its cheap ``nnatlas`` lines, as a reader would.
"""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from ..errors import GenerateError
from . import cookbook, markdown

SOURCE = "docs"
OWN_PAGES = {"spec": "spec.html", "cookbook": "cookbook.html"}  # docs/ pages the site renders its own way
ORDER = ("getting-started", "concepts", "families", "caching", "tensor-parallel", "verification", "cli", "security",
         "contributing", "architecture")
NOT_RUN = "# not run by the tests:"  # the first line of a code block the tests cannot run, then why
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
FAMILY = "manual"  # the search entries' family (no model family is named so, and a "g" row needs none)


@dataclass(frozen=True)
class Section:
    title: str
    anchor: str
    body: str  # the section's Markdown, without its heading


@dataclass(frozen=True)
class Page:
    name: str  # docs/NAME.md
    title: str
    intro: str
    sections: tuple[Section, ...]

    @property
    def href(self) -> str:
        return page_name(self.name)


def page_name(name: str) -> str:
    """The site page of docs/NAME.md."""
    return OWN_PAGES.get(name, f"guide-{name}.html")


def read(root: Path) -> dict[str, str]:
    """docs/NAME.md → its text, for every guide page of a checkout, in reading order ({} without docs/)."""
    folder = root / SOURCE
    found = {p.stem: p for p in folder.glob("*.md")} if folder.is_dir() else {}
    for name in found:
        if name not in OWN_PAGES and not _NAME.fullmatch(name):
            raise GenerateError(f"{SOURCE}/{name}.md: a guide page's name is lower-case words joined by '-' "
                                "(its site page is guide-NAME.html)")
    names = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER and n not in OWN_PAGES)
    return {n: found[n].read_text(encoding="utf-8") for n in names}


def parse(name: str, text: str) -> Page:
    title, intro, sections = cookbook.parse(text)
    return Page(name, title, intro, tuple(Section(s.title, s.anchor, s.body) for s in sections))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of a page, (language, code), in order (the cookbook's reading of a fence)."""
    return cookbook.code_blocks(text)


def runs(code: str) -> bool:
    """Whether the tests run a block: all but those whose first line says why not (``NOT_RUN``)."""
    return not code.lstrip().startswith(NOT_RUN)


_LINK = re.compile(r"\[((?:[^\[\]<]|<code>[^<]*</code>)+)\]\(([^()\s<>\"']+)\)")
_PRE = re.compile(r"(<pre.*?</pre>)", re.S)


def _links(rendered: str, known: set[str]) -> str:
    """``[text](target)`` in rendered (escaped) HTML, outside code blocks, as a link where the target is a page
    of the site (``known``: docs/ names), else as its text."""
    def link(m: re.Match[str]) -> str:
        text, target = m.group(1), html.unescape(m.group(2))
        path, _, fragment = target.partition("#")
        if not path and fragment:
            return f'<a href="#{html.escape(fragment)}">{text}</a>'
        stem = path.removeprefix("docs/").removeprefix("./")
        if stem.endswith(".md") and stem[:-3] in known | set(OWN_PAGES) and "/" not in stem:
            href = page_name(stem[:-3]) + (f"#{fragment}" if fragment else "")
            return f'<a href="{html.escape(href)}">{text}</a>'
        return text
    parts = _PRE.split(rendered)
    return "".join(_not_run(p) if p.startswith("<pre") else _LINK.sub(link, p) for p in parts)


def _not_run(pre: str) -> str:
    """A python block the tests do not run (``NOT_RUN``) says so on the page: ``data-runs="false"``."""
    head = '<pre data-runs="true"><code class="language-python">'
    if pre.startswith(head) and not runs(html.unescape(pre[len(head):])):
        return '<pre data-runs="false">' + pre.removeprefix('<pre data-runs="true">')
    return pre


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def render_body(body: str, known: set[str], taken: set[str]) -> Markup:
    """A section's Markdown as HTML: ``### `` subheadings (ids unique on the page: ``taken``), the rest by
    ``markdown.render``, then the links."""
    chunks: list[tuple[str | None, list[str]]] = [(None, [])]
    fenced = False
    for line in body.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("### "):
            chunks.append((line[4:].strip(), []))
        else:
            chunks[-1][1].append(line)
    out: list[str] = []
    for heading, lines in chunks:
        if heading is not None:
            anchor = _unique(_anchor(heading), taken)
            out.append(f'<h3 id="{anchor}">{markdown.inline(heading)}</h3>')
        out.append(str(markdown.render("\n".join(lines))))
    return Markup(_links("\n".join(out), known))


def section_anchors(page: Page, taken: set[str] | None = None) -> list[str]:
    """Each section's id on its page (its title's words; ``-2``, ``-3`` where two titles make the same),
    before any subheading's: ``taken`` gets them."""
    taken = {"main", "contents"} if taken is None else taken
    return [_unique(s.anchor, taken) for s in page.sections]


def _unique(anchor: str, taken: set[str]) -> str:
    base, n = anchor or "section", 2
    while anchor in taken or not anchor:
        anchor, n = f"{base}-{n}", n + 1
    taken.add(anchor)
    return anchor


def pages(texts: dict[str, str]) -> list[Page]:
    return [parse(name, text) for name, text in texts.items()]


def render_html(page: Page, text: str, everything: list[Page], cookbook: bool = True) -> str:
    from .templating import env

    sha = hashlib.sha256(text.encode()).hexdigest()
    source = f"{SOURCE}/{page.name}.md"
    header = (f"<!-- Generated by nnatlas from {source} (sha256 {sha}). Do not edit: change {source}, "
              "then run `make generate`. -->")
    known = {p.name for p in everything}
    taken = {"main", "contents"}
    anchors = section_anchors(page, taken)
    sections = [{"title": s.title, "anchor": a, "body": render_body(s.body, known, taken)}
                for s, a in zip(page.sections, anchors)]
    return env().get_template("guide.html.j2").render(
        header=header, page=page, intro=render_body(page.intro, known, taken), sections=sections,
        inline=markdown.inline, cookbook=cookbook, guides=[{"title": p.title, "href": p.href, "current": p.name == page.name}
                                        for p in everything])


def render_all(texts: dict[str, str], everything: list[Page] | None = None, cookbook: bool = True) -> dict[str, str]:
    """generated/docs/guide-NAME.html → its page, for every docs/ page ``read`` found (``everything``: their
    ``pages`` when the caller has parsed them; ``cookbook``: the site has a cookbook page to link to)."""
    everything = pages(texts) if everything is None else everything
    return {f"generated/docs/{p.href}": render_html(p, texts[p.name], everything, cookbook) for p in everything}


def _words(body: str) -> str:
    """A section's words for the search, each once, in the order they first come (code and tables included:
    the manual's names are what a reader types)."""
    seen: dict[str, None] = {}
    for w in re.findall(r"[\w.\[\]/-]+", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", body)):
        w = w.strip(".-/[]")
        if len(w) > 1 and w.lower() not in seen:
            seen[w.lower()] = None
    return " ".join(seen)


def entries(everything: list[Page]) -> list[dict[str, str]]:
    """The search's entries for the guide pages: one a section, its title and its words, linking the section."""
    out: list[dict[str, str]] = []
    for p in everything:
        for s, anchor in zip(p.sections, section_anchors(p)):
            out.append({"text": f"{s.title} {_words(s.body)}", "name": s.title, "kind": "section",
                        "family": FAMILY, "where": p.title, "href": f"{p.href}#{anchor}"})
    return out
