"""Values of a model sharded by transformers' tensor parallel (``tp_plan="auto"`` under torchrun).

transformers shards a model's weights into DTensors and runs each rank's forward on local tensors: a
``colwise`` linear's output is the rank's slice of its output features (the last dim), a ``rowwise``
linear's input is the rank's slice of its input features, and its output is summed over the ranks (an
all-reduce) to the full value every rank holds. Between the two (a head's queries, the attention pattern,
the MLP's neurons) every tensor is rank-local; an experts module under ``moe_tp_experts`` runs every
expert's shard on every rank, so what it computes inside is a partial sum.

A sharded model's targets are :class:`ShardedTarget`: what they serve is the full logical tensor, on every
rank, gathered from the ranks' shards (an all-gather on the sharded dim, or a sum of partial sums), so it
equals one process's value up to the reduction order's float noise. How a native tensor is sharded is found
once per target and shape: from the module's TP style where it says (a colwise output, a rowwise input),
else from the value's layout, the dim whose gathered size gives the layout's sizes. An edit is made on the
full tensor and each rank writes its own slice back into its shard; under ``grad=True`` the gather is
differentiable (its backward takes the rank's slice) and a saved value's ``.grad`` is gathered from the
ranks' local gradients. ``save(local=True)`` serves the rank's shard, without communication, and
names the sharded axis (``tensor.tp_shard``).

Nothing here runs for a model that is not sharded: :func:`sharding_of` is one attribute read at wrap time,
and ``torch.distributed`` is imported only for a sharded model.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError, NnatlasError, Unavailable
from ..spec import pattern_of
from ..trace.requests import Target

# transformers' styles whose module output is the rank's slice of the last dim (use_local_output)
COLWISE = frozenset({"colwise", "local_colwise"})
PACKED_COLWISE = frozenset({"packed_colwise"})  # gate and up packed: each rank holds a slice of each
ROWWISE_INPUT = frozenset({"rowwise", "local_rowwise"})  # the input is the rank's slice of the last dim
PARTIAL_INSIDE = frozenset({"moe_tp_experts"})  # what the module computes inside is a partial sum
# families whose tiny models transformers' tensor parallel fails on (measured with transformers 5.24, 2 ranks,
# gloo): a trace would fail deep in transformers' own forward
CANNOT_SHARD = {
    "qwen3_next": "transformers' tensor parallel fails in its gated DeltaNet path (a view of the local "
                  "projections as [batch, seq, heads, -1] takes the full head count)",
    "qwen3_5_text": "transformers' tensor parallel fails in its gated DeltaNet path (a view of the local "
                    "projections as [batch, seq, heads, -1] takes the full head count)",
    "qwen3_5_moe_text": "transformers' tensor parallel fails in its gated DeltaNet path (the path qwen3_next's "
                        "and qwen3_5_text's fail in)",
    "gemma4_text": "transformers' tensor parallel fails in its attention (a view of the local projections as "
                   "[batch, seq, -1, head_dim] that does not fit its shared or wider heads)",
}
# families whose sharded forward transformers cannot differentiate (measured as above): trace(grad=True) says so
CANNOT_DIFFERENTIATE = {
    "llama4_text": "transformers' tensor parallel backward fails in Llama 4's forward (an in-place edit of a view a "
                   "DTensor's to_local returned)",
}


@dataclass(frozen=True)
class Shard:
    """Where a value saved with ``save(local=True)`` sits in the full one: ``axis`` (the layout's name) at
    ``dim``, this ``rank``'s slice of ``size`` ranks (``None`` axis: the value is a partial sum)."""

    axis: str | None
    dim: int | None
    rank: int
    size: int
    partial: bool = False


class Sharding:
    """A model sharded by transformers' tensor parallel: its process group, rank, size and each module's style."""

    def __init__(self, model: torch.nn.Module, size: int, mesh: Any, plan: dict[str, str]):
        import torch.distributed as dist

        self.size = size
        self.mesh = mesh
        self.group = mesh.get_group("tp") if mesh is not None and mesh.ndim > 1 else (
            mesh.get_group() if mesh is not None else None)
        self.rank = dist.get_rank(self.group)
        self.plan = plan
        self._styles: dict[int, str] | None = None
        self._parents: dict[int, torch.nn.Module] = {}  # id(module) -> its parent
        self.model = model

    @classmethod
    def from_plan(cls, model: torch.nn.Module, size: int) -> Sharding:
        """The sharding transformers' plan (the model's ``_tp_plan``) would make of ``model`` over ``size`` ranks,
        with no process group: what :func:`how` says of each value, for a page (nothing is gathered through it)."""
        s = cls.__new__(cls)
        s.size, s.mesh, s.group, s.rank = size, None, None, 0
        s.plan = dict(model.__dict__.get("_tp_plan") or {})
        s._styles, s._parents, s.model = None, {}, model
        return s

    def styles(self) -> dict[int, str]:
        """id(module) -> its TP style, from the model's plan (``layers.*.self_attn.q_proj``), found once."""
        if self._styles is None:
            styles: dict[int, str] = {}
            patterns = [(p.replace("*", "[0-9]*") if "*" in p else p, s) for p, s in self.plan.items()]
            for name, module in self.model.named_modules():
                for child in module.children():
                    self._parents[id(child)] = module
                for pattern, style in patterns:
                    if name == pattern or fnmatch.fnmatchcase(name, pattern):
                        styles[id(module)] = style
                        break
            self._styles = styles
        return self._styles

    def style(self, module: torch.nn.Module) -> str | None:
        return self.styles().get(id(module))

    def inside(self, module: torch.nn.Module, styles: frozenset[str]) -> bool:
        """Whether ``module`` or one of its ancestors has one of ``styles``."""
        table = self.styles()
        at: torch.nn.Module | None = module
        while at is not None:
            if table.get(id(at)) in styles:
                return True
            at = self._parents.get(id(at))
        return False


def how(target: Target) -> str:
    """How a value is served under tensor parallel, said from its read point and the modules' TP styles
    (before any forward: a trace finds the sharded dim from the shapes, see :meth:`ShardedTarget._find`)."""
    if not isinstance(target, ShardedTarget):
        return ""
    s = target.sharding
    kind, style = target.site.kind, s.style(target.module)
    sharded_axes = [a for a in target.axes if a in SHARDED_AXES]
    axis = sharded_axes[0] if sharded_axes else "sharded"
    if kind == "post" and target.side == "output" and not target.access and style in COLWISE | PACKED_COLWISE:
        return f"sharded ({style} output): all-gathered on its {axis} axis"
    if kind == "pre" and target.side == "input" and not target.access and style in ROWWISE_INPUT:
        return f"sharded ({style} input): all-gathered on its {axis} axis"
    if kind not in ("pre", "post") and style == "embedding_rowwise":
        return "partial lookups of the vocab-parallel embedding (embedding_rowwise): summed over the ranks"
    if kind not in ("pre", "post") and s.inside(target.module, PARTIAL_INSIDE):
        return "partial sums inside the experts (moe_tp_experts): summed over the ranks"
    parent = target.module if kind not in ("pre", "post") else _parent(s, target.module)
    if sharded_axes and parent is not None and _shards_children(s, parent):
        return f"sharded between colwise and rowwise projections: all-gathered on its {axis} axis"
    return "replicated: every rank computes it whole"


SHARDED_AXES = frozenset({"num_heads", "num_kv_heads", "intermediate_size", "heads", "key_heads", "ssm_channels",
                          "ssm_heads", "lru_width"})


def _parent(s: Sharding, module: torch.nn.Module) -> torch.nn.Module | None:
    s.styles()  # (found with the styles)
    return s._parents.get(id(module))


def _shards_children(s: Sharding, module: torch.nn.Module) -> bool:
    return any(s.style(c) in COLWISE | PACKED_COLWISE for c in module.modules())


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether transformers' tensor parallel sharded ``model`` (one attribute read)."""
    size = model.__dict__.get("_tp_size")
    return isinstance(size, int) and size > 1


def sharding_of(model: torch.nn.Module) -> Sharding | None:
    """The tensor-parallel sharding of a transformers model, or None (one attribute read when not sharded)."""
    if not is_sharded(model):
        return None
    return Sharding(model, int(model.__dict__["_tp_size"]), model.__dict__.get("_device_mesh"), dict(model.__dict__.get("_tp_plan") or {}))


def refuse_unshardable(family: str) -> None:
    """A family transformers' tensor parallel cannot run says so before any forward."""
    why = CANNOT_SHARD.get(family)
    if why is not None:
        raise Unavailable(f"family {family} cannot run under tensor parallel: {why}. Load it without tp_plan "
                          "(one process, or device_map='auto' across devices)")


def refuse_grad(family: str) -> None:
    """``trace(grad=True)`` on a sharded family whose backward transformers cannot run says so before the forward."""
    why = CANNOT_DIFFERENTIATE.get(family)
    if why is not None:
        raise Unavailable(f"trace(grad=True) of family {family} under tensor parallel: {why}. Trace without grad, or "
                          "load it without tp_plan")


def planned(model: Any, size: int = 2) -> dict[str, Any]:
    """What a family's page says under tensor parallel, from the code a sharded load runs, on a wrapped model that
    is not sharded (the meta device will do): ``refused`` (its config class has no TP plan, or the family is one
    transformers' tensor parallel cannot run: the words load says), else ``values``: each line support() gives a
    value on ``size`` ranks (:func:`how`) with the values it says it of, ``plan``: the model's own TP plan, and
    ``grad``: why ``trace(grad=True)`` is refused, if it is."""
    config = model.native.config
    if plan_of_config(config) is None:
        return {"refused": f"{type(config).__name__} has no tensor-parallel plan (base_model_tp_plan): transformers "
                           "cannot shard it with tp_plan='auto'"}
    if model.family in CANNOT_SHARD:
        return {"refused": CANNOT_SHARD[model.family]}
    hf = model.native
    before = model._tp
    object.__setattr__(model, "_tp", Sharding.from_plan(hf, size))
    model._targets_cache.clear()
    try:
        rows = model.support().sharded()
    finally:
        object.__setattr__(model, "_tp", before)
        model._targets_cache.clear()
    said: dict[str, list[str]] = {}
    for host, value, line in rows:
        said.setdefault(line, [])
        label = pattern_of(f"{host}.{value}" if host != "model" else value)  # (any block's)
        if label not in said[line]:
            said[line].append(label)
    out: dict[str, Any] = {"values": [{"how": line, "values": labels} for line, labels in said.items()],
                           "plan": dict(hf.__dict__.get("_tp_plan") or {})}
    if model.family in CANNOT_DIFFERENTIATE:
        out["grad"] = CANNOT_DIFFERENTIATE[model.family]
    return out


def plan_of_config(config: Any) -> dict[str, str] | None:
    """The config class's own tensor-parallel plan (``base_model_tp_plan``), or None."""
    for c in (config, *(getattr(config, n, None) for n in ("text_config", "get_text_config"))):
        if callable(c):
            try:
                c = c()
            except TypeError:
                continue
        plan = getattr(type(c), "base_model_tp_plan", None) if c is not None else None
        if plan:
            return dict(plan)
    return None


def groups_config(tp: int, world: int) -> Any:
    """A transformers ``DistributedConfig`` that shards a model over each group of ``tp`` consecutive ranks of
    ``world`` (ranks ``g*tp`` to ``g*tp + tp - 1`` hold copy ``g``): tensor parallel inside a group, the groups
    side by side, each running its own batches (data parallel for inference, as ``nnatlas cache --tp`` runs).

    transformers' own ``dp_replicate_size`` builds that mesh but also wraps the copies in FSDP (for training); this
    config builds the same mesh (pp, dp_replicate, fsdp, tp) and says no data-parallel wrapping is wanted."""
    from transformers.distributed import DistributedConfig

    if tp < 1 or world % tp:
        raise InputError(f"{tp} tensor-parallel ranks do not divide {world} ranks")

    class Groups(DistributedConfig):  # type: ignore[misc]
        @property
        def dp_size(self) -> int:  # (read by transformers to decide on FSDP: the copies are not FSDP's)
            return 1

    return Groups(tp_plan="auto", tp_size=tp, dp_replicate_size=world // tp)


# ---- the collectives (autograd-aware) ------------------------------------------------------

def _gather(local: torch.Tensor, dim: int, sharding: Sharding, packed: int = 1) -> torch.Tensor:
    import torch.distributed as dist

    parts = [torch.empty_like(local, memory_format=torch.contiguous_format) for _ in range(sharding.size)]
    dist.all_gather(parts, local.detach().contiguous(), group=sharding.group)
    if packed > 1:  # each rank holds a slice of each of `packed` blocks (gate, up): block-major order
        chunks = [p.chunk(packed, dim) for p in parts]
        return torch.cat([c[k] for k in range(packed) for c in chunks], dim)
    return torch.cat(parts, dim)


def _slice(full: torch.Tensor, dim: int, sharding: Sharding, packed: int = 1) -> torch.Tensor:
    """The rank's slice of a full tensor (the inverse of :func:`_gather`, without communication)."""
    if packed > 1:
        return torch.cat([b.chunk(sharding.size, dim)[sharding.rank] for b in full.chunk(packed, dim)], dim)
    return full.chunk(sharding.size, dim)[sharding.rank]


class _Gather(torch.autograd.Function):
    """All-gather whose backward is the rank's slice: every rank computes the same thing from the full value."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, dim: int, sharding: Sharding, packed: int) -> torch.Tensor:
        ctx.dim, ctx.sharding, ctx.packed = dim, sharding, packed
        return _gather(local, dim, sharding, packed)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _slice(g, ctx.dim, ctx.sharding, ctx.packed).contiguous(), None, None, None


def _sum(local: torch.Tensor, sharding: Sharding) -> torch.Tensor:
    import torch.distributed as dist

    full = local.detach().clone()
    dist.all_reduce(full, group=sharding.group)
    return full


def _full_dtensor(native: Any, sharding: Sharding) -> torch.Tensor:
    """The full value of a DTensor the forward holds, leaving it as it is: a partial sum (a vocab-parallel
    embedding's lookup) is summed on a copy, since reducing the DTensor itself would spend the mask its own
    reduction needs later in the forward."""
    from torch.distributed.tensor import Partial

    if not any(isinstance(p, Partial) for p in native.placements):
        return native.full_tensor()  # type: ignore[no-any-return]
    local = native._local_tensor.detach().clone()
    for p in native.placements:
        mask = getattr(getattr(p, "mask_buffer", None), "data", None)
        if mask is not None:  # (the rows of ids outside this rank's slice of the vocabulary)
            local[mask] = 0
    import torch.distributed as dist

    dist.all_reduce(local, group=sharding.group)
    return local


class _Sum(torch.autograd.Function):
    """All-reduce of partial sums whose backward hands every rank's partial the full value's gradient."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, sharding: Sharding) -> torch.Tensor:
        return _sum(local, sharding)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return g, None


# ---- how a native tensor is sharded --------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """How one native tensor is laid over the ranks: ``gather`` on ``dim`` (``packed`` blocks), ``sum`` of
    partial sums, ``dtensor`` (a DTensor: ``full_tensor()``), or replicated (``kind`` None)."""

    kind: str | None
    dim: int = -1
    packed: int = 1


REPLICATED = Layout(None)


@dataclass
class ShardedTarget(Target):
    """A target on a sharded model: serves the full logical value (see the module's docstring)."""

    sharding: Any = None  # Sharding
    sizes: tuple[int | None, ...] | None = None  # the layout's sizes this trace (None: the call's, unknown here)
    axes: tuple[str, ...] = ()
    local: bool = False  # save(local=True): the rank's shard, no communication
    sharded = True
    _layouts: dict[tuple[int, ...], Layout] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def _getter(self) -> Any:
        return self._get

    def local_copy(self) -> ShardedTarget:
        """This target serving the rank's shard (``save(local=True)``)."""
        # (a copy: served through the tracer's general path, which marks the holder with the value's tp_shard)
        return dataclasses.replace(self, local=True, copy=True)

    # -- finding the layout --
    def layout_of(self, native: Any) -> Layout:
        if not isinstance(native, torch.Tensor):
            return REPLICATED
        key = tuple(native.shape)
        found = self._layouts.get(key)
        if found is None:
            found = self._layouts[key] = self._find(native)
        return found

    def _find(self, native: torch.Tensor) -> Layout:
        from torch.distributed.tensor import DTensor

        if isinstance(native, DTensor):
            return Layout("dtensor")
        s = self.sharding
        kind, style = self.site.kind, s.style(self.module)
        width = getattr(self.module, "out_features" if kind == "post" else "in_features", None)
        if style in COLWISE | PACKED_COLWISE | ROWWISE_INPUT and isinstance(width, int) and width % s.size:
            # (every rank sees the same modules: every rank says so, none waits in a collective)
            raise Unavailable(f"{self.label}: {type(self.module).__name__} has {width} features over {s.size} ranks, "
                              "shards of unequal widths, which nnatlas does not gather; pick a rank count that "
                              "divides the heads and the MLP's width")
        if kind == "post" and self.side == "output" and not self.access:
            if style in COLWISE:
                return Layout("gather", native.dim() - 1)
            if style in PACKED_COLWISE:
                return Layout("gather", native.dim() - 1, 2)
        if kind == "pre" and style in ROWWISE_INPUT and self.side == "input" and not self.access:
            return Layout("gather", native.dim() - 1)
        inside_partial = kind not in ("pre", "post") and s.inside(self.module, PARTIAL_INSIDE)
        if self.sizes is None:
            if inside_partial:
                return Layout("sum")
            return REPLICATED
        if self._fits(native.shape):
            return Layout("sum") if inside_partial else REPLICATED
        found = [d for d in range(native.dim()) if self._fits(_grown(native.shape, d, s.size))]
        if not found:
            raise Unavailable(
                f"{self.label}: under tensor parallel ({s.size} ranks) this rank holds a tensor of shape "
                f"{list(native.shape)} from which no gather gives its layout {' '.join(self.axes)} = "
                f"[{', '.join('?' if n is None else str(n) for n in self.sizes)}]; save(local=True) serves the "
                "rank's own tensor")
        return Layout("gather", native.dim() - 1 if native.dim() - 1 in found else found[0])

    def _fits(self, shape: torch.Size) -> bool:
        try:
            served = Target.served(self, torch.empty(shape, device="meta"))
        except (NnatlasError, RuntimeError, IndexError, TypeError, ValueError):
            return False
        if not isinstance(served, torch.Tensor) or self.sizes is None or served.dim() != len(self.sizes):
            return False
        return all(n is None or n == m for n, m in zip(self.sizes, served.shape, strict=True))

    # -- serving --
    def full(self, native: Any, grad: bool = False) -> Any:
        """The full logical tensor of a rank's native (gathered, summed), or the native when replicated."""
        layout = self.layout_of(native)
        if layout.kind is None:
            return native
        if layout.kind == "dtensor":
            return _full_dtensor(native, self.sharding)
        if grad and native.requires_grad:
            if layout.kind == "sum":
                return _Sum.apply(native, self.sharding)
            return _Gather.apply(native, layout.dim, self.sharding, layout.packed)
        if layout.kind == "sum":
            return _sum(native, self.sharding)
        return _gather(native, layout.dim, self.sharding, layout.packed)

    def _get(self, payload: Any) -> Any:
        native = self.native(payload)
        if self.local:
            return self.served_local(native)
        return Target.served(self, self.full(native, torch.is_grad_enabled()))

    def served_local(self, native: Any) -> Any:
        """The rank's own shard of the value, without communication, marked with ``tp_shard``."""
        layout = self.layout_of(native)
        s = self.sharding
        if layout.kind is None or not isinstance(native, torch.Tensor):
            return Target.served(self, native)
        if layout.kind == "dtensor":
            return native.to_local()  # type: ignore[attr-defined]
        if layout.kind == "sum":
            value = Target.served(self, native)
            value.tp_shard = Shard(None, None, s.rank, s.size, partial=True)
            return value
        # the view of a full-sized tensor holding the rank's slice where it sits (zeros elsewhere), then the
        # rank's chunk of the served dim along which that slice lies (found by viewing a mark the same way)
        shape = _grown(native.shape, layout.dim, s.size)
        mark = torch.zeros(shape, dtype=torch.bool)
        full = torch.zeros(shape, dtype=native.dtype, device=native.device)
        n = native.shape[layout.dim] // layout.packed
        for k in range(layout.packed):
            start = (k * s.size + s.rank) * n
            mark.narrow(layout.dim, start, n).fill_(True)
            full.narrow(layout.dim, start, n).copy_(native.narrow(layout.dim, k * n, n))
        seen = Target.served(self, mark)
        value = Target.served(self, full)
        dim = next((d for d in range(seen.dim()) if bool((seen != seen.narrow(d, 0, 1)).any())), None)
        if dim is not None and layout.packed == 1:
            value = value.chunk(s.size, dim)[s.rank]
        axis = self.axes[dim] if dim is not None and dim < len(self.axes) else None
        value.tp_shard = Shard(axis, dim, s.rank, s.size)
        return value

    def assign(self, served: Any, new: Any) -> None:
        """``value = new`` on the full tensor: written into it (broadcast to the layout), or refused."""
        if isinstance(served, torch.Tensor) and isinstance(new, torch.Tensor):
            try:
                served.copy_(new)
            except RuntimeError as e:
                raise InputError(self.edit_error(f"{self.label} = ...", served, new, e)) from e
            return
        raise NnatlasError(f"{self.label}: under tensor parallel an edit writes a tensor into the value; got a "
                           f"{type(new).__name__}")

    def replace(self, payload: Any, new: Any) -> Any:
        native = self.native(payload)
        if self.layout_of(native).kind is None:
            return Target.replace(self, payload, new)
        return self.edit_in_place(payload, lambda served: self.assign(served, new))

    def edit_in_place(self, payload: Any, edit: Any) -> Any:
        """An edit (``edit(served)``) made on the full tensor, then each rank's part written into its shard."""
        native = self.native(payload)
        layout = self.layout_of(native)
        if layout.kind is None:
            edit(Target.served(self, native))
            return payload
        if self.local:
            raise NnatlasError(f"{self.label}: a value saved with local=True is read, not edited")
        if layout.kind == "dtensor":
            raise Unavailable(f"{self.label} is a DTensor in this forward: edit a value computed on local tensors")
        grad = torch.is_grad_enabled()
        full = self.full(native, grad)
        if layout.kind == "sum":
            old = full.detach().clone()
            edit(Target.served(self, full))
            # partial sums: each rank's part moves by its share of the change
            native.add_((full - old) / self.sharding.size)
            return payload
        edit(Target.served(self, full))
        native.copy_(_slice(full, layout.dim, self.sharding, layout.packed))
        return payload

    def grad_view(self) -> Any:
        """The gradient of the rank's native tensor, gathered to the full value's (a collective in the
        backward: every rank's backward runs the same graph, so every rank reaches it in the same order)."""
        view = Target.grad_view(self)
        layouts = self._layouts
        sharding = self.sharding

        def gathered(g: torch.Tensor) -> torch.Tensor:
            layout = layouts.get(tuple(g.shape), REPLICATED)
            if layout.kind == "gather":
                g = _gather(g, layout.dim, sharding, layout.packed)
            return view(g)
        return gathered


def _grown(shape: torch.Size, dim: int, size: int) -> torch.Size:
    grown = list(shape)
    grown[dim] *= size
    return torch.Size(grown)


def shard_target(target: Target, sharding: Sharding, sizes: tuple[int | None, ...] | None,
                 axes: tuple[str, ...]) -> ShardedTarget:
    """``target`` on a sharded model: serves full values (see :class:`ShardedTarget`)."""
    fields = {f.name: getattr(target, f.name) for f in dataclasses.fields(Target) if f.init}
    return ShardedTarget(**fields, sharding=sharding, sizes=sizes, axes=axes)
