"""Config values as a family page writes them: a config or ``when`` expression computed on a recorded config
(``evaluate``, never ``eval``), the config a page falls back on (the checkpoints', then the tiny one), a config
cell's text, a standard config name as a researcher types it, and a parameter count as a model card says it.
"""

from __future__ import annotations

from typing import Any

from ..language import expr
from ..language.expr import Compiled
from ..language.ir import FamilyIR, config_value

NOT_SERVED_TEXT = "not served"  # a config cell whose standard name the spec makes unavailable(...)


def evaluate(c: Compiled, config: dict[str, Any], i: int | None = None) -> Any:
    """Compute a config or ``when`` expression on a plain config mapping (no eval: see expr.evaluate)."""
    return expr.evaluate(c, lambda name: config_value(config, name), i)


def fallback_config(f: FamilyIR) -> list[dict[str, Any]]:
    configs = [dict(c.config) for c in f.checkpoints]
    tiny = dict(f.tiny.config)
    for d in f.tiny.draw:
        if d.choices is not None:
            tiny[d.name] = d.choices[-1]
        elif d.expr is not None:
            try:
                tiny[d.name] = evaluate(d.expr, tiny)
            except Exception:  # noqa: BLE001
                pass
    return [*configs, tiny]


def config_text(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(config_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {config_text(x)}" for k, x in v.items()) + "}"
    return str(v)


def config_label(name: str) -> str:
    """The standard config name as a researcher types it (``vision_num_heads`` → ``model.vision.num_heads``)."""
    if name.startswith("vision_"):
        rest = name[len("vision_"):]
        return f"model.vision.{name if rest == 'hidden_size' else rest}"
    return f"model.{name}"


def param_text(n: Any) -> str:
    """A parameter count as a model card says it: 752.4 M, 79.67 B."""
    if not isinstance(n, int):
        return "—"
    if n >= 10**9:
        return f"{n / 10**9:.2f} B"
    if n >= 10**6:
        return f"{n / 10**6:.1f} M"
    return f"{n:,}"
