"""Named bundles of config entries a family spec takes whole: ``presets: [no_attention]``.

A preset fills the config entries the family does not write itself (an entry the spec writes
wins), so attention-free families need no ``{unavailable: ...}`` line per attention size.
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import UnavailableRaw


@dataclass(frozen=True)
class Preset:
    doc: str  # what taking it means (the spec reference shows it)
    reasons: tuple[tuple[str, str], ...]  # config entry -> why it is unavailable ({title}: the family's title)

    def config(self, title: str) -> dict[str, UnavailableRaw]:
        return {key: UnavailableRaw(unavailable=f"model.{key}: {why.format(title=title)}") for key, why in self.reasons}


_NO_HEADS = "{title} has no attention (its mixer is a state-space scan or a recurrence), so there are no attention heads"
_NO_HEAD_DIM = "{title} has no attention (its mixer is a state-space scan or a recurrence), so there is no head size"

PRESETS: dict[str, Preset] = {
    "no_attention": Preset(
        "An attention-free family (Mamba, RWKV, ...): num_heads, num_kv_heads, head_dim and qk_head_dim raise "
        "Unavailable, saying the family has no attention, unless the spec's config gives them.",
        (("num_heads", _NO_HEADS), ("num_kv_heads", _NO_HEADS), ("head_dim", _NO_HEAD_DIM),
         ("qk_head_dim", _NO_HEAD_DIM)),
    ),
}
