"""What a family page shows, computed from the IR: ``PageModel``, its drawing (``diagram``) and its tables: the
hosts and their values as support() lists them, tensor parallel, where TransformerLens's hooks and the SAE points
land, the checkpoints' sizes and configs.

Pure data for the templates (``page.html.j2``, ``page.md.j2``, ``index.html.j2``): no HTML here,
so everything that came from a spec is escaped by the templates' autoescape in one place.
"""

from __future__ import annotations

from typing import Any

from nnatlas.tree.foreign_names import SAE_POINTS, TRANSFORMER_LENS

from ..language.ir import HostIR, ValueIR
from .cards import RECOMPUTED_WORDS, SDPA_RECOMPUTED_WORDS, host_anchor, nnsight_path, value_anchor, value_card
from .config_words import NOT_SERVED_TEXT, evaluate
from .diagram import Drawing


class PageModel(Drawing):
    """One family's page: its drawing and its tables."""

    # ---- support() tables ----
    def hosts(self) -> list[dict[str, Any]]:
        f = self.f
        out = []
        for h in f.hosts:
            cls = h.cls
            built = str(self.first.get("class", "")) if self.first else ""
            if h.path == "model" and built and built != h.cls:  # the page's load builds another class
                cls = f"{built} (or {h.cls})"
            out.append({"host": h, "cls": cls, "anchor": host_anchor(h, f),
                        "label": "model" if h.path == "model" else f"model.{h.path}",
                        "values": [(v, value_card(h, v, f)) for v in h.values]})
        return out

    def tensor_parallel(self) -> dict[str, Any] | None:
        """What support() says of each value under tensor parallel (2 ranks), or why the family cannot be sharded:
        the printout's facts, computed by the runtime's own code (``nnatlas.parallel.tensor_parallel.planned``)."""
        found = self.facts.get("tensor_parallel")
        return found if isinstance(found, dict) else None

    def image_text(self) -> str:
        return str(self.first.get("class", "")) if self.serves_processor() and self.first else ""

    def page_serves(self, v: ValueIR) -> bool:
        """Whether the load this page is built on serves ``v`` although it needs a load (the image-text
        one builds the vision encoder, so a value needing the processor is unconditional here; a pattern
        read inside eager attention is recomputed under sdpa and flex attention)."""
        return bool(v.needs and ((v.needs.name == "processor" and self.serves_processor()) or v.recomputed))

    @staticmethod
    def served_words(v: ValueIR) -> str:
        """How the loads serve a conditional value the page serves."""
        if v.recomputed:
            return SDPA_RECOMPUTED_WORDS if v.read is not None and v.read.recompute else RECOMPUTED_WORDS
        return v.needs.says.replace("needs ", "served by ", 1) if v.needs else ""

    def warn(self, v: ValueIR) -> bool:
        return bool(v.needs) and not self.page_serves(v)

    def _mixers(self) -> list[str]:
        return [h.path for h in self.f.hosts if h.path.startswith("layers[i].") and h.path.count(".") == 1
                and not h.path.endswith(".mlp")]

    def _served(self, host: str, value: str) -> list[tuple[HostIR, ValueIR]]:
        """``{attn}``: every mixer of the block; ``{softmax}``: the mixers with an attention pattern
        (TransformerLens's attn.hook_* name softmax attention's tensors, not a DeltaNet's)."""
        if "{softmax}" in host:
            hosts = [m for m in self._mixers() if any(v.name == "attention_probabilities"
                                                      for h in self.f.hosts_at(m) for v in h.values)]
        else:
            hosts = self._mixers() if "{attn}" in host else [host]
        out = []
        for path in hosts:
            for h in self.f.hosts_at(path):
                for v in h.values:
                    if v.name == value and v.missing is None:
                        out.append((h, v))
                        break
        return out

    def coming_from(self) -> list[dict[str, Any]]:
        """TransformerLens hook names and nnsight paths → the standard values this family serves."""
        rows = []
        seen = set()
        rotary = any("rotary" in t.lower() for t, _ in self.f.traits)
        for tl, host, value, differs in TRANSFORMER_LENS:
            if ".hook_rot_" in tl and not rotary:
                continue  # TransformerLens names rotated queries and keys only on a rotary model
            if tl.endswith((".hook_q", ".hook_k")) and not rotary:
                differs = "per key/value head (no repeat to the query heads)" if tl.endswith("k") else ""
            for h, v in self._served(host, value):
                if (tl, h.path) in seen:
                    continue
                seen.add((tl, h.path))
                std = (f"model.{h.path}." if h.path != "model" else "model.") + v.name
                when = f" (when {h.when_text})" if h.when_text else ""
                rows.append({"tl": tl, "nnatlas": std, "anchor": value_anchor(h, v, self.f),
                             "nnsight": nnsight_path(self.f, h.path, v) or "no module boundary: " + v.words,
                             "differs": (differs + when).strip(), "warn": self.warn(v),
                             "needs": v.needs.says if v.needs else ""})
        return rows

    def sae_points(self) -> list[dict[str, str]]:
        """The SAE hook points, for a page whose notes name SAE repositories."""
        if not any("sae" in (n.title + n.body).lower() for n in self.f.notes):
            return []
        rows = []
        for point, host, value in SAE_POINTS:
            for h, v in self._served(host, value):
                rows.append({"point": point, "nnatlas": (f"model.{h.path}." if h.path != "model" else "model.") + v.name,
                             "anchor": value_anchor(h, v, self.f), "nnsight": nnsight_path(self.f, h.path, v)})
        return rows

    def sizes(self) -> list[dict[str, Any]]:
        """Per checkpoint: layers, d_model, heads, kv heads, head_dim, vocab and parameters (meta device)."""
        facts = {c["name"]: c for c in self.facts.get("checkpoints", [])}
        out = []
        for c in self.checkpoints():
            n = c["normalized"]
            out.append({"name": c["name"], "layers": n.get("num_layers"), "d_model": n.get("hidden_size"),
                        "heads": n.get("num_heads"), "kv_heads": n.get("num_kv_heads"), "head_dim": n.get("head_dim"),
                        "vocab": n.get("vocab_size"), "parameters": facts.get(c["name"], {}).get("parameters")})
        return out

    def checkpoints(self) -> list[dict[str, Any]]:
        facts = {c["name"]: c for c in self.facts.get("checkpoints", [])}
        # a standard config name the spec makes unavailable(...) says so (its reason is in the config
        # table's "from the native config" column), not the exception the printout met computing it
        unavailable = {key for key, _, text in self.f.config if text.startswith("Unavailable: ")}
        out = []
        for c in self.f.checkpoints:
            fc = facts.get(c.name, {})
            normalized = fc.get("normalized")
            if normalized is None:
                normalized = {}
                for key, comp, _ in self.f.config:
                    try:
                        normalized[key] = evaluate(comp, dict(c.config))
                    except Exception:  # noqa: BLE001
                        normalized[key] = None
            normalized = {k: NOT_SERVED_TEXT if k in unavailable else v for k, v in normalized.items()}
            out.append({"name": c.name, "normalized": normalized, "config": c.config, "cls": fc.get("class", "")})
        return out
