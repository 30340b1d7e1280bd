"""The data a family adapter is made of.

Generated modules under ``nnatlas.families`` build one :class:`Family` from these frozen
dataclasses; the runtime reads nothing else about a family. Nothing here imports torch or
transformers, so the compiler's tests and the generated modules stay cheap to import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ReadKind = Literal["module", "call", "op", "method", "fn", "derived", "missing"]
Side = Literal["input", "output", "inputs", "args", "fn_args", "fn_output", "fn_step", "fn_steps"]


@dataclass(frozen=True)
class Layout:
    """A named shape: ``Residual = [batch seq hidden_size]``."""

    name: str
    dims: tuple[str, ...]
    dtype: Literal["float", "long", "bool", "object"] = "float"
    optional: bool = False  # "State | None": the value may be None

    @property
    def text(self) -> str:
        dims = f"[{' '.join(self.dims)}]" if self.dims else ""
        name = f"{self.name} | None" if self.optional else self.name
        return f"{name} {dims}".strip()


@dataclass(frozen=True)
class ViewOp:
    """One step of a view onto a layout, e.g. ``unflatten(-1, [num_heads, head_dim])``.

    Arguments that are strings name normalized config attributes, resolved when served.
    """

    name: Literal["unflatten", "unsqueeze", "transpose", "flatten"]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class ReadPoint:
    """Where a value is read, in the terms of one runtime mechanism.

    kind ``module``: the host's (or a child module's) boundary: ``side`` input / output / inputs.
    kind ``call``: an interface call made inside the host's forward (``call`` = ``attention``):
    its positional ``args`` or its ``output``.
    kind ``op``: a torch operation (``op`` name and ``occurrence``) inside an interface call
    (``call``) or inside the host's forward (``call`` None): its ``input`` or ``output``.
    kind ``method``: a call of one of a module's own methods (``method``; the ``occurrence``-th call
    while the module's forward runs, or the host's block index when ``per_index``): its ``args`` or
    its ``output``.
    ``module`` of a call, op or method read: the module whose forward (or method) is read, a path
    from the host, or from the root when ``scope_root``; empty for the host itself.
    kind ``fn``: a module-level function (or a group of them, ``Family.functions``) that the host's
    forward calls: its arguments (``fn_args``: by position in the signature or by parameter name),
    its output (``fn_output``), or, under ``route_kernels``, each token's step (``fn_step``) or every
    step stacked (``fn_steps``).
    kind ``derived``: computed by ``derive`` from other values of the host (``deps``; a dep
    ``model.x`` is the root's value ``x``, a config entry's name its value); read-only.
    kind ``missing``: the family has no such value; ``words`` says why (reading it raises Unavailable).
    ``up``: the read starts that many hosts above the host (``^.post_attention_layernorm.output``
    reads a sibling's boundary: what the stream receives from a sandwich-normed mixer).
    """

    kind: ReadKind
    text: str
    words: str
    module: tuple[str, ...] = ()
    side: Side = "output"
    param: str | None = None
    access: tuple[int | str, ...] = ()
    call: str | None = None
    op: str | None = None
    occurrence: int = 0
    method: str | None = None
    per_index: bool = False
    scope_root: bool = False
    fn: str | None = None
    up: int = 0  # ``^.`` levels: the read starts at the host's parent (1), its grandparent (2), ...
    deps: tuple[str, ...] = ()
    derive: Callable[[Mapping[str, Any]], Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Condition:
    """A condition that makes a value ⚠︎ conditional: of the load (``eager``) or of the call (``images``)."""

    name: str
    says: str  # shown beside the value: "needs attn_implementation='eager'"
    fix: str  # what load (or what input) fixes it
    attribute: str | None = None  # a config attribute of the module read in (or of the model) ...
    values: tuple[str, ...] = ()  # ... and the values under which the value is served
    kind: Literal["load", "call"] = "load"
    never: bool = False  # no load meets it


@dataclass(frozen=True)
class ValueSpec:
    name: str
    layout: Layout
    meaning: str
    read: ReadPoint
    view: tuple[ViewOp, ...] = ()
    needs: Condition | None = None
    readonly: bool = False
    readonly_why: str | None = None  # read-only although read (an edit there would reach nothing): why
    reached: Condition | None = None  # a call condition: checked against the call's inputs before the forward
    edit: Literal["logits", "later", "none"] = "logits"  # what an edit reaches (this forward, later calls, nothing)
    copy: bool = False  # served as a copy put in the native's place (a buffer overwritten later in the run)
    at: str = ""  # where the spec says it: "specs/llama.yaml:68:32" (errors name the line)


@dataclass(frozen=True)
class Identity:
    """An equation between values of one host, compiled to ``check(values) -> (lhs, rhs)``."""

    text: str
    terms: tuple[str, ...]
    check: Callable[[Mapping[str, Any]], tuple[Any, Any]] = field(compare=False)
    op: str = "=="
    atol: float = 0.0
    rtol: float = 0.0
    at: str = ""  # where the spec says it: "specs/llama.yaml:52:9"


@dataclass(frozen=True)
class HostSpec:
    """A host path (``layers[i].self_attn``), its native class and its values."""

    path: str
    cls: str
    values: tuple[ValueSpec, ...]
    identities: tuple[Identity, ...] = ()
    when: Callable[[Any, int], bool] | None = field(default=None, compare=False)
    when_text: str | None = None
    kind: str | None = None  # the block kind of a hybrid stack (``model.<kind>_layers``)
    dims: tuple[tuple[str, str], ...] = ()  # dims sized by another config entry on this host

    def value(self, name: str) -> ValueSpec | None:
        for v in self.values:
            if v.name == name:
                return v
        return None


@dataclass(frozen=True)
class FunctionGroup:
    """Module-level functions read under one name (``fn:delta_rule``): whichever of ``names`` a call runs.

    ``route`` (optional) says how ``route_kernels(family, "torch")`` runs a call token by token:
    ``torch`` (the pure-torch function each step calls), ``seq_dim``, ``state_arg`` (the argument
    carrying the state into a step), ``state_output`` (the output element that is the state after it)
    and ``final_state_flag`` (the argument asking for the final state).
    """

    name: str
    names: tuple[str, ...]
    words: str
    route: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    lines: tuple[str, ...]
    summary: str
    traits: tuple[str, ...]
    model_types: tuple[str, ...]
    classes: tuple[str, ...]
    rename: Mapping[str, tuple[str, ...]]
    config: Mapping[str, Callable[[Any], Any]] = field(compare=False)
    hosts: tuple[HostSpec, ...] = ()
    functions: Mapping[str, FunctionGroup] = field(default_factory=dict)
    spec_file: str = ""
    spec_sha256: str = ""
    # the attention implementations the spec declares its classes accept (None: read from the class)
    attention: tuple[str, ...] | None = None

    def host(self, path: str) -> HostSpec | None:
        for h in self.hosts:
            if h.path == path:
                return h
        return None

    def hosts_at(self, path: str) -> tuple[HostSpec, ...]:
        return tuple(h for h in self.hosts if h.path == path)
