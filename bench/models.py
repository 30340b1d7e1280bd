"""The models the benchmark runs on: each family's fixed tiny config, and one mid-size model."""

from __future__ import annotations

import importlib
from typing import Any

import torch

import nnatlas
from nnatlas.model import AtlasModel
from nnatlas.testing.suite import attention_loads, build, draw_inputs, first_params, tiny_tokenizer

TINY_SEQ = 16
MID_SEQ = 64


def tiny(family: str, layers: int | None = None) -> tuple[AtlasModel, AtlasModel, dict[str, torch.Tensor]]:
    """``family`` on its fixed tiny config (``layers`` blocks instead of its few, when given): under sdpa
    (the default load) where its class accepts sdpa, else under the first load it accepts (bloom, gemma2,
    mamba ... refuse sdpa), and under eager."""
    params = first_params(family)
    if layers is not None:
        params["num_hidden_layers"] = layers
    loads = attention_loads(family)
    model = build(family, params, attn_implementation="sdpa" if "sdpa" in loads else loads[0])
    eager = build(family, params, attn_implementation="eager")
    vocab = int(model.normalized_config["vocab_size"])
    return model, eager, draw_inputs(vocab, 1, TINY_SEQ, [0], seed=1)


def _fill(module: torch.nn.Module, seed: int = 0) -> None:
    """Cheap random weights: one random block tiled over every matrix (periodic, but no two rows
    alike), ones for the vectors (norm gains), so a real-size model builds in seconds."""
    gen = torch.Generator().manual_seed(seed)
    block = (torch.rand(1_000_003, generator=gen) - 0.5) * 0.04
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() < 2:
                p.fill_(1.0)
                continue
            flat = p.view(-1)
            for start in range(0, flat.numel(), block.numel()):
                n = min(block.numel(), flat.numel() - start)
                flat[start:start + n].copy_(block[:n])


def _config_dict(items: Any) -> dict[str, Any]:
    cfg = dict(items)
    for key in ("architectures", "model_type"):
        cfg.pop(key, None)
    text = cfg.get("text_config")
    if isinstance(text, list | dict):
        cfg = _config_dict(text)
    return cfg


def _real(family: str, checkpoint: str, layers: int | None, attn: str) -> AtlasModel:
    import transformers
    from transformers.initialization import no_init_weights

    mod = importlib.import_module(f"nnatlas.families.{family}")
    cfg = _config_dict(mod.CHECKPOINTS[checkpoint])
    if layers is not None:
        interval = cfg.get("full_attention_interval")
        if isinstance(interval, int) and layers < interval:
            raise SystemExit(f"{checkpoint}: {layers} blocks hold no full-attention block (one in every {interval}); "
                             f"its cache needs one: use --mid-layers {interval} or more")
        cfg["num_hidden_layers"] = layers
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][:layers]
    config = getattr(transformers, mod.TINY["config_class"])(**cfg)
    config._attn_implementation = attn
    with no_init_weights():
        hf = getattr(transformers, mod.TINY["model_class"])(config)
    _fill(hf)
    hf.eval()
    vocab = int(getattr(config, "vocab_size", 64))
    return nnatlas.wrap(hf, tokenizer=tiny_tokenizer(vocab))


def mid(layers: int | None) -> tuple[str, AtlasModel, AtlasModel, dict[str, torch.Tensor]]:
    """Qwen3.5-0.8B's text model when the ``qwen3_5_text`` family exists, else Llama-3.2-1B's
    recorded config; full width and vocabulary, random weights, ``layers`` blocks, seq 64."""
    fams = nnatlas.all_families()
    choice: tuple[str, str] | None = None
    if "qwen3_5_text" in fams:
        mod = importlib.import_module("nnatlas.families.qwen3_5_text")
        names = [n for n in mod.CHECKPOINTS if "0.8B" in n]
        if names:
            choice = ("qwen3_5_text", names[0])
    if choice is None:
        choice = ("llama", "meta-llama/Llama-3.2-1B")
    family, checkpoint = choice
    model = _real(family, checkpoint, layers, "sdpa")
    eager = _eager_twin(model)
    vocab = int(model.normalized_config["vocab_size"])
    inputs = draw_inputs(min(vocab, 50_000), 1, MID_SEQ, [0], seed=1)
    total = sum(1 for _ in model.layers)
    label = f"{checkpoint} ({total}/{_recorded_layers(family, checkpoint)} blocks)"
    return label, model, eager, inputs


def _recorded_layers(family: str, checkpoint: str) -> int:
    mod = importlib.import_module(f"nnatlas.families.{family}")
    return int(_config_dict(mod.CHECKPOINTS[checkpoint]).get("num_hidden_layers", 0))


def _eager_twin(model: AtlasModel) -> AtlasModel:
    """The same model under eager attention: a structural copy sharing every weight (so the
    mid-size model is not built twice), with its own config."""
    import copy

    config = copy.deepcopy(model.native.config)
    config._attn_implementation = "eager"
    return nnatlas.wrap(_share(model.native, config), tokenizer=model.tokenizer)


def _share(hf: torch.nn.Module, config: Any) -> torch.nn.Module:
    """A structural copy of ``hf`` that shares every parameter and buffer, with ``config``."""
    import copy

    memo: dict[int, Any] = {id(t): t for t in (*hf.parameters(), *hf.buffers())}
    memo[id(hf.config)] = config
    return copy.deepcopy(hf, memo)  # type: ignore[no-any-return]
