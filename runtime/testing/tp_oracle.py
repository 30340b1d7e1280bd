"""The tensor-parallel oracle: every value a trace serves on a model sharded by transformers' tensor parallel
equals one process's, and so do an edit's logits and a backward's gradients.

Run under torchrun (gloo on CPU)::

    torchrun --standalone --nproc_per_node 2 -m nnatlas.testing.tp_oracle llama,qwen3_moe --out DIR

Every rank builds the family's perturbed tiny model (the same seed: the same weights), rank 0 saves it,
then each rank loads it twice: as it is (one process's model) and with ``tp_plan="auto"`` (sharded over the
ranks), and :func:`check_tp` compares, on every rank:

- every standard value this load serves (one trace saving them all) with one process's, and, for the
  values a rank holds a shard of, ``save(local=True)`` with the rank's slice of the full value;
- the logits of a trace that zeroes one head's queries and one MLP neuron (or one expert's output);
- the ``.grad`` of saved values after a backward from the logits, under ``grad=True``.

Rank 0 writes ``DIR/tp_oracle.json``: per family the values compared, the largest difference of each check,
the error of a family that failed, or why ``load(tp_plan="auto")`` refused one (``refused``: no TP plan in its
config class, or a family transformers' tensor parallel cannot run). The process exits 1 when a family failed.

``--cache "ARGS"`` then runs ``nnatlas cache ARGS`` (``--tp`` among them) in the same launch, over the same process
group (a second torchrun launch would start every rank again); its exit status is the report's ``cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import nnatlas

from ..cli.cache import main as cache_main
from ..model import AtlasModel
from ..parallel.tensor_parallel import CANNOT_DIFFERENTIATE
from .cases import _fixed_inputs
from .served import served_values
from .tiny import build

ATOL = 1e-5  # float noise of the ranks' reduction order (measured: below 1e-6 on the tiny models)


def _save_all(model: AtlasModel, inputs: Mapping[str, torch.Tensor], local: bool = False) -> dict[str, Any]:
    saved: dict[str, Any] = {}
    with model.trace(dict(inputs), order="any"):
        for label, _, v, handle in served_values(model):
            if not (local and v.read.kind == "derived"):
                saved[f"{label}.{v.name}"] = handle.save(local=local) if local else handle.save()
    return {k: getattr(x, "value", x) for k, x in saved.items()}


def _diff(a: Any, b: Any, what: str) -> float:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        assert a == b, f"{what}: {a!r} != {b!r}"
        return 0.0
    assert a.shape == b.shape, f"{what}: shape {list(a.shape)} under tensor parallel, {list(b.shape)} on one process"
    if not a.is_floating_point():
        assert torch.equal(a, b), f"{what}: differs from one process"
        return 0.0
    d = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    assert d <= ATOL + 1e-4 * float(b.abs().max() if b.numel() else 0), f"{what}: differs from one process by {d:.3g}"
    return d


def _edit(model: AtlasModel) -> list[tuple[str, Any]]:
    """The edits the oracle makes: one head's queries, one neuron of the MLP (or one expert's output) in block 0."""
    edits: list[tuple[str, Any]] = []
    for path, name, key in (("self_attn", "attention_queries", (slice(None), 0)),
                            ("mlp", "mlp_neurons", (..., 1)), ("mlp", "expert_outputs", (..., 0, slice(None)))):
        value = _first(model, f"{path}.{name}")
        if value is not None and model._why_unavailable(value, edit=True) is None:
            edits.append((value.label, (value, key)))
    return edits


def _first(model: AtlasModel, name: str) -> Any:
    """``layers[i].<name>`` of the first block that has it (a hybrid's attention is on some blocks), or None."""
    for i in range(model.num_layers):
        try:
            value = model.value(f"layers[{i}].{name}")
        except Exception:  # noqa: BLE001 - not on this block (or not in this family)
            continue
        if value.unavailable() is None:
            return value
    return None


def _edited_logits(model: AtlasModel, inputs: Mapping[str, torch.Tensor], edits: list[tuple[str, Any]]) -> Any:
    with model.trace(dict(inputs), order="any"):
        for _, (value, key) in edits:
            value[key] = 0
        logits = model.logits.save()
    return logits


def _generated(model: AtlasModel, inputs: Mapping[str, torch.Tensor], edits: list[tuple[str, Any]]
               ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Three generation steps with the same edit at every step: the edited value of each step, the tokens."""
    saved = []
    with model.generate({k: v[:1] for k, v in inputs.items()}, max_new_tokens=3) as tracer:
        for _ in tracer.iter[0:3]:
            for _, (value, key) in edits:
                value[key] = 0
                saved.append(value.save())
    return saved, tracer.output


def _grads(model: AtlasModel, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    handles = {}
    for n in ("self_attn.attention_queries", "mlp.mlp_neurons", "mlp.expert_outputs", "layer_output"):
        handle = _first(model, n)
        if handle is not None:
            handles[handle.label] = handle
    with model.trace(dict(inputs), grad=True, order="any"):
        saved = {n: h.save() for n, h in handles.items()}
        logits = model.logits.save()
    weights = torch.linspace(-1, 1, logits.numel()).reshape(logits.shape)
    (logits * weights).sum().backward()
    return {n: t.grad for n, t in saved.items() if t.grad is not None}


class Refused(Exception):
    """``load(tp_plan="auto")`` said, before loading, that the family cannot be sharded (every rank says it)."""


def check_tp(family: str, folder: Path, attn: str = "eager") -> dict[str, Any]:
    """The oracle for one family, on every rank (see the module's docstring); returns what it compared."""
    import torch.distributed as dist

    images = False
    if dist.get_rank() == 0:
        tiny = build(family, attn_implementation=attn, perturbed=True)
        tiny.native.save_pretrained(folder)  # type: ignore[operator]
        if tiny.processor is not None:
            tiny.processor.save_pretrained(folder)
        elif tiny.tokenizer is not None:
            tiny.tokenizer.save_pretrained(folder)
        images = tiny.processor is not None
        del tiny
    flag = [images]
    dist.broadcast_object_list(flag, src=0)
    task = "image-text-to-text" if flag[0] else "text-generation"
    one = nnatlas.load(str(folder), attn_implementation=attn, task=task)
    try:
        tp = nnatlas.load(str(folder), attn_implementation=attn, task=task, tp_plan="auto")
    except nnatlas.Unavailable as e:
        raise Refused(str(e)) from None
    assert tp._tp is not None, f"{family}: tp_plan='auto' did not shard the model"
    inputs = _fixed_inputs(one)
    ours, theirs = _save_all(tp, inputs), _save_all(one, inputs)
    assert ours.keys() == theirs.keys(), f"{family}: values served differ: {sorted(ours.keys() ^ theirs.keys())}"
    values = max((_diff(ours[k], theirs[k], f"{family} {k}") for k in theirs), default=0.0)
    local = _save_all(tp, inputs, local=True)
    sharded = []
    for k, x in local.items():
        shard = getattr(x, "tp_shard", None)
        if shard is None or shard.dim is None:
            continue
        want = theirs[k].chunk(shard.size, shard.dim)[shard.rank]
        _diff(x, want, f"{family} {k} (local=True)")
        sharded.append(f"{k}: {shard.axis}")
    said = tp.support()
    gathered = [(h, v) for h, v, how in said.sharded() if "gathered" in how or "summed" in how]
    assert said.tp and (gathered or not sharded), f"{family}: support() does not say which values are gathered"
    edits = _edit(one)
    edit_diff = None
    if edits:
        plain = theirs["model.logits"]
        a, b = _edited_logits(tp, inputs, _edit(tp)), _edited_logits(one, inputs, edits)
        assert not torch.allclose(b, plain), f"{family}: the edits {[n for n, _ in edits]} left the logits unchanged"
        edit_diff = _diff(a, b, f"{family} edited logits")
    gen_diff = None
    if edits and not flag[0]:  # generation with an edit at every step (text: the image prompt's steps are the same)
        a_gen, a_tokens = _generated(tp, inputs, _edit(tp)[-1:])
        b_gen, b_tokens = _generated(one, inputs, edits[-1:])
        assert torch.equal(a_tokens, b_tokens), f"{family}: generate under tensor parallel chose other tokens"
        gen_diff = max(_diff(x, y, f"{family} generate step {i}") for i, (x, y) in enumerate(zip(a_gen, b_gen,
                                                                                                  strict=True)))
    ca = tp.cache(dict(inputs), values=["layer_output"], layers=[0, 1])
    cb = one.cache(dict(inputs), values=["layer_output"], layers=[0, 1])
    cache_diff = max(_diff(ca[f"layers[{i}].layer_output"], cb[f"layers[{i}].layer_output"], f"{family} cache")
                     for i in (0, 1))
    grad_diff: float | str
    grad_scale: float | None  # the largest gradient on one process: what the TP one's differences are relative to
    if family in CANNOT_DIFFERENTIATE:  # said before the forward, not a failure inside transformers' backward
        try:
            _grads(tp, inputs)
        except nnatlas.Unavailable as e:
            grad_diff, gb, grad_scale = f"refused: {str(e)[:80]}", {}, None
        else:
            raise AssertionError(f"{family}: trace(grad=True) under tensor parallel did not say it cannot run")
    else:
        ga, gb = _grads(tp, inputs), _grads(one, inputs)
        assert ga.keys() == gb.keys() and gb, f"{family}: gradients {sorted(ga)} under TP, {sorted(gb)} on one"
        grad_diff = max(_diff(ga[k], gb[k], f"{family} {k}.grad") for k in gb)
        grad_scale = max(float(g.abs().max()) for g in gb.values())
    dist.barrier()
    return {"values": len(theirs), "max_value_diff": values, "sharded_values": sharded,
            "edits": [n for n, _ in edits], "max_edit_logit_diff": edit_diff,
            "grads": sorted(gb), "max_grad_diff": grad_diff, "max_grad": grad_scale, "max_generate_diff": gen_diff,
            "max_cache_diff": cache_diff}


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m nnatlas.testing.tp_oracle")
    parser.add_argument("families", help="comma-separated families")
    parser.add_argument("--out", required=True, help="a folder for the tiny checkpoints and tp_oracle.json")
    parser.add_argument("--cache", default=None, help="then run `nnatlas cache` with these arguments (one string)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = Path(args.out)
    report: dict[str, Any] = {"world_size": dist.get_world_size()}
    failed = False
    try:
        for family in args.families.split(","):
            try:
                start = time.perf_counter()
                report[family] = check_tp(family, out / family)
                report[family]["seconds"] = round(time.perf_counter() - start, 2)
            except Refused as e:
                report[family] = {"refused": str(e)}
            except Exception as e:  # noqa: BLE001 - said in the report, per family
                failed = True
                report[family] = {"error": f"{type(e).__name__}: {e}"}
                if os.environ.get("NNATLAS_TP_TRACEBACK"):
                    traceback.print_exc()
        if args.cache is not None:
            start = time.perf_counter()
            report["cache"] = {"exit": cache_main(shlex.split(args.cache))}
            report["cache"]["seconds"] = round(time.perf_counter() - start, 2)
            failed = failed or report["cache"]["exit"] != 0
        if dist.get_rank() == 0:
            (out / "tp_oracle.json").write_text(json.dumps(report, indent=1))
    finally:
        dist.destroy_process_group()
    for family, r in report.items():
        if isinstance(r, dict) and "error" in r:
            print(f"rank {os.environ.get('RANK')}: {family}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
