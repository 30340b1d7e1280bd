"""The spec files as pydantic models: unknown keys are errors, every field typed.

A family spec may ``extends:`` another, so every field of a family is optional here; the
resolver checks what a complete family needs after the merge.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Scalar = StrictStr | StrictInt | StrictFloat | StrictBool | None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ---- the shared vocabulary ---------------------------------------------------------------

class LayoutRaw(Strict):
    dims: StrictStr = Field(description="space-separated dims, e.g. 'batch seq hidden_size'; empty for a scalar")
    dtype: StrictStr = "float"
    optional: StrictBool = False


class VocabValueRaw(Strict):
    layout: StrictStr
    meaning: StrictStr
    optional: StrictBool = False  # the value may be None ("State | None")


class ConditionRaw(Strict):
    says: StrictStr
    fix: StrictStr
    # a config attribute of the module the value is read in (or of the model) and the values that
    # serve it: ``attribute: _experts_implementation, values: [grouped_mm, batched_mm]``
    attribute: StrictStr | None = None
    values: list[StrictStr] = []
    # load: decided by how the model was loaded (attn_implementation, a processor);
    # call: decided by the inputs of one call (images in the prompt), checked before the forward
    kind: Literal["load", "call"] = "load"
    never: StrictBool = Field(default=False, description="no load meets it: the value is Unavailable everywhere, with this reason")


class Vocabulary(Strict):
    dims: dict[StrictStr, StrictStr]
    layouts: dict[StrictStr, LayoutRaw]
    values: dict[StrictStr, VocabValueRaw]
    streams: dict[StrictStr, dict[StrictStr, VocabValueRaw]] = {}
    conditions: dict[StrictStr, ConditionRaw] = {}
    traits: dict[StrictStr, StrictStr] = {}


# ---- a family ----------------------------------------------------------------------------

class ValueRaw(Strict):
    read: StrictStr | None = None
    derived: StrictStr | None = None
    view: StrictStr | None = None
    needs: StrictStr | None = None
    # the family has no such value, and why (support() and the page say so; reading it raises Unavailable)
    missing: StrictStr | None = None
    reached: StrictStr | None = None
    readonly: StrictStr | None = Field(default=None, description="why an edit here would reach nothing: the value is then read-only")
    # what an edit reaches: "logits" (this forward, the default), "later" (only later calls: a
    # state written to the cache), "none" (a record of what ran: read-only)
    edit: StrictStr = "logits"
    # serve a copy, put in the call's place: for a buffer the model overwrites later in the same run
    # (a cache's state), so the saved value keeps what entered and in-place edits still reach the call
    served_copy: StrictBool = Field(default=False, alias="copy")


class IdentityRaw(Strict):
    check: StrictStr
    atol: StrictFloat | StrictInt = 0.0
    rtol: StrictFloat | StrictInt = 0.0


class KindRaw(Strict):
    """One block kind of a hybrid stack: the blocks ``when`` selects, with their own values and identities."""

    when: StrictStr
    values: dict[StrictStr, StrictStr | ValueRaw | None] = {}
    identities: list[StrictStr | IdentityRaw] = []


class HostRaw(Strict):
    cls: StrictStr | None = Field(default=None, alias="class")
    when: StrictStr | None = None
    stream: StrictStr | None = None
    # dims this host's values are sized by another config entry: {intermediate_size: shared_expert_intermediate_size}
    dims: dict[StrictStr, StrictStr] = {}
    needs: StrictStr | None = Field(default=None, description="the load condition of every value here, unless a value says its own")
    reached: StrictStr | None = Field(default=None, description="the call condition of every value here, unless a value says its own")
    values: dict[StrictStr, StrictStr | ValueRaw | None] = {}
    identities: list[StrictStr | IdentityRaw] = []
    # hybrid stacks: one entry per block kind (``model.<kind>_layers`` lists its blocks)
    kinds: dict[StrictStr, KindRaw] = {}


class RouteRaw(Strict):
    """How ``route_kernels(family, "torch")`` runs a function group token by token."""

    torch: StrictStr  # the pure-torch function each token's step calls
    seq_dim: StrictInt = 1  # the sequence dim of the sequence arguments and of the outputs
    state_arg: StrictStr  # the argument that carries the state into a step
    state_output: StrictInt  # the output element that is the state after a step
    final_state_flag: StrictStr | None = None  # the argument asking the function to return its final state


class FunctionRaw(Strict):
    """Module-level functions a host's forward calls, under one name: whichever the call runs."""

    names: list[StrictStr]
    words: StrictStr
    route: RouteRaw | None = None


AttentionImpl = Literal["eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"]


class LoadsRaw(Strict):
    model_types: list[StrictStr]
    classes: list[StrictStr]
    # the attention implementations the model class accepts (attn_implementation=...); when not
    # given, the generated tests read them from the class (_supports_sdpa, _supports_flex_attn)
    attention: list[AttentionImpl] | None = None


