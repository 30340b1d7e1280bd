"""What every part of the drafter's tiny model shares: the tiny sizes (the checkpoint twins' table,
:mod:`nnatlas.testing.shrink`, and what the drafter adds to it), the :class:`Tiny` plan a spec's ``tiny:`` is written
from, the causal-LM class of a model type, and the drafter's error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nnatlas.testing.suite import (  # the twins' size table and name groups (nnatlas.testing.shrink)
    AT_MOST,
    GROUPS,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    PERIOD,
    SIZES,
    TOKEN_IDS,
    WINDOW,
    WINDOWS,
)
from nnatlas.testing.suite import SSM_HEADS as MAMBA_HEADS

from . import configexpr


class DraftError(Exception):
    """The drafter cannot go on: no such model type, no causal-LM class, a model that does not build (``built``: it
    built and ran, and its forward is one no spec describes)."""

    def __init__(self, message: str, built: bool = False):
        super().__init__(message)
        self.built = built


# the tiny sizes are the checkpoint twins' (nnatlas.testing.shrink: one table, one rule, for the twins and the
# drafter): every size shrink names takes its tiny value, but those the drafter draws (heads, head width, width,
# intermediate size: two values each, so that the expressions of a draft can be told apart); beyond the table, what
# the drafter needs: special token ids inside the tiny vocabulary, one group of experts or Mamba heads, a rotary
# width under both drawn head widths, windows under the drafter's prompt (7 tokens)
DRAWN = frozenset(HEADS + HIDDEN + INTERMEDIATE + ("head_dim",))
FIXED: dict[str, Any] = {
    **{k: v for k, v in SIZES.items() if k not in DRAWN},
    **{k: 1 for k in AT_MOST if k not in SIZES},  # (kept when smaller: one shared expert stays one)
    **dict.fromkeys(GROUPS, 1), **TOKEN_IDS, "mamba_n_groups": 1, "mamba_ngroups": 1, "rotary_dim": 4,
    **dict.fromkeys(WINDOWS, WINDOW),
}


def tiny_size(name: str, value: int) -> int:
    """The tiny value of the size ``name`` whose config value is ``value``: shrink's rule (a count in AT_MOST or a
    window is kept when smaller)."""
    return min(value, FIXED[name]) if name in AT_MOST or name in WINDOWS else FIXED[name]


# a mixture's dense blocks: the tiny config makes every block a mixture (one MLP class per host path)
ALL_SPARSE: dict[str, Any] = {"first_k_dense_replace": 0, "num_dense_layers": 0, "first_dense_layers": 0,
                              "moe_layer_start_index": 0, "n_dense_layers": 0, "decoder_sparse_step": 1,
                              "moe_layer_freq": 1, "moe_every_n_layers": 1, "mlp_only_layers": [],
                              "expert_layer_period": 1, "expert_layer_offset": 0}
# (head width, heads, expansion) of a Mamba mixer beside attention (shrink's; a Mamba-2 stack's own heads, its
# only ones, are drawn apart: plan)
SSM_HEADS = tuple(names for names in MAMBA_HEADS if names[1] != "num_heads")
ATTENTION_AT = ("attn_layer_indices", "attention_layer_indices")
DROPOUTS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
            "hidden_dropout_prob", "attention_probs_dropout_prob")


@dataclass
class Tiny:
    """What the spec's ``tiny:`` says, and the config it builds first."""

    model_type: str
    model_class: str
    config_class: str
    config: dict[str, Any]  # fixed entries
    draw: dict[str, Any]  # drawn entries: a list of options or an expression of earlier ones
    notes: list[str] = field(default_factory=list)  # a comment per choice the spec should explain
    names: dict[str, str] = field(default_factory=dict)  # role (layers, heads, ...) -> config attribute
    also: list[str] = field(default_factory=list)  # the composite model type asked for, whose text config this is

    def first(self) -> dict[str, Any]:
        """The first option of every draw (the most layers), evaluated: the config the drafter records."""
        scope = dict(self.config)
        params = dict(self.config)
        for name, options in self.draw.items():
            if isinstance(options, list):
                value = options[-1] if name == self.names.get("layers") else options[0]
            else:
                value = configexpr.evaluate(options, dict(scope), {"len": len})
            scope[name] = value
            if not name.startswith("_"):
                params[name] = value
        return params


def causal_lm_class(model_type: str, config_cls: type | None = None) -> str:
    """The causal-LM class of a model type; for a type the mapping lacks (a multimodal wrapper's text config, such as
    emu3_text_model), the mapped class whose config class is ``config_cls``."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if cls is None and config_cls is not None:
        cls = next((c for c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(c, str)
                    and getattr(getattr(transformers, c, None), "config_class", None) is config_cls), None)
    if cls is None:
        raise DraftError(f"model type '{model_type}' has no causal-LM class in transformers "
                         "(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)")
    return cls if isinstance(cls, str) else cls[0]


def _first(cfg: Any, names: tuple[str, ...]) -> str | None:
    for n in names:
        if isinstance(getattr(cfg, n, None), int) and not isinstance(getattr(cfg, n), bool):
            return n
    return None


def listed_flags(cfg: Any, word: str) -> list[tuple[str, bool]]:
    """The config's boolean entries whose name holds ``word``."""
    return [(k, v) for k, v in cfg.to_dict().items() if word in k and isinstance(v, bool)]


def _global(cfg: Any) -> Any:
    """``cfg``, its per-layer attributes (a heterogeneous config's: transformers' per_layer_config) read as their
    global values, as the tiny config shrinks them; the per-layer overrides are shrunk apart (``_per_layer``)."""
    if getattr(cfg, "is_heterogeneous", False):
        cfg.allow_global_per_layer_attribute_access = True
    return cfg


# (the name groups are shrink's, said here once for the drafter's modules)
__all__ = ["ALL_SPARSE", "ATTENTION_AT", "DRAWN", "DROPOUTS", "FIXED", "HEADS", "HIDDEN", "INTERMEDIATE", "KV_HEADS",
           "LAYERS", "PERIOD", "SSM_HEADS", "TOKEN_IDS", "DraftError", "Tiny", "_first", "_global", "causal_lm_class",
           "listed_flags", "tiny_size"]
