"""The spec files as pydantic models: unknown keys are errors, every field typed.

A family spec may ``extends:`` another, so every field of a family is optional here; the
resolver checks what a complete family needs after the merge.
"""

from __future__ import annotations

from typing import Any

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
    # a config attribute of the module the value is read in (or of the model) and the values that
    # serve it: ``attribute: _experts_implementation, values: [grouped_mm, batched_mm]``
    attribute: StrictStr | None = None
    values: list[StrictStr] = []


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


class IdentityRaw(Strict):
    check: StrictStr
    atol: StrictFloat | StrictInt = 0.0
    rtol: StrictFloat | StrictInt = 0.0


class HostRaw(Strict):
    cls: StrictStr | None = Field(default=None, alias="class")
    when: StrictStr | None = None
    stream: StrictStr | None = None
    # dims this host's values are sized by another config entry: {intermediate_size: shared_expert_intermediate_size}
    dims: dict[StrictStr, StrictStr] = {}
    values: dict[StrictStr, StrictStr | ValueRaw | None] = {}
    identities: list[StrictStr | IdentityRaw] = []


class LoadsRaw(Strict):
    model_types: list[StrictStr]
    classes: list[StrictStr]


class TinyRaw(Strict):
    model_class: StrictStr
    config_class: StrictStr
    config: dict[StrictStr, Any] = {}
    draw: dict[StrictStr, list[Scalar] | StrictStr] = {}
    batch: tuple[StrictInt, StrictInt] = (1, 3)
    seq: tuple[StrictInt, StrictInt] = (1, 8)
    examples: StrictInt = 12
    # the experts implementations (transformers' experts interface) the generated tests run under
    experts: list[StrictStr] = []


class CheckpointRaw(Strict):
    name: StrictStr
    config: dict[StrictStr, Any]


class NoteRaw(Strict):
    title: StrictStr
    body: StrictStr


class FamilyRaw(Strict):
    family: StrictStr
    # one base, or several merged left to right (a later base overrides an earlier one; this file, all)
    extends: StrictStr | list[StrictStr] | None = None
    title: StrictStr | None = None
    lines: list[StrictStr] | None = None
    summary: StrictStr | None = None
    traits: list[StrictStr] | None = None
    loads: LoadsRaw | None = None
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = {}
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat] = {}
    hosts: dict[StrictStr, HostRaw] = {}
    tiny: TinyRaw | None = None
    checkpoints: list[CheckpointRaw] = []
    notes: list[NoteRaw] = []
    docstring: StrictStr | None = None
