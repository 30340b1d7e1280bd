"""What a type checker sees of a wrapped model: the bases of the generated family classes.

``nnatlas.families.<family>`` declares one class per host path (``Model``, ``Layer``,
``LayerSelfAttn`` …) whose annotations name every standard value and child host. At run time
those names are served by :class:`nnatlas.tree.hosts.Host`'s lookup, as on any host; for a type
checker the bases below hide that lookup, so ``model.layers[0].self_attn.attention_queries`` is a
``Value`` and a misspelt name is an error. A value is annotated :class:`ValueSlot`: reading it gives
a ``Value``, and assigning an edit to it (a tensor, a number, a function of the value, another
value) type-checks as the runtime takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import torch

from ..model import AtlasModel
from ..tree.hosts import Host
from ..tree.values import Value

Edit = Value | torch.Tensor | float | int | Callable[[Any], Any]  # what an assignment to a value may be


class ValueSlot:
    """The annotation of a standard value on a generated host class (only ever an annotation)."""

    @overload
    def __get__(self, host: None, owner: type[Any]) -> ValueSlot: ...
    @overload
    def __get__(self, host: Host, owner: type[Any]) -> Value: ...
    def __get__(self, host: Host | None, owner: type[Any]) -> Value | ValueSlot:
        raise TypeError("ValueSlot is an annotation of a generated host class, never an attribute")

    def __set__(self, host: Host, value: Edit) -> None:
        raise TypeError("ValueSlot is an annotation of a generated host class, never an attribute")


class TypedHost(Host):
    """A generated host class's base: only its declared names (and the boundaries) type-check."""

    __getattr__: None  # type: ignore[assignment,misc]  # the lookup serves at run time; a checker sees none
    input: ValueSlot
    inputs: ValueSlot
    output: ValueSlot


class TypedModel(AtlasModel):
    """A generated ``Model`` class's base: the model facade, with only its declared names."""

    __getattr__: None  # type: ignore[assignment,misc]
    input: ValueSlot
    inputs: ValueSlot
    output: ValueSlot