class ImagesRaw(Strict):
    """How the generated tests draw image inputs: how many images per prompt and their pixel sizes."""

    count: list[StrictInt]
    sizes: list[tuple[StrictInt, StrictInt]]


class ProcessorRaw(Strict):
    """A processor built locally for the tiny models: no hub, no torchvision."""

    cls: StrictStr = Field(alias="class")
    image_processor: StrictStr
    image_processor_config: dict[StrictStr, Any] = {}
    tokens: list[StrictStr] = Field(default=[], description="special tokens given the ids after [PAD] [UNK] [BOS] [EOS], in order")


class TinyLoadRaw(Strict):
    """A second tiny load of the same family: the multimodal wrapper of a text model (Qwen3.5's
    Qwen3_5ForConditionalGeneration around Qwen3_5ForCausalLM's text model). The text config is
    the family's drawn tiny config (under text_config); ``config`` and ``draw`` add the rest."""

    model_class: StrictStr
    config_class: StrictStr
    config: dict[StrictStr, Any] = {}
    draw: dict[StrictStr, list[Scalar | list[Scalar]] | StrictStr] = {}
    processor: ProcessorRaw
    images: ImagesRaw
    examples: StrictInt = 6


class TinyRaw(Strict):
    model_class: StrictStr
    config_class: StrictStr
    config: dict[StrictStr, Any] = {}
    draw: dict[StrictStr, list[Scalar | list[Scalar]] | StrictStr] = {}
    batch: tuple[StrictInt, StrictInt] = (1, 3)
    seq: tuple[StrictInt, StrictInt] = (1, 8)
    examples: StrictInt = 12
    # the experts implementations (transformers' experts interface) the generated tests run under
    experts: list[StrictStr] = []
    processor: ProcessorRaw | None = None
    images: ImagesRaw | None = None
    image_text: TinyLoadRaw | None = None


class CheckpointRaw(Strict):
    name: StrictStr
    config: dict[StrictStr, Any]


class NoteRaw(Strict):
    title: StrictStr
    body: StrictStr
    # the load its examples run on: a family with a tiny.image_text load runs an image-text note there
    load: Literal["text-generation", "image-text-to-text"] | None = None


class SharedNoteRaw(Strict):
    """A reference to a group of notes written once in specs/_notes.yaml."""

    shared: StrictStr


class UnavailableRaw(Strict):
    """A config entry no config value answers: reading it raises Unavailable with this reason."""

    unavailable: StrictStr


class DiagramRaw(Strict):
    """How the page draws the family (optional): each list names standard parts, in order.

    ``text``: the path of the tokens (default embed_tokens, layers, norm, lm_head); ``block``: one
    block of ``layers`` (default input_layernorm, mixer, add, post_attention_layernorm, mlp, add,
    where ``mixer`` stands for the block's mixer hosts of its kind and ``add`` for a residual add);
    ``vision`` and ``vision_block`` the same for the vision encoder, when the family has one.
    """

    text: list[StrictStr] | None = None
    block: list[StrictStr] | None = None
    vision: list[StrictStr] | None = None
    vision_block: list[StrictStr] | None = None


class IncludeRaw(Strict):
    """A part a family includes (``specs/parts/<part>.yaml``), with its class map."""

    part: StrictStr
    classes: dict[StrictStr, StrictStr] = Field(default={}, description="each class name the part uses → this family's class")


class PartRaw(Strict):
    """A shared fragment of specs (``specs/parts/<part>.yaml``): hosts, renames, config and
    functions written once for the families that include it. Its host classes are names the
    including family maps to its own (``classes``). A part is no family: nothing is generated for it."""

    part: StrictStr
    about: StrictStr | None = None
    classes: list[StrictStr] = []
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = {}
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat | UnavailableRaw] = {}
    functions: dict[StrictStr, FunctionRaw] = {}
    hosts: dict[StrictStr, HostRaw] = {}


class FamilyRaw(Strict):
    family: StrictStr
    # one base, or several merged left to right (a later base overrides an earlier one; this file, all)
    extends: StrictStr | list[StrictStr] | None = None
    # the parts this family is made of besides its own file (not inherited by families that extend it)
    include: list[IncludeRaw] = []
    title: StrictStr | None = None
    lines: list[StrictStr] | None = None
    summary: StrictStr | None = None
    traits: list[StrictStr] | None = None
    loads: LoadsRaw | None = None
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = {}
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat | UnavailableRaw] = {}
    functions: dict[StrictStr, FunctionRaw] = {}
    hosts: dict[StrictStr, HostRaw] = {}
    tiny: TinyRaw | None = None
    checkpoints: list[CheckpointRaw] = []
    notes: list[NoteRaw | SharedNoteRaw] = []
    docstring: StrictStr | None = None
    diagram: DiagramRaw | None = None
