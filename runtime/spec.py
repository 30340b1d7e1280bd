"""The frozen data model of a family spec, shared by the compiler and the runtime.

The compiler resolves each spec into these dataclasses (``Layout``, ``Condition``, ``ReadPoint``,
``ViewOp`` … inside its own IR) and writes them out as the generated adapter
(``nnatlas.families.<family>``), which builds one :class:`Family`; the runtime reads nothing else
about a family. The functions a spec expression may call (``FUNCTIONS``, ``CONFIG_FUNCTIONS``,
``VIEW_OPS``) are listed here once: the compiler checks expressions against them and
``nnatlas.trace.expressions`` implements each. Nothing here imports torch or transformers, so the compiler
and the generated modules stay cheap to import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# the view arguments bound per call (from the model's input ids, or its input embeddings), not by the config
CALL_DIMS = ("batch", "seq")
# the dims a call's inputs size (the rest are config entries, or a host's dims:)
INPUT_DIMS = ("batch", "seq", "query", "key", "one", "images", "patches", "image_tokens", "tiles")

ReadKind = Literal["module", "call", "op", "method", "fn", "derived", "missing"]
Side = Literal["input", "output", "inputs", "args", "fn_args", "fn_output", "fn_step", "fn_steps"]
DType = Literal["float", "long", "bool", "object"]
# a word a spec or a read point's grammar gives, as the Literal above it names (a lookup fails on any other)
SIDES: dict[str, Side] = {s: s for s in get_args(Side)}
DTYPES: dict[str, DType] = {d: d for d in get_args(DType)}


@dataclass(frozen=True)
class Layout:
    """A named shape: ``Residual = [batch seq hidden_size]``."""

    name: str
    dims: tuple[str, ...]
    dtype: DType = "float"
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
    ``call_occurrence`` of a call read or of an op inside a call: which call of the interface in the
    forward (``call:attention#1``: the second; DiffLlama calls attention twice per forward).
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
    ``recompute`` ``"sdpa"`` (an ``op:softmax`` read of the host's own forward): under that load the
    forward calls torch's ``scaled_dot_product_attention`` in place of eager's softmax, and a trace
    serves the read from eager's softmax computed from that call's arguments (``patterns``).
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
    recompute: str | None = None
    call_occurrence: int = 0  # ``call:NAME#K``: the K-th call of the interface in the forward (DiffLlama's two)

    @property
    def recomputable(self) -> bool:
        """A pattern read the fused attentions recompute (runtime/trace/patterns.py): inside eager attention
        (``call:attention > op:...``: under sdpa and flex attention), or at eager's softmax in the host's
        own forward with ``recompute: sdpa`` (under sdpa, from the forward's scaled_dot_product_attention)."""
        return self.kind == "op" and (self.call == "attention" or self.recompute is not None)

    @property
    def by_position(self) -> bool:
        """Read by its position among calls (``op:add#5``, ``method:f#i``): a shift reads another tensor."""
        return "#" in self.text


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


# ---- the functions a spec expression may call ----

Arity = int | tuple[int, int]


@dataclass(frozen=True)
class Function:
    """One function a spec expression may call: the whitelist, and the spec reference's table."""

    arity: Arity  # positional arguments: n, or (fewest, most)
    signature: str  # how a spec writes the call
    doc: str  # what it computes, one sentence (the spec reference shows it)
    # keyword arguments it takes: name -> the string literals allowed there, or None for any expression
    keywords: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    strings: tuple[int, ...] = ()  # positional arguments that are string literals (checked: ``check``)
    context: bool = False  # also receives the values mapping (the call's attention mask, the config)


def _f(arity: Arity, signature: str, doc: str, **kw: Any) -> Function:
    return Function(arity, signature, doc, **kw)


# Functions identities and derived values may call; each compiles to ``nnatlas.trace.expressions.<name>``.
# This table is the one list: the compiler checks calls against it and the spec reference
# (docs/spec.md) prints it.
FUNCTIONS: dict[str, Function] = {
    "sigmoid": _f(1, "sigmoid(x)", "1 / (1 + exp(-x)), elementwise."),
    "tanh": _f(1, "tanh(x)", "The hyperbolic tangent, elementwise."),
    "silu": _f(1, "silu(x)", "x * sigmoid(x) (SiLU / swish), elementwise."),
    "gelu": _f(1, "gelu(x, approximate='none')",
               "GELU, elementwise: exact (erf) by default, or the tanh approximation (gelu_new, gelu_pytorch_tanh) "
               "with approximate='tanh'.", keywords=(("approximate", ("none", "tanh")),)),
    "softplus": _f(1, "softplus(x)", "log(1 + exp(x)), elementwise (torch's default threshold 20)."),
    "exp": _f(1, "exp(x)", "e ** x, elementwise."),
    "log": _f(1, "log(x)", "The natural logarithm, elementwise."),
    "abs": _f(1, "abs(x)", "The absolute value, elementwise."),
    "softmax": _f(2, "softmax(x, dim)", "Softmax along dim, computed in float32 and cast back to x's dtype."),
    "cumsum": _f(2, "cumsum(x, dim)", "The running sum along dim."),
    "sum": _f(2, "sum(x, dim)", "The sum along dim."),
    "einsum": _f((2, 6), "einsum('bhqk,bhkd->bhqd', a, b, ...)",
                 "torch.einsum; the equation is a string literal, checked when the spec compiles (one subscript "
                 "group per operand, output letters drawn from the inputs, each at most once).", strings=(0,)),
    "flatten": _f((1, 2), "flatten(x, start=0)", "x flattened from dim start on."),
    "unflatten": _f(3, "unflatten(x, dim, [a, b])", "Dim dim of x split into the sizes given."),
    "transpose": _f(3, "transpose(x, a, b)", "x with dims a and b swapped."),
    "chunk": _f(3, "chunk(x, n, dim)", "x cut into n equal pieces along dim (index the result: chunk(...)[1])."),
    "cat": _f(2, "cat([a, b], dim)", "The tensors concatenated along dim."),
    "shape": _f(1, "shape(x)", "x's sizes, as a list."),
    "last_token": _f(2, "last_token(x, attention_mask)",
                     "x[:, i] at each row's last real token i, the last position whose attention_mask is not zero "
                     "(on either side of padding); x[:, -1] when the mask is None or not as long as x's dim 1 "
                     "(a generation step)."),
    "l2norm": _f(1, "l2norm(x)", "x divided by its L2 norm along the last dim (clamped at 1e-6)."),
    "vnorm": _f(1, "vnorm(x)", "The L2 norm of each vector along the last dim, in float32."),
    "repeat_kv": _f(2, "repeat_kv(x, groups)", "Each key/value head of a [batch heads seq dim] tensor repeated groups "
                    "times (grouped-query attention)."),
    "tokens": _f(1, "tokens(x)", "[batch, seq, ...] flattened to [batch * seq, ...], the tokens a mixture of experts sees."),
    "topk_weights": _f(3, "topk_weights(probs, k, normalize)",
                       "The k largest probabilities of each row, divided by their sum when normalize is true."),
    "topk_indices": _f(2, "topk_indices(probs, k)", "The indices of the k largest entries of each row, largest first."),
    "grouped_topk_indices": _f((4, 5), "grouped_topk_indices(choice, k, groups, topk_groups, best=2)",
                               "The indices of the k largest entries of each row of choice, taken among the "
                               "topk_groups best of its groups equal groups of columns only (a group scores the sum "
                               "of its best largest entries: 2 in DeepSeek-V3's group-limited routing, 1 in "
                               "DeepSeek-V2's), largest first."),
    "chosen_weights": _f(3, "chosen_weights(probs, indices, normalize)",
                         "The entries of probs at indices (along the last dim), divided by their sum when normalize "
                         "is true: the routing weights of experts chosen on other scores (a correction bias)."),
    "masked": _f(1, "masked(pattern, window=None, chunk=None, sinks=0)",
                 "The entries of a [batch heads query key] attention pattern that the model's mask hides, as a flat "
                 "tensor: causal and padding always; with window=W also the keys W or more positions behind the query "
                 "(sliding window, as transformers' sliding_window_overlay); with chunk=C the keys outside the query's "
                 "chunk of C positions, counted from the first real token (attention_chunk_size); with sinks=N the "
                 "pattern's last N columns are sinks (gpt-oss), never hidden. Rows of padding queries are left out. "
                 "window or chunk None means none.",
                 keywords=(("window", None), ("chunk", None), ("sinks", None)), context=True),
    "delta_rule": _f((5, 6), "delta_rule(q, k, v, g, beta, state=None)",
                     "The gated delta rule token by token (DeltaNet; transformers' torch_recurrent_gated_delta_rule "
                     "with the kernel's l2 norm and 1/sqrt(key_dim) scale): q, k [batch seq key_heads key_dim], v "
                     "[batch seq heads value_dim], g (log decay) [batch seq heads], or [batch seq heads key_dim] for a "
                     "decay per key channel (Kimi Delta Attention), and beta [batch seq heads]; returns (outputs "
                     "[batch seq heads value_dim], final state [batch heads key_dim value_dim])."),
    "linear_attention": _f((4, 5), "linear_attention(q, k, v, slope, state=None)",
                           "Linear attention with a decay per head, token by token (MiniMax's lightning attention, "
                           "not the delta rule): q, k [batch heads seq key_dim], v [batch heads seq value_dim], slope "
                           "the decay rate per head; S = exp(-slope) S + k_t v_t, o_t = q_t S; returns (outputs "
                           "[batch heads seq value_dim], final state [batch heads key_dim value_dim])."),
    "selective_scan": _f((5, 7), "selective_scan(x, dt, A, B, C, D=None, z=None)",
                         "Mamba's selective scan token by token (transformers' mamba_selective_scan, recurrent path): "
                         "x, dt (already softplus-ed), z [batch seq channels], A [channels state], B, C [batch seq "
                         "state], D [channels]: h = exp(dt A) h + dt B x; y = C h + D x, times silu(z) when given. "
                         "Returns (y [batch seq channels], final state [batch channels state])."),
}
CONFIG_FUNCTIONS: dict[str, Function] = {
    "len": _f(1, "len(xs)", "The length of a list (config.layer_types ...)."),
    "min": _f(2, "min(a, b)", "The smaller of two numbers."),
    "max": _f(2, "max(a, b)", "The larger of two numbers."),
    "count": _f(2, "count(xs, item)", "How many times item occurs in the list xs."),
    "int": _f(1, "int(x)", "x rounded toward zero to an integer."),
}
VIEW_OPS: dict[str, Function] = {
    "unflatten": _f(2, "unflatten(dim, [a, b])", "Split dim into the sizes given (config names or integers)."),
    "unsqueeze": _f(1, "unsqueeze(dim)", "Add a dim of size 1."),
    "transpose": _f(2, "transpose(a, b)", "Swap two dims."),
    "flatten": _f((1, 2), "flatten(start, end=-1)", "Merge dims start..end into one."),
}
CONTEXT_FUNCTIONS = {n for n, f in FUNCTIONS.items() if f.context}  # these also receive the values mapping


def pattern_of(label: str) -> str:
    """The spec path of a host's label: the stack's block index as ``[i]``, a list item inside a block kept
    (``layers[3].self_attn[1]`` → ``layers[i].self_attn[1]``)."""
    return re.sub(r"\[\d+\]", "[i]", label, count=1)
