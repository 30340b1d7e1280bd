"""A family's hosts and their values: host paths, kinds and their whens, streams and dims, each value's read
point, derivation, view, conditions and edit, checked against the vocabulary and built into ``HostIR``s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from nnatlas.spec import CALL_DIMS, INPUT_DIMS, Condition, ReadPoint

from ..errors import suggest
from ..language import expr, names, readpoint
from ..language.ir import HostIR, IdentityIR, ValueIR
from ..language.models import HostRaw, IdentityRaw, ValueRaw
from ..language.yamlpos import Path as DataPath
from .context import FamilyContext
from .sources import VOCABULARY

_EDITS = ("logits", "later", "none")
HOST_PATH = re.compile(r"model|[a-z_][a-z0-9_]*(\[i\])?(\.[a-z_][a-z0-9_]*(\[(i|[0-9]{1,4})\])?)*")
# a list item of a block (layers[i].self_attn[0]: LongCat-Flash's two attentions a block): a fixed index, below [i]
_LIST_ITEM = re.compile(r"\[([0-9]+)\]")


class HostValues(FamilyContext):
    """The hosts of a family and the values each serves."""

    def host(self, path: str, h: HostRaw, config: list[tuple[str, expr.Compiled, str]]) -> list[HostIR]:
        at = ("hosts", path)
        if not HOST_PATH.fullmatch(path):
            self.err(at, f"host path '{path}' is not 'model' or a dotted path like layers[i].self_attn (or "
                     "layers[i].self_attn[0], an item of a list child of the block)", key=True)
            return []
        if (m := _LIST_ITEM.search(path)) and "[i]" not in path[:m.start()]:
            self.err(at, f"host '{path}': a list item [{m.group(1)}] is an item of a list child inside a block "
                     "(layers[i].self_attn[0]); a stack of blocks is indexed [i]", key=True)
            return []
        if bad := names.path_problem(path, "host path"):
            self.err(at, bad, key=True)
            return []
        if path != "model" and path.split(".")[0].removesuffix("[i]") not in self.raw.rename:
            first = path.split(".")[0].removesuffix("[i]")
            self.err(at, f"host '{path}': '{first}' is not in rename (say which native module it is)" + suggest(first, self.raw.rename), key=True)
        if h.cls is None and not (h.kinds and all(k.cls is not None for k in h.kinds.values())):
            self.err(at, f"host '{path}': 'class' (the native class) is required" +
                     (" (here, or on every one of its kinds)" if h.kinds else ""), key=True)
        common_v: list[tuple[DataPath, str, Any]] = [((*at, "values", k), k, v) for k, v in h.values.items()]
        common_i: list[tuple[DataPath, Any]] = [((*at, "identities", k), x) for k, x in enumerate(h.identities)]
        if h.kind is not None:
            for other in ("when", "kinds"):
                if getattr(h, other):
                    self.err((*at, "kind"), f"host '{path}': give either 'kind' (the blocks of a kind of an enclosing "
                             f"host) or '{other}'")
                    return []
            when_text = self.enclosing_kind_when(path, h.kind, (*at, "kind"))
            if when_text is None:
                return []
            built = self.host_kind(path, h, config, when_text, (*at, "kind"), common_v, common_i, h.kind)
            return [built] if built is not None else []
        if not h.kinds:
            built = self.host_kind(path, h, config, h.when, (*at, "when"), common_v, common_i, None)
            return [built] if built is not None else []
        if h.when is not None:
            self.err((*at, "when"), f"host '{path}': give either 'when' or 'kinds' (each kind has its own when)")
        out = []
        for kname, kind in h.kinds.items():
            kat = (*at, "kinds", kname)
            if not re.fullmatch(r"[a-z][a-z0-9_]*", kname) or not names.is_name(kname):
                self.err(kat, f"kind '{kname}' must be a lowercase name (model.{kname}_layers lists its blocks)", key=True)
            when_text = kind.when if kind.when is not None else self.enclosing_kind_when(path, kname, kat)
            if when_text is None:
                continue
            dropped = {k for k, v in kind.values.items() if v is None}
            for vname, v in kind.values.items():
                if v is not None and h.values.get(vname) is not None:
                    hfile, hline, _ = self.at((*at, "values", vname))
                    self.err((*kat, "values", vname),
                             f"kind '{kname}' of host '{path}': value '{vname}' is read on the host too "
                             f"({hfile}:{hline}); a kind's read does not replace the host's: set '{vname}: null' on the "
                             f"host and give every kind its own read, or drop it here", key=True)
            kv = [x for x in common_v if x[1] not in dropped] + [((*kat, "values", k), k, v) for k, v in kind.values.items()]
            ki = common_i + [((*kat, "identities", k), x) for k, x in enumerate(kind.identities)]
            own = {f: getattr(kind, f) for f in ("cls", "stream", "needs", "reached") if getattr(kind, f) is not None}
            eff = h.model_copy(update={**own, "dims": {**h.dims, **kind.dims}}) if own or kind.dims else h
            built = self.host_kind(path, eff, config, when_text, (*kat, "when") if kind.when is not None else kat,
                                   kv, ki, kname, own=kat,
                                   own_keys={*("class" if f == "cls" else f for f in own), *(f"dims.{d}" for d in kind.dims)})
            if built is not None:
                out.append(built)
        return out

    def enclosing_kind_when(self, path: str, kname: str, at: DataPath) -> str | None:
        """The when of kind ``kname`` of the nearest host enclosing ``path`` that declares it (following a
        when left out there too); None, with the problem said at ``at``, when none does."""
        p, seen = path, []
        while "." in p:
            p = p.rsplit(".", 1)[0]
            host = self.raw.hosts.get(p)
            if host is None:
                continue
            seen += [k for k in host.kinds if k not in seen]
            kind = host.kinds.get(kname)
            if kind is not None:
                return kind.when if kind.when is not None else self.enclosing_kind_when(p, kname, at)
        self.err(at, f"host '{path}': kind '{kname}' has no when, and no host enclosing it declares a kind "
                 f"'{kname}' to take it from (" + (f"their kinds: {', '.join(seen)}" if seen else "none declares kinds")
                 + "): give when: here, or declare the kind on the host whose blocks it selects (layers[i])"
                 + suggest(kname, seen), key=at[-1] != "kind")
        return None

    def check_kind_whens(self, hosts: tuple[HostIR, ...]) -> None:
        """One kind name selects one set of blocks (model.<kind>_layers lists them): the same kind on
        two host paths with two different whens is an error at the second."""
        first: dict[str, HostIR] = {}
        for h in hosts:
            if h.kind is None or h.when_text is None:
                continue
            prev = first.setdefault(h.kind, h)
            if prev.when_text != h.when_text:
                file, line, col = h.at or (self.src.rel, 1, 1)
                pfile, pline, _ = prev.at or (self.src.rel, 1, 1)
                self.found.add(file, (line, col), (
                    f"{h.path}: kind '{h.kind}' selects the blocks where {h.when_text}, but on {prev.path} "
                    f"({pfile}:{pline}) kind '{h.kind}' selects those where {prev.when_text}: model.{h.kind}_layers "
                    f"lists one set of blocks. Give the kind one when (leave when out below {prev.path} to take its), "
                    "or name the kinds apart"))
                self.ok = False

    def host_kind(self, path: str, h: HostRaw, config: list[tuple[str, expr.Compiled, str]], when_text: str | None,
                  when_at: DataPath, value_items: Sequence[tuple[DataPath, str, Any]],
                  identity_items: Sequence[tuple[DataPath, Any]], kind: str | None, own: DataPath | None = None,
                  own_keys: set[str] | frozenset[str] = frozenset()) -> HostIR | None:
        at = ("hosts", path)

        def where(key: str) -> DataPath:
            """The position of a host key: on the kind when the kind gives it, else on the host."""
            return (*own, *key.split(".")) if own is not None and key in own_keys else (*at, *key.split("."))

        when = None
        if when_text is not None:
            try:
                when = expr.compile_when(when_text)
            except expr.ExprError as e:
                self.err(when_at, f"when: {e}", col=e.col)
        table = self.vocab.values
        if h.stream is not None:
            if h.stream not in self.vocab.streams:
                self.err(where("stream"), f"unknown stream '{h.stream}'" + suggest(h.stream, self.vocab.streams))
            else:
                table = {**table, **self.vocab.streams[h.stream]}
        config_names = {k for k, _, _ in config}
        for dim, entry in h.dims.items():
            if dim not in self.vocab.dims:
                self.err(where(f"dims.{dim}"), f"host '{path}': unknown dim '{dim}'" + suggest(dim, self.vocab.dims), key=True)
            if entry not in config_names:
                self.err(where(f"dims.{dim}"), f"host '{path}': dim {dim} sized by '{entry}', which is not a config entry"
                         + suggest(entry, config_names))
        values: list[ValueIR] = []
        for vat, vname, v in value_items:
            if v is None:
                continue
            if vname not in table:
                section = f"streams.{h.stream}: (this host's stream) or values:" if h.stream else "values:"
                near = suggest(vname, table)
                self.err(vat, f"unknown value '{vname}'" + (near + " " if near else ". ") + "A new standard value is declared "
                         f"once in specs/{VOCABULARY}, under {section}, with its layout and its one-line meaning",
                         key=True)
                continue
            value = v if isinstance(v, ValueRaw) else ValueRaw(read=v)
            defaults = {k: getattr(h, k) for k in ("needs", "reached") if getattr(h, k) is not None and getattr(value, k) is None}
            if defaults:
                value = value.model_copy(update=defaults)
            built = self.value(vname, value, table[vname], vat, config_names)
            depth = 0 if path == "model" else len(path.split("."))
            if built is not None and built.read is not None and built.read.up > depth:
                self.err(vat, f"{vname}: '{built.read.text}' climbs {built.read.up} host(s) up, but {path} has "
                         f"{'no parent' if not depth else f'only {depth} above it'}", key=isinstance(v, ValueRaw))
                continue
            if built is not None:
                unsized = [d for d in built.layout.dims if d not in INPUT_DIMS and d not in config_names
                           and d not in h.dims] if built.missing is None else []
                if unsized:
                    self.err(vat, f"{vname}: its layout {built.layout.name} has "
                             + ", ".join(repr(d) for d in unsized) + ", which is not a config entry of this family "
                             "nor sized by the call's inputs: add it under config: (the config attribute that sizes "
                             "it), or size it on this host with dims:", key=isinstance(v, ValueRaw))
                values.append(dataclasses.replace(built, at=self.at((*vat, "read"))))
        names = [x.name for x in values]
        root_names = self.root_value_names()
        for x in values:
            for dep in x.derived.names if x.derived else ():
                if dep in config_names or (dep.startswith("model.") and dep[len("model."):] in root_names):
                    continue
                if dep not in names:
                    self.err((*at, "values", x.name, "derived"), f"{x.name}: derived from '{dep}', which this host does not have" + suggest(dep, names))
        identities = []
        for iat, ident in identity_items:
            item = ident if isinstance(ident, IdentityRaw) else IdentityRaw(check=ident)
            try:
                op, lhs, rhs = expr.compile_identity(item.check)
            except expr.ExprError as e:
                self.err(iat if isinstance(ident, str) else (*iat, "check"), f"identity: {e}", col=e.col)
                continue
            identities.append(IdentityIR(item.check, op, lhs, rhs, float(item.atol), float(item.rtol), at=self.at(iat)))
        return HostIR(path, h.cls or "", when, when_text, tuple(values), tuple(identities), dims=tuple(h.dims.items()),
                      at=self.at(where("class")),
                      kind=kind)

    def value(self, name: str, v: ValueRaw, vocab_value: Any, at: DataPath, config_names: set[str]) -> ValueIR | None:
        if v.missing is not None:
            if v.read is not None or v.derived is not None or v.view is not None or v.needs is not None:
                self.err(at, f"{name}: a missing value has only its reason ('missing'), no read, derived, view or needs", key=True)
                return None
            if not v.missing.strip():
                self.err((*at, "missing"), f"{name}: say why the family has no {name}")
                return None
            lay = self.layouts.get(vocab_value.layout)
            if lay is None:
                return None
            return ValueIR(name, lay, vocab_value.meaning, None, None, None, (), None, None,
                           missing=" ".join(v.missing.split()))
        if (v.read is None) == (v.derived is None):
            self.err(at, f"{name}: give exactly one of 'read' (a read point), 'derived' (an expression) or 'missing' "
                     "(why the family has none)", key=True)
            return None
        read = derived = None
        try:
            if v.read is not None:
                read = readpoint.parse(v.read, self.groups)
            else:
                derived = expr.compile_derived(v.derived or "")
        except expr.ExprError as e:
            sub = () if isinstance(self.merged_value(at), str) else ("read" if v.read is not None else "derived",)
            self.err((*at, *sub), f"{name}: {e}", col=e.col)
            return None
        if read is not None:
            for part in (*read.module, *(a for a in read.access if isinstance(a, str)), read.param or ""):
                if part.startswith("__"):
                    sub = () if isinstance(self.merged_value(at), str) else ("read",)
                    self.err((*at, *sub), f"{name}: '{part}' starts with '__' (reserved for Python's own names)")
                    return None
        view: list[tuple[str, tuple[Any, ...]]] = []
        if v.view is not None:
            try:
                view = expr.parse_view(v.view)
            except expr.ExprError as e:
                self.err((*at, "view"), f"{name}: view: {e}", col=e.col)
            for _, args in view:
                for a in _flat(args):
                    if isinstance(a, str) and a not in config_names and a not in CALL_DIMS:
                        self.err((*at, "view"), f"{name}: view names '{a}', which is not a config entry nor a "
                                 f"call dim ({', '.join(CALL_DIMS)})" + suggest(a, [*config_names, *CALL_DIMS]))
        needs = reached = None
        for field_name, kind in (("needs", "load"), ("reached", "call")):
            cname = getattr(v, field_name)
            if cname is None:
                continue
            cond = self.vocab.conditions.get(cname)
            if cond is None:
                self.err((*at, field_name), f"{name}: unknown condition '{cname}'" + suggest(cname, self.vocab.conditions))
            elif cond.kind != kind:
                self.err((*at, field_name), f"{name}: '{cname}' is a {cond.kind} condition; '{field_name}' takes a {kind} condition")
            elif kind == "load":
                needs = Condition(cname, cond.says, cond.fix, cond.attribute, tuple(cond.values), cond.kind, cond.never)
            else:
                reached = Condition(cname, cond.says, cond.fix, kind=cond.kind)
        if v.edit not in _EDITS:
            self.err((*at, "edit"), f"{name}: edit is one of {', '.join(_EDITS)} (what an edit of the value reaches)")
        if v.recompute is not None:
            read = self.recompute(name, v, read, needs, at)
        layout = self.layouts.get(vocab_value.layout)
        if layout is None:
            return None
        if vocab_value.optional and not layout.optional:
            layout = dataclasses.replace(layout, optional=True)
        if v.readonly is not None and v.derived is not None:
            self.err((*at, "readonly"), f"{name}: a derived value is read-only already")
        return ValueIR(name, layout, vocab_value.meaning, read, derived, v.derived, tuple(view), v.view, needs,
                       reached=reached, readonly_why=v.readonly, edit=v.edit, copy=v.served_copy)

    def recompute(self, name: str, v: ValueRaw, read: ReadPoint | None, needs: Condition | None,
                  at: DataPath) -> ReadPoint | None:
        """``recompute: sdpa``: the read, marked, when it is eager's softmax in the host's own forward."""
        where = (*at, "recompute")
        if v.recompute != "sdpa":
            self.err(where, f"{name}: recompute takes 'sdpa' (the load under which the host's forward calls "
                     f"scaled_dot_product_attention in place of eager's softmax), not {v.recompute!r}")
        elif read is None or read.kind != "op" or read.op != "softmax" or read.call is not None or \
                (read.side, read.access) not in (("input", (0,)), ("output", ())):
            inside = read is not None and read.kind == "op" and read.call is not None
            self.err(where, f"{name}: recompute: sdpa stands for eager's softmax in the host's own forward: read "
                     "op:softmax.input[0] (the scores) or op:softmax.output (the probabilities)"
                     + ("; a read inside eager attention (call:attention > op:...) is recomputed without it"
                        if inside else ""))
        elif needs is None or needs.name != "eager":
            self.err(where, f"{name}: recompute: sdpa recomputes what only eager attention forms: the value "
                     "needs eager ('needs: eager')")
        else:
            return dataclasses.replace(read, recompute="sdpa")
        return read

    def root_value_names(self) -> set[str]:
        root = self.raw.hosts.get("model")
        return {k for k, v in root.values.items() if v is not None} if root else set()

    def merged_value(self, path: DataPath) -> Any:
        node: Any = self.merged.data
        for p in path:
            node = node[p]
        return node



def _flat(args: Any) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, tuple) else [a])
    return out
