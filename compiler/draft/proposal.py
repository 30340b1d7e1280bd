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
    cls: str | None = None  # this kind's class, when the kinds' classes at the host differ
    dims: dict[str, str] = field(default_factory=dict)  # this kind's own sizes (dim -> config entry)


@dataclass
class Host:
    path: str
    cls: str | None  # None: each kind says its own
    values: dict[str, Value] = field(default_factory=dict)
    identities: list[Identity] = field(default_factory=list)
    kinds: dict[str, Kind] = field(default_factory=dict)
    stream: str | None = None
    dims: dict[str, str] = field(default_factory=dict)
    sure: str = ""
    kind: str | None = None  # the one kind of block this host is on (a child only that kind's blocks have)


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
    # while the matcher walks one kind's block: (kind, its when), and each kind's hosts, merged by merge_kinds
    kind: tuple[str, str] | None = None
    # while it walks the MLP of a block whose MLP has a kind of its own (the MLP host path, kind, its when): the
    # hosts at and under that path take that kind, not the block's
    sub_kind: tuple[str, str, str] | None = None
    per_kind: dict[str, dict[str, Host]] = field(default_factory=dict)
    whens: dict[str, str] = field(default_factory=dict)
    kind_dims: dict[str, dict[str, str]] = field(default_factory=dict)  # kind -> its own sizes (per-layer overrides)

    def host(self, path: str, cls: str, sure: str = "") -> Host:
        hosts = self.hosts
        kind = self.kind
        if self.sub_kind is not None and (path == self.sub_kind[0] or path.startswith(self.sub_kind[0] + ".")):
            kind = self.sub_kind[1:]
        if kind is not None:
            self.whens[kind[0]] = kind[1]
            hosts = self.per_kind.setdefault(kind[0], {})
        if path not in hosts:
            hosts[path] = Host(path, cls, sure=sure)
        return hosts[path]

    def merge_kinds(self) -> None:
        """Each kind's hosts as one host per path: what every kind at a path reads alike on the host, the rest (and
        each kind's class, when their classes differ) under the host's kinds; a path only one kind's blocks have is
        that kind's host (``kind:``)."""
        kinds = list(self.per_kind)
        paths = list(dict.fromkeys(p for k in kinds for p in self.per_kind[k]))
        for path in paths:
            hs = [(k, self.per_kind[k][path]) for k in kinds if path in self.per_kind[k]]
            first = hs[0][1]
            classes = list(dict.fromkeys(h.cls for _, h in hs))
            host = self.hosts.get(path) or Host(path, first.cls, sure=first.sure)
            self.hosts[path] = host
            host.stream = host.stream or first.stream
            host.dims = host.dims or first.dims
            if len(hs) == 1:
                host.values.update(first.values)
                host.identities.extend(first.identities)
                if len(kinds) > 1:
                    host.kind = hs[0][0]
                continue
            if len(classes) > 1:
                host.cls = None
                host.sure = "one class per kind of block: each kind says its own"

            def key(v: Value) -> tuple[object, ...]:
                return (v.read, v.view, v.needs, v.derived, v.missing, v.edit, v.copy)
            common = {n: v for n, v in first.values.items()
                      if all(n in h.values and key(h.values[n]) == key(v) for _, h in hs)}
            checks = [x for x in first.identities if all(any(y.check == x.check for y in h.identities) for _, h in hs)]
            host.values.update(common)
            host.identities.extend(checks)
            shared = {x.check for x in checks}
            for k, h in hs:
                kk = host.kinds.setdefault(k, Kind(k, self.whens[k]))
                kk.cls = h.cls if len(classes) > 1 else None
                kk.values.update({n: v for n, v in h.values.items() if n not in common})
                kk.identities.extend(x for x in h.identities if x.check not in shared
                                     and all(y.check != x.check for y in kk.identities))
        self.per_kind.clear()

    def values(self) -> dict[str, set[str]]:
        """host path -> its standard value names (missing ones included): what tests compare."""
        return {p: set(h.values) for p, h in self.hosts.items()}
