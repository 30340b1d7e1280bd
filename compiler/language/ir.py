"""The resolved, frozen family IR the templates render from.

Its parts that the runtime also holds are the runtime's own data model (``nnatlas.spec``: ``Layout``,
``Condition``, ``ReadPoint``), the only runtime module the compiler's core imports; what is here besides
is what only the compiler knows (compiled expressions, the spec's positions, the pages' inputs).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from nnatlas.spec import Condition, Layout, ReadPoint

from .expr import Compiled

MAX_BLOCKS = 1024  # blocks a page draws of one stack (a spec's config could say any number)


def config_value(config: Any, name: str) -> Any:
    """``name`` (``vision_config.depth``) looked up in a recorded config mapping, None when absent."""
    node = config
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node

# where a spec item stands, for problems found after resolving (the module tree check): file, line, col
At = tuple[str, int, int] | None

REQUIRED_CONFIG = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "qk_head_dim",
                   "vocab_size", "intermediate_size")


@dataclass(frozen=True)
class ValueIR:
    name: str
    layout: Layout
    meaning: str
    read: ReadPoint | None
    derived: Compiled | None
    derived_text: str | None
    view: tuple[tuple[str, tuple[Any, ...]], ...]
    view_text: str | None
    needs: Condition | None
    missing: str | None = None
    reached: Condition | None = None
    readonly_why: str | None = None  # a read value whose edit would reach nothing: why
    edit: str = "logits"  # what an edit reaches: logits | later | none
    copy: bool = False  # served as a copy put in the native's place
    at: At = field(default=None, compare=False)

    @property
    def recomputed(self) -> bool:
        """Read inside eager attention (``call:attention > op:...``): the runtime recomputes it under sdpa
        and flex attention from the call's queries and keys; or read at eager's softmax in the host's own
        forward with ``recompute: sdpa``: recomputed under sdpa from the forward's scaled_dot_product_attention
        call (runtime/trace/patterns.py). Edits need eager."""
        return bool(self.needs and self.needs.name == "eager" and self.read is not None and self.read.recomputable)

    @property
    def readonly(self) -> bool:
        return self.derived is not None or self.edit == "none" or self.readonly_why is not None

    @property
    def words(self) -> str:
        if self.missing is not None:
            return f"missing: {self.missing}"
        if self.derived is not None:
            return f"derived from {', '.join(self.derived.names)}: {self.derived_text}"
        assert self.read is not None
        return self.read.words + (f", viewed as {self.view_text}" if self.view_text else "")

    @property
    def where(self) -> str:
        if self.derived is not None:
            return self.derived_text or ""
        return self.read.text if self.read else ""


@dataclass(frozen=True)
class IdentityIR:
    text: str
    op: str
    lhs: Compiled
    rhs: Compiled
    atol: float
    rtol: float
    at: At = field(default=None, compare=False)

    @property
    def terms(self) -> tuple[str, ...]:
        seen: list[str] = []
        for n in (*self.lhs.names, *self.rhs.names):
            if n not in seen:
                seen.append(n)
        return tuple(seen)


@dataclass(frozen=True)
class HostIR:
    path: str
    cls: str
    when: Compiled | None
    when_text: str | None
    values: tuple[ValueIR, ...]
    identities: tuple[IdentityIR, ...]
    dims: tuple[tuple[str, str], ...] = ()
    kind: str | None = None
    at: At = field(default=None, compare=False)  # the class's position

    @property
    def ident(self) -> str:
        """A Python identifier for the host: ``layers[i].self_attn`` → ``layers_self_attn``."""
        base = re.sub(r"\[([0-9]+)\]", r"_\1", self.path.replace("[i]", "")).replace(".", "_")  # self_attn[0]: _0
        if self.when_text:
            base += "_" + "".join(ch if ch.isalnum() else "_" for ch in self.when_text).strip("_")
        if len(base) > 84:  # a long condition (two lists together): its start and a digest, one per condition
            base = base[:64] + "_" + hashlib.sha256(base.encode()).hexdigest()[:8]
        return base


@dataclass(frozen=True)
class FunctionIR:
    """A group of module-level functions read as one (``fn:delta_rule``), and how to route it."""

    name: str
    names: tuple[str, ...]
    words: str
    route: tuple[tuple[str, Any], ...] | None


@dataclass(frozen=True)
class DrawIR:
    name: str
    choices: tuple[Any, ...] | None
    expr: Compiled | None


@dataclass(frozen=True)
class TinyIR:
    model_class: str
    config_class: str
    config: tuple[tuple[str, Any], ...]
    draw: tuple[DrawIR, ...]
    batch: tuple[int, int]
    seq: tuple[int, int]
    examples: int
    experts: tuple[str, ...] = ()
    processor: tuple[tuple[str, Any], ...] | None = None  # class, image_processor, image_processor_config, tokens
    images: tuple[tuple[str, Any], ...] | None = None  # count, sizes
    image_text: tuple[tuple[str, Any], ...] | None = None  # a second tiny load: the multimodal wrapper
    factors: tuple[tuple[str, Any], ...] = ()  # config entry -> {"range": (low, high)} or {"pin": value, "reason": why}
    layouts: tuple[tuple[str, Any], ...] = ()  # config entry -> {"options": [...], "reason": why} or {"pin": ..., "reason"}


@dataclass(frozen=True)
class CheckpointIR:
    name: str
    config: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class NoteIR:
    title: str
    body: str
    examples: tuple[str, ...]
    shared: str | None = None  # the group of specs/_notes.yaml it comes from
    load: str | None = None  # the load its examples run on


@dataclass(frozen=True)
class DiagramIR:
    """The parts the page draws, in order (standard names; see ``models.DiagramRaw``)."""

    text: tuple[str, ...]
    block: tuple[str, ...]
    vision: tuple[str, ...]
    vision_block: tuple[str, ...]
    vision_facts: tuple[tuple[str, str], ...] = ()  # term → sentence, drawn beside the vision path


DEFAULT_TEXT = ("embed_tokens", "layers", "norm", "lm_head")
DEFAULT_BLOCK = ("input_layernorm", "mixer", "add", "post_attention_layernorm", "mlp", "add")


@dataclass(frozen=True)
class FamilyIR:
    name: str
    file: str
    sha256: str
    extends: tuple[str, ...]
    title: str
    lines: tuple[str, ...]
    summary: str
    traits: tuple[tuple[str, str], ...]
    model_types: tuple[str, ...]
    classes: tuple[str, ...]
    rename: tuple[tuple[str, tuple[str, ...]], ...]
    config: tuple[tuple[str, Compiled, str], ...]
    functions: tuple[FunctionIR, ...]
    hosts: tuple[HostIR, ...]
    tiny: TinyIR
    checkpoints: tuple[CheckpointIR, ...]
    notes: tuple[NoteIR, ...]
    docstring: str
    diagram: DiagramIR = DiagramIR(DEFAULT_TEXT, DEFAULT_BLOCK, (), DEFAULT_BLOCK)
    attention: tuple[str, ...] | None = None  # declared attention implementations (None: read from the class)
    rename_at: tuple[tuple[str, At], ...] = field(default=(), compare=False)  # each rename entry's position
    tiny_at: At = field(default=None, compare=False)  # tiny.model_class's position
    parts: tuple[tuple[str, str], ...] = ()  # the parts it includes: (file, sha256)

    def hosts_at(self, path: str) -> tuple[HostIR, ...]:
        return tuple(h for h in self.hosts if h.path == path)


@dataclass(frozen=True)
class Atlas:
    """Every family, resolved, with the vocabulary they share."""

    families: tuple[FamilyIR, ...]
    layouts: tuple[Layout, ...]
    dims: tuple[tuple[str, str], ...]
    vocabulary_file: str
    vocabulary_sha256: str
    sources: tuple[tuple[str, str], ...] = ()  # every spec file read: (path, sha256)
    papers: tuple[tuple[str, str], ...] = ()  # checkpoint id -> arXiv id of its paper (specs/_papers.yaml)

    @property
    def digest(self) -> str:
        """One sha256 over every spec file: the header of files generated from all of them."""
        import hashlib

        return hashlib.sha256("".join(f"{p}\0{s}\n" for p, s in self.sources).encode()).hexdigest()
