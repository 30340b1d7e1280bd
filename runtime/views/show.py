"""``nnatlas.show``: interactive notebook views, each an object whose ``_repr_html_`` a notebook renders.

    nnatlas.show.attention(pattern, tokens)   # a head picker, the pattern as a grid, hover for the weight

The HTML is one self-contained string: its style and script inline, no outside script, font, image or request,
every token escaped (an HTML attribute or text, or JSON inside the script with ``<``, ``>`` and ``&`` as
``\\u`` escapes). Several views on one page do not interfere (each has its own id). Needs no matplotlib.
"""

from __future__ import annotations

import html
import json
import uuid
from collections.abc import Sequence
from typing import Any

from .plot import _labels, _one_prompt, _tensor

_STYLE = """
#{id} {{ font: 12px/1.3 system-ui, sans-serif; color: #222; position: relative; }}
#{id} .nn-grid {{ border-collapse: collapse; margin-top: 6px; }}
#{id} .nn-grid th {{ font-weight: normal; padding: 0 4px; white-space: pre; }}
#{id} .nn-grid thead th {{ writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }}
#{id} .nn-grid tbody th {{ text-align: right; }}
#{id} .nn-grid td {{ width: 18px; height: 18px; border: 1px solid #eee; padding: 0; }}
#{id} .nn-grid td.nn-on {{ outline: 2px solid #d62728; }}
#{id} .nn-card {{ position: absolute; background: #fff; border: 1px solid #888; padding: 3px 6px;
  box-shadow: 0 1px 3px rgba(0,0,0,.3); pointer-events: none; white-space: pre; }}
"""

_SCRIPT = """
(function () {
  var root = document.getElementById(%(id)s);
  var data = %(data)s;
  var select = root.querySelector(".nn-head"), card = root.querySelector(".nn-card");
  var cells = root.querySelectorAll(".nn-grid td");
  function paint() {
    var w = data.weights[Number(select.value)];
    cells.forEach(function (td) {
      var v = w[Number(td.dataset.q)][Number(td.dataset.k)];
      td.dataset.w = v.toFixed(4);
      td.style.background = "rgba(33, 102, 172, " + v + ")";
    });
  }
  root.querySelector(".nn-grid").addEventListener("mouseover", function (e) {
    var td = e.target.closest("td");
    if (!td) { return; }
    cells.forEach(function (c) { c.classList.remove("nn-on"); });
    td.classList.add("nn-on");
    card.textContent = "head " + data.heads[Number(select.value)] + "  " + data.queries[Number(td.dataset.q)] +
      " \\u2192 " + data.keys[Number(td.dataset.k)] + ": " + td.dataset.w;
    card.style.left = (td.offsetLeft + td.offsetWidth + 6) + "px";
    card.style.top = (td.offsetTop + td.offsetHeight + 6) + "px";
    card.hidden = false;
  });
  root.querySelector(".nn-grid").addEventListener("mouseleave", function () { card.hidden = true; });
  select.addEventListener("change", paint);
  paint();
})();
"""


def _script_json(x: Any) -> str:
    """JSON that cannot end or open anything inside a <script> element."""
    return json.dumps(x, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class AttentionView:
    """An attention pattern for a notebook: ``_repr_html_`` draws it with a head picker and hover cards."""

    def __init__(self, weights: list[list[list[float]]], keys: list[str], queries: list[str], heads: list[int]):
        self.weights, self.keys, self.queries, self.heads = weights, keys, queries, heads

    def __repr__(self) -> str:
        return f"<attention view: {len(self.heads)} heads, {len(self.queries)} queries x {len(self.keys)} keys>"

    def _repr_html_(self) -> str:
        uid = f"nnatlas-attn-{uuid.uuid4().hex[:12]}"
        options = "".join(f'<option value="{n}">head {h}</option>' for n, h in enumerate(self.heads))
        head = "".join(f"<th>{html.escape(k)}</th>" for k in self.keys)
        rows = "".join(
            f"<tr><th>{html.escape(q)}</th>" + "".join(f'<td data-q="{i}" data-k="{k}"></td>'
                                                      for k in range(len(self.keys))) + "</tr>"
            for i, q in enumerate(self.queries))
        data = {"weights": self.weights, "keys": self.keys, "queries": self.queries, "heads": self.heads}
        return (f'<div id="{uid}" class="nnatlas-attention"><style>{_STYLE.format(id=uid)}</style>'
                f'<label>head <select class="nn-head">{options}</select></label>'
                f'<table class="nn-grid"><thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>'
                f'<div class="nn-card" hidden></div>'
                f'<script>{_SCRIPT % {"id": _script_json(uid), "data": _script_json(data)}}</script></div>')


def attention(pattern: Any, tokens: Sequence[str] | None = None) -> AttentionView:
    """An interactive view of ``pattern`` (``attention_probabilities`` as a trace saves it, ``[batch=1, heads,
    queries, keys]``): pick a head, hover a cell for its weight. ``tokens``: one label per key."""
    p = _one_prompt(_tensor(pattern, "show.attention(pattern)"), 3, "show.attention(pattern)",
                    "[batch, heads, queries, keys] (attention_probabilities)")
    keys = _labels(tokens, p.shape[2], "show.attention")
    weights = [[[round(float(w), 6) for w in row] for row in head] for head in p.tolist()]
    return AttentionView(weights, keys, keys[-p.shape[1]:], list(range(p.shape[0])))
