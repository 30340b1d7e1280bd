"""The templates' jinja2 environment (``templates/``), built once: its filters write Python literals and checked
names (:mod:`.pysource`), Markdown, config words and JSON safe inside <script>; ``.html.j2`` templates autoescape."""

from __future__ import annotations

import json
from typing import Any

import jinja2
from markupsafe import Markup

from . import config_words, markdown
from .pysource import checked_name, dictlit, docline, identifier, pylit


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("nnatlas.compiler.emit", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=jinja2.select_autoescape(["html.j2"], default_for_string=False, default=False),
    )
    env.filters["py"] = repr
    env.filters["pylit"] = pylit
    env.filters["dictlit"] = dictlit
    env.filters["ident"] = identifier
    env.filters["name"] = checked_name
    env.filters["docline"] = docline
    env.tests["startingwith"] = lambda value, prefix: isinstance(value, str) and value.startswith(prefix)
    env.filters["md"] = markdown.render
    env.filters["json"] = script_json
    env.filters["cfgtext"] = config_words.config_text
    env.filters["mdtext"] = markdown.inline_text
    env.filters["mdcell"] = markdown.cell
    env.filters["mdcode"] = markdown.code_span
    env.filters["mdcodecell"] = markdown.code_cell
    env.filters["mdbody"] = markdown.body
    env.filters["mdinline"] = markdown.inline
    env.filters["cfglabel"] = config_words.config_label
    env.filters["params"] = config_words.param_text
    return env


def script_json(value: Any, compact: bool = False) -> Markup:
    """JSON safe inside <script>: no '<', '>' or '&' survive as such, so no '</script>' can close it.
    ``compact``: no spaces, and keys in the value's own order (search.js's packed rows)."""
    text = (json.dumps(value, ensure_ascii=True, separators=(",", ":")) if compact
            else json.dumps(value, sort_keys=True, ensure_ascii=True))
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


_ENV: jinja2.Environment | None = None


def env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = _env()
    return _ENV
