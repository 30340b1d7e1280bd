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


class ConditionRaw(Strict):
    says: StrictStr
    fix: StrictStr
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
    reached: StrictStr | None = None
    readonly: StrictStr | None = Field(default=None, description="why an edit here would reach nothing: the value is then read-only")


class IdentityRaw(Strict):
    check: StrictStr
    atol: StrictFloat | StrictInt = 0.0
    rtol: StrictFloat | StrictInt = 0.0


class HostRaw(Strict):
    cls: StrictStr | None = Field(default=None, alias="class")
    when: StrictStr | None = None
    stream: StrictStr | None = None
    needs: StrictStr | None = Field(default=None, description="the load condition of every value here, unless a value says its own")
    reached: StrictStr | None = Field(default=None, description="the call condition of every value here, unless a value says its own")
    values: dict[StrictStr, StrictStr | ValueRaw | None] = {}
    identities: list[StrictStr | IdentityRaw] = []


class LoadsRaw(Strict):
    model_types: list[StrictStr]
    classes: list[StrictStr]


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


class TinyRaw(Strict):
    model_class: StrictStr
    config_class: StrictStr
    config: dict[StrictStr, Any] = {}
    draw: dict[StrictStr, list[Scalar | list[Scalar]] | StrictStr] = {}
    batch: tuple[StrictInt, StrictInt] = (1, 3)
    seq: tuple[StrictInt, StrictInt] = (1, 8)
    examples: StrictInt = 12
    processor: ProcessorRaw | None = None
    images: ImagesRaw | None = None


class CheckpointRaw(Strict):
    name: StrictStr
    config: dict[StrictStr, Any]


class NoteRaw(Strict):
    title: StrictStr
    body: StrictStr


class SharedNoteRaw(Strict):
    """A reference to a group of notes written once in specs/_notes.yaml."""

    shared: StrictStr


class UnavailableRaw(Strict):
    """A config entry no config value answers: reading it raises Unavailable with this reason."""

    unavailable: StrictStr


class FamilyRaw(Strict):
    family: StrictStr
    extends: StrictStr | None = None
    title: StrictStr | None = None
    lines: list[StrictStr] | None = None
    summary: StrictStr | None = None
    traits: list[StrictStr] | None = None
    loads: LoadsRaw | None = None
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = {}
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat | UnavailableRaw] = {}
    hosts: dict[StrictStr, HostRaw] = {}
    tiny: TinyRaw | None = None
    checkpoints: list[CheckpointRaw] = []
    notes: list[NoteRaw | SharedNoteRaw] = []
    docstring: StrictStr | None = None
