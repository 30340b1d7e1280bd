"""``patching.attribute``: attribution patching, the sweep's table estimated from one forward and one backward."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import InputError
from ..model import AtlasModel
from . import where


def attribute(model: AtlasModel, clean: Any, corrupt: Any, value: str = "layer_output",
              metric: Callable[[torch.Tensor], torch.Tensor] | None = None, positions: Iterable[int] | None = None,
              layers: Iterable[int] | None = None) -> torch.Tensor:
    """``[len(layers), len(positions)]``: at each block and position, the gradient of ``metric`` at the clean
    run's value times the difference the corruption makes there, summed over the value's other axes::

        attribution[k, n] = sum((corrupt_value - clean_value)[0, p] * d metric(clean) / d clean_value[0, p])

    the first-order estimate of how much ``metric`` moves when the corrupt run's value replaces the clean
    one at block ``layers[k]``, position ``positions[n]``. One forward of the corrupt prompt (no gradient),
    one of the clean prompt with ``grad=True``, one backward."""
    metric = where.checked("attribute", model, metric)
    clean_in, corrupt_in, blocks, handles, positions_at = where.setup(model, clean, corrupt, value, layers, positions)
    spots = torch.tensor(positions_at)
    corrupt_saved = where.clean_values(model, corrupt_in, handles)  # (the same reads, of the corrupt run)
    with torch.enable_grad():
        with model.trace(clean_in, order="any", grad=True):
            clean_saved = [h.save() for h in handles]
            logits = model.logits.save()
        where.metric_values(metric, logits, 1).sum().backward()
    out = torch.empty(len(blocks), len(spots))
    for k, (h, c, x) in enumerate(zip(handles, corrupt_saved, clean_saved, strict=True)):
        if x.grad is None:
            raise InputError(f"metric: its gradient does not reach {h.label} (is it a function of the logits?)")
        axis = where.seq_axis(h)
        term = ((c.detach() - x.detach()) * x.grad)[0].movedim(axis - 1, 0)  # [seq, ...]
        out[k] = term[spots].flatten(1).sum(-1)
    return out
