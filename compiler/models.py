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
    optional: StrictBool = False  # the value may be None ("State | None")


class ConditionRaw(Strict):
    says: StrictStr
    fix: StrictStr


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


class CheckpointRaw(Strict):
    name: StrictStr
    config: dict[StrictStr, Any]


class NoteRaw(Strict):
    title: StrictStr
    body: StrictStr


class FamilyRaw(Strict):
    family: StrictStr
    extends: StrictStr | None = None
    title: StrictStr | None = None
    lines: list[StrictStr] | None = None
    summary: StrictStr | None = None
    traits: list[StrictStr] | None = None
    loads: LoadsRaw | None = None
    rename: dict[StrictStr, StrictStr | list[StrictStr]] = {}
    config: dict[StrictStr, StrictStr | StrictInt | StrictFloat] = {}
    functions: dict[StrictStr, FunctionRaw] = {}
    hosts: dict[StrictStr, HostRaw] = {}
    tiny: TinyRaw | None = None
    checkpoints: list[CheckpointRaw] = []
    notes: list[NoteRaw] = []
    docstring: StrictStr | None = None
