"""What the lower layers use of the objects above them, as Protocols: the wrapped model as a trace, its
installers and the input checks see it, a trace as the edit checks see it, and a value handle as the
edit checks see it.

The tracer layer (``trace``, ``installers``, ``validate``) and ``inputs`` annotate against these, not
against :class:`nnatlas.AtlasModel` or :class:`nnatlas.tree.values.Value`, so no module imports one above its
own layer, not even for a type checker. Every member here is one the wrapped model (value, trace)
really has; mypy checks that wherever one is passed down.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from ..spec import Family, HostSpec, ValueSpec


class WrappedModel(Protocol):
    """A transformers model under its family's names, as a trace and its inputs use it."""

    @property
    def _module(self) -> torch.nn.Module: ...  # the transformers model

    @property
    def _family(self) -> Family: ...

    @property
    def _lock(self) -> threading.RLock: ...  # one per transformers model: one trace of it at a time

    @property
    def _tracer(self) -> object | None: ...  # the trace open on it (set by the trace itself)

    @property
    def config(self) -> Any: ...

    @property
    def normalized_config(self) -> dict[str, Any]: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def processor(self) -> Any: ...

    def _kernel_route(self) -> str | None: ...  # "torch" when recurrent kernels run token by token

    def _routed_modules(self) -> list[tuple[torch.nn.Module, str]]: ...  # modules with a routable function group


class TraceState(Protocol):
    """A trace as the edit checks see it: its inputs and its generation steps."""

    @property
    def inputs(self) -> Mapping[str, Any]: ...

    @property
    def steps(self) -> int | None: ...


class ValueHost(Protocol):
    """The host of a value handle (:class:`nnatlas.tree.hosts.Host`): its model and the specs that apply there."""

    @property
    def _model(self) -> WrappedModel: ...

    def _specs(self) -> list[HostSpec]: ...


class EditedValue(Protocol):
    """A value handle (:class:`nnatlas.tree.values.Value`) as an edit of it is checked."""

    @property
    def label(self) -> str: ...

    @property
    def _spec(self) -> ValueSpec | None: ...

    @property
    def _extra(self) -> tuple[Any, ...]: ...

    @property
    def _host(self) -> ValueHost: ...
