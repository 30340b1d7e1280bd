"""``nnatlas.plot``: pictures of what a trace saved, each a matplotlib ``Figure`` (``pip install 'nnatlas[plot]'``).

    with model.trace(prompt):
        pattern = model.layers[0].self_attn.attention_probabilities.save()
        stream = [layer.layer_output.save() for layer in model.layers]
    tokens = [model.tokenizer.decode(t) for t in model.tokenizer(prompt)["input_ids"]]
    nnatlas.plot.attention(pattern, tokens)          # a grid of heads
    nnatlas.plot.logit_lens(model, stream, tokens)   # block x position: the top token and its probability
    nnatlas.plot.sweep(effect, tokens)               # a [blocks, positions] effect (activation patching)

matplotlib is imported when a function is called, never by ``import nnatlas``; the figures are built with
``matplotlib.figure.Figure`` (no pyplot: no global figure list, no backend to choose), which a notebook shows
as the value of a cell. Each axes keeps its data (``ax.images[0].get_array()``) and labels for the tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InputError, NnatlasError

MAX_COLUMNS = 4  # heads per row of plot.attention's grid


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise NnatlasError("nnatlas.plot draws with matplotlib, which is not installed: pip install 'nnatlas[plot]'") from None
    return Figure(figsize=(width, height), layout="constrained")


def _tensor(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{what}: expected a tensor (a saved value), got {type(x).__name__}")
    return x.detach().float().cpu()


def _one_prompt(x: torch.Tensor, dims: int, what: str, layout: str) -> torch.Tensor:
    """``x`` without its batch dim (a batch of one), or as it is when it has none."""
    if x.dim() == dims + 1:
        if x.shape[0] != 1:
            raise InputError(f"{what}: a batch of {x.shape[0]} prompts; pass one prompt's, {what}[b]")
        x = x[0]
    if x.dim() != dims:
        raise InputError(f"{what}: expected {layout}, got a tensor of shape {list(x.shape)}")
    return x


def _labels(tokens: Sequence[str] | None, n: int, what: str) -> list[str]:
    if tokens is None:
        return [str(i) for i in range(n)]
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise InputError(f"{what}: tokens is a list of strings, one per position (model.tokenizer.decode of each id)")
    if len(tokens) != n:
        raise InputError(f"{what}: {len(tokens)} tokens for {n} positions")
    return [repr(t)[1:-1] for t in tokens]  # (a newline or a tab shown as \n, \t)


def _heads(heads: int | Sequence[int] | None, n: int) -> list[int]:
    if heads is None:
        return list(range(n))
    chosen = [heads] if isinstance(heads, int) else list(heads)
    bad = [h for h in chosen if not isinstance(h, int) or not -n <= h < n]
    if bad or not chosen:
        raise InputError(f"plot.attention(heads={heads!r}): the pattern has {n} heads, 0..{n - 1}")
    return [h % n for h in chosen]


def attention(pattern: Any, tokens: Sequence[str] | None = None, heads: int | Sequence[int] | None = None) -> Any:
    """A grid of attention patterns, one heatmap per head (queries down, keys across, weights 0..1).

    ``pattern``: ``attention_probabilities`` as a trace saves it, ``[batch=1, heads, queries, keys]`` (or without
    the batch dim); ``tokens``: one label per key (the last ``queries`` label the rows); ``heads``: which (all)."""
    p = _one_prompt(_tensor(pattern, "plot.attention(pattern)"), 3, "plot.attention(pattern)",
                    "[batch, heads, queries, keys] (attention_probabilities)")
    chosen = _heads(heads, p.shape[0])
    keys = _labels(tokens, p.shape[2], "plot.attention")
    queries = keys[-p.shape[1]:]
    cols = min(MAX_COLUMNS, len(chosen))
    rows = math.ceil(len(chosen) / cols)
    side = 0.9 + 0.28 * len(keys)
    fig = _figure(side * cols + 1.2, side * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for n, ax in enumerate(axes.flat):
        if n >= len(chosen):
            ax.set_visible(False)
            continue
        h = chosen[n]
        image = ax.imshow(p[h].numpy(), vmin=0.0, vmax=1.0, cmap="Blues", aspect="equal")
        ax.set_title(f"head {h}")
        ax.set_xticks(range(len(keys)), keys, rotation=90)
        ax.set_yticks(range(len(queries)), queries)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight", shrink=0.8)
    return fig


def logit_lens(model: Any, stream: Sequence[Any], tokens: Sequence[str] | None = None) -> Any:
    """The logit lens as a [block x position] heatmap: each block's output read out as the model reads out its
    last one (``model.logit_lens``), the colour the top token's probability, each cell labelled with it.

    ``stream``: one saved ``layer_output`` per block (``[batch=1, seq, hidden]`` each), in block order."""
    if isinstance(stream, torch.Tensor) or not isinstance(stream, Sequence) or not stream:
        raise InputError("plot.logit_lens(stream): a list of saved block outputs, one per block "
                         "([layer.layer_output.save() for layer in model.layers])")
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise NnatlasError("plot.logit_lens labels each cell with its top token: the model has no tokenizer "
                           "(nnatlas.wrap(model, tokenizer=...))")
    with torch.no_grad():
        lens = model.logit_lens([_one_prompt(_tensor(x, f"plot.logit_lens(stream[{i}])"), 2, f"stream[{i}]",
                                             "[batch, seq, hidden]") for i, x in enumerate(stream)])
        probs, ids = torch.stack([b.float().softmax(-1) for b in lens]).max(-1)  # [blocks, seq]
    labels = _labels(tokens, probs.shape[1], "plot.logit_lens")
    blocks, seq = probs.shape
    fig = _figure(1.4 + 0.75 * seq, 1.0 + 0.42 * blocks)
    ax = fig.subplots()
    ax.imshow(probs.numpy(), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", origin="lower")
    for b in range(blocks):
        for s in range(seq):
            word = repr(tokenizer.decode([int(ids[b, s])]))[1:-1]
            ax.text(s, b, word, ha="center", va="center", fontsize=7,
                    color="black" if float(probs[b, s]) > 0.5 else "white")
    ax.set_xticks(range(seq), labels, rotation=90)
    ax.set_yticks(range(blocks), [str(b) for b in range(blocks)])
    ax.set_xlabel("position")
    ax.set_ylabel("block")
    ax.set_title("logit lens: the top token and its probability")
    fig.colorbar(ax.images[0], ax=ax, label="probability of the top token")
    return fig


def sweep(effect: Any, tokens: Sequence[str] | None = None, layers: Sequence[Any] | None = None) -> Any:
    """A patching sweep's effect as a [block x position] heatmap, coloured around 0 (red up, blue down).

    ``effect``: ``[layers, positions]`` (``nnatlas.patching.sweep``'s result, or any such tensor); ``tokens``:
    one label per position; ``layers``: one label per row (the block indices)."""
    e = _tensor(effect, "plot.sweep(effect)")
    if e.dim() != 2:
        raise InputError(f"plot.sweep(effect): expected [layers, positions], got a tensor of shape {list(e.shape)}")
    columns = _labels(tokens, e.shape[1], "plot.sweep")
    if layers is None:
        rows = [str(i) for i in range(e.shape[0])]
    elif len(layers) != e.shape[0]:
        raise InputError(f"plot.sweep: {len(layers)} layer labels for {e.shape[0]} rows")
    else:
        rows = [str(x) for x in layers]
    bound = float(e.abs().max()) or 1.0
    fig = _figure(1.6 + 0.5 * e.shape[1], 1.0 + 0.35 * e.shape[0])
    ax = fig.subplots()
    ax.imshow(e.numpy(), vmin=-bound, vmax=bound, cmap="RdBu_r", aspect="auto", origin="lower")
    ax.set_xticks(range(e.shape[1]), columns, rotation=90)
    ax.set_yticks(range(e.shape[0]), rows)
    ax.set_xlabel("position")
    ax.set_ylabel("block")
    ax.set_title("patching effect")
    fig.colorbar(ax.images[0], ax=ax, label="effect")
    return fig
