"""What the matcher proposes and the writer writes: plain data, each entry with how sure the
drafter is (``sure``: a short comment the spec carries beside it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .tiny import Tiny


@dataclass
class Value:
    read: str | None = None
    view: str | None = None
    needs: str | None = None
    derived: str | None = None
    missing: str | None = None
    edit: str | None = None
    copy: bool = False
    sure: str = ""


@dataclass
class Identity:
    check: str
    atol: float = 0.0
    rtol: float = 0.0
    sure: str = ""


@dataclass
class Kind:
    name: str
    when: str
    values: dict[str, Value] = field(default_factory=dict)  # what only this kind's blocks have
    identities: list[Identity] = field(default_factory=list)


@dataclass
class Host:
    path: str
    cls: str
    values: dict[str, Value] = field(default_factory=dict)
    identities: list[Identity] = field(default_factory=list)
    kinds: dict[str, Kind] = field(default_factory=dict)
    stream: str | None = None
    dims: dict[str, str] = field(default_factory=dict)
    sure: str = ""


@dataclass
class Function:
    names: list[str]
    words: str
    route: dict[str, Any] | None = None


@dataclass
class Proposal:
    family: str
    model_type: str
    model_class: str
    title: str
    tiny: Tiny
    rename: dict[str, str] = field(default_factory=dict)
    rename_sure: dict[str, str] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    traits: list[str] = field(default_factory=list)
    todos: list[str] = field(default_factory=list)  # modules (and facts) the drafter could not map
    experts: list[str] = field(default_factory=list)  # tiny.experts
    extends: str | None = None

    def host(self, path: str, cls: str, sure: str = "") -> Host:
        if path not in self.hosts:
            self.hosts[path] = Host(path, cls, sure=sure)
        return self.hosts[path]

    def values(self) -> dict[str, set[str]]:
        """host path -> its standard value names (missing ones included): what tests compare."""
        return {p: set(h.values) for p, h in self.hosts.items()}
