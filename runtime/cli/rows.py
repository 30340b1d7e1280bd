"""``nnatlas cache``'s rows: the model loaded for a run, the handles of the values it saves, and each batch's
forward turned into rows by position (every token, the last, the non-pad ones)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..cache.data import CacheError, Plan
from .ranks import Dist

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
META_KEYS = {"all": ("meta.doc", "meta.length", "meta.tokens"), "last": ("meta.doc", "meta.position", "meta.token"),
             "nonpad": ("meta.doc", "meta.position", "meta.token")}


def load_model(args: argparse.Namespace, device: torch.device, dist: Dist | None = None) -> Any:
    from ..loading.load import load

    kwargs: dict[str, Any] = {"dtype": DTYPES.get(args.model_dtype, "auto")}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    tp = dist.tp if dist is not None else 1
    if tp > 1:  # (a family that cannot be sharded is refused by load, before the weights)
        from ..parallel.tensor_parallel import groups_config

        kwargs["distributed_config"] = groups_config(tp, dist.world)  # type: ignore[union-attr]
    try:
        model = load(args.model, **kwargs)
    except (OSError, ValueError) as e:
        raise CacheError(f"cannot load {args.model}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if model.tokenizer is None:
        raise CacheError(f"{args.model} has no tokenizer that AutoTokenizer can load; nnatlas cache tokenizes text")
    if tp > 1:  # transformers put each rank's shard on its device; the group is the rank's own tp consecutive ranks
        import torch.distributed as td

        group = model._tp.group if model._tp is not None else None
        first = dist.dp_rank * tp  # type: ignore[union-attr]
        if group is None or td.get_process_group_ranks(group) != list(range(first, first + tp)):
            raise CacheError(f"--tp {tp}: transformers did not shard the model over ranks {first} to {first + tp - 1}")
    else:
        model.native.to(device)
    return model


def value_handles(model: Any, names: list[str], layers: list[int] | None) -> list[Any]:
    from ..cache.model_cache import select

    handles = select(model, names, layers)
    for h in handles:
        assert h._spec is not None  # (select gives standard values only)
        layout = h._spec.layout
        if tuple(layout.dims[:2]) != ("batch", "seq") or layout.dtype == "object":
            raise CacheError(f"{h.label} has layout {layout.text}; nnatlas cache stores values per token "
                             "(layouts that start with [batch seq]); read it with model.cache() instead")
    return handles


def batch_inputs(docs: Sequence[Any], pad: int, length: int | None) -> dict[str, torch.Tensor]:
    """Right-padded: a document's tokens keep the positions they have alone (padding comes after them)."""
    width = length or max(len(d.ids) for d in docs)
    ids = torch.tensor([(*d.ids, *(pad,) * (width - len(d.ids))) for d in docs], dtype=torch.long)
    mask = torch.tensor([(1,) * len(d.ids) + (0,) * (width - len(d.ids)) for d in docs], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask}


def pad_id(model: Any) -> int:
    tok = model.tokenizer
    for pad in (tok.pad_token_id, tok.eos_token_id, 0):
        if pad is not None:
            return int(pad)
    return 0


def batch_rows(model: Any, handles: list[Any], docs: Sequence[Any], positions: str, seq_len: int,
                dtype: torch.dtype | None, pad: int | None = None) -> dict[str, torch.Tensor]:
    """The rows of one batch: each value at the chosen positions (on the model's device), and what says
    where each row is from (``meta.*``, on the CPU)."""
    inputs = batch_inputs(docs, pad_id(model) if pad is None else pad, seq_len if positions == "all" else None)
    with model.trace(inputs, order="any"):
        saved = [h.save() for h in handles]
    mask = inputs["attention_mask"].bool()
    lengths = mask.sum(1)
    doc = torch.tensor([d.index for d in docs], dtype=torch.long)
    out: dict[str, torch.Tensor] = {}
    if positions == "nonpad":
        where = mask.nonzero()
        pick: Callable[[torch.Tensor], torch.Tensor] = lambda v: v[mask.to(v.device)]
        out = {"meta.doc": doc[where[:, 0]], "meta.position": where[:, 1].to(torch.int32),
               "meta.token": inputs["input_ids"][mask]}
    elif positions == "last":
        rows = torch.arange(len(docs))
        pick = lambda v: v[rows.to(v.device), (lengths - 1).to(v.device)]
        out = {"meta.doc": doc, "meta.position": (lengths - 1).to(torch.int32),
               "meta.token": inputs["input_ids"][rows, lengths - 1]}
    else:
        pick = lambda v: v
        out = {"meta.doc": doc, "meta.length": lengths.to(torch.int32), "meta.tokens": inputs["input_ids"]}
    values = {}
    for h, v in zip(handles, saved):
        rows_v = pick(v)
        if dtype is not None and rows_v.is_floating_point():
            rows_v = rows_v.to(dtype)
        values[h.label] = rows_v.detach()
    return {**values, **out}


def to_host(rows: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
    """``rows`` on the CPU, and an event to wait for before they are read: from a CUDA device the copies
    are queued (into pinned memory) behind the forward, not waited for here."""
    devices = {v.device for v in rows.values() if v.device.type != "cpu"}
    if not devices:
        return rows, None
    if len(devices) == 1 and next(iter(devices)).type == "cuda":
        host = {k: v.to("cpu", non_blocking=True) for k, v in rows.items()}
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(next(iter(devices))))
        return host, ready
    return {k: v.cpu() for k, v in rows.items()}, None


def row_shapes(model: Any, handles: list[Any], the_plan: Plan, positions: str, seq_len: int,
                dtype: torch.dtype | None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each stored key's shape per row and dtype, from a forward of one token (the sizes a shard is cut by)."""
    first = the_plan.docs[0]
    probe = type(first)(first.index, first.ids[:1])
    rows = batch_rows(model, handles, [probe], "last", seq_len, dtype)
    shapes = {k: (tuple(v.shape[1:]), v.dtype) for k, v in rows.items() if not k.startswith("meta.")}
    if positions == "all":
        shapes = {k: ((seq_len, *s), d) for k, (s, d) in shapes.items()}
        shapes.update({"meta.doc": ((), torch.long), "meta.length": ((), torch.int32),
                       "meta.tokens": ((seq_len,), torch.long)})
    else:
        shapes.update({"meta.doc": ((), torch.long), "meta.position": ((), torch.int32), "meta.token": ((), torch.long)})
    return shapes


def count_of(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
