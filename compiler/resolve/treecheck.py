"""A family's spec against the module tree transformers builds, on the meta device.

Every rename target, host class, child module a value is read at (or whose forward, calls or
methods it reads), and child boundary an identity names is looked up in the real tree of the
family's tiny config (and of its image-text load) and of every recorded checkpoint, built on
``meta`` (no weights, well under a second each). Each miss is a problem at the spec line that
says it, naming the native path and the nearest names: a misspelt class or child fails
``make generate`` instead of the generated tests.

Run by ``compile.plan_printouts`` with the printouts (same inputs, same cache: a fresh printout
means its family passed this check); imports torch and transformers only when it runs.
"""

from __future__ import annotations

import copy
import re
import types
from collections.abc import Iterator
from typing import Any

from nnatlas.spec import pattern_of

from ..errors import Problem, suggest
from ..language.ir import At, FamilyIR
from .identities import term_exists


def _problem(at: At, message: str) -> Problem:
    file, line, col = at or ("?", 1, 1)
    return Problem(file, line, col, message)


def _adapter(f: FamilyIR, adapter_source: str) -> Any:
    module = types.ModuleType(f"nnatlas.families._check_{f.name}")
    exec(compile(adapter_source, f"<generated adapter {f.name}>", "exec"), module.__dict__)  # our own output
    return module


class _Checker:
    def __init__(self, f: FamilyIR, adapter: Any):
        self.f, self.family, self.tiny = f, adapter.FAMILY, adapter.TINY
        self.problems: dict[tuple[Any, ...], Problem] = {}  # one problem per spec item
        self.missing_rename: dict[str, str] = {}  # rename entry -> what is missing, from the first miss

    def add(self, item: tuple[Any, ...], at: At, message: str) -> None:
        self.problems.setdefault(item, _problem(at, message))

    # ---- the builds ----
    def builds(self) -> Iterator[tuple[str, Any]]:
        import torch
        import transformers

        from nnatlas.testing import suite as T

        transformers.logging.set_verbosity_error()  # config classes' notes on tiny configs are not the spec's problems
        import nnatlas

        def make(what: str, cls_name: str, config: Any) -> Any:
            cls = getattr(transformers, cls_name, None)
            if cls is None:
                self.add(("class", what), self.f.tiny_at, f"{what}: transformers has no class '{cls_name}'"
                         + suggest(cls_name, [n for n in dir(transformers) if n[:1].isupper()]))
                return None
            try:
                with torch.device("meta"):
                    return nnatlas.wrap(cls(config()), family=self.family)
            except Exception as e:  # noqa: BLE001 - reported as the spec's problem
                self.add(("build", what), self.f.tiny_at, f"{what}: {cls_name} does not build: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}")
                return None

        def tiny_config(variant: str | None = None) -> Any:
            t = self.tiny if variant is None else self.tiny[variant]
            cfg_cls = getattr(transformers, t["config_class"])
            return cfg_cls(**T.first_params_from(self.tiny, variant))

        for what, variant in (("the tiny model", None), ("the tiny image-text model", "image_text")):
            t = self.tiny if variant is None else self.tiny.get(variant)
            if not t:
                continue
            if getattr(transformers, t["config_class"], None) is None:
                self.add(("config", what), self.f.tiny_at, f"{what}: transformers has no config class "
                         f"'{t['config_class']}'" + suggest(t["config_class"], [n for n in dir(transformers)
                                                                               if n.endswith("Config")]))
                continue
            model = make(what, t["model_class"], lambda v=variant: tiny_config(v))
            if model is not None:
                yield what, model
        for ckpt in self.f.checkpoints:
            raw = copy.deepcopy(dict(ckpt.config))  # a config class may fix up its sub-configs in place
            model_type = raw.pop("model_type", None) or self.f.model_types[0]
            archs = [a for a in (raw.get("architectures") or []) if a in self.f.classes]
            what = f"checkpoint {ckpt.name}"
            model = make(what, archs[0] if archs else self.f.classes[0],
                         lambda mt=model_type, raw=raw: transformers.AutoConfig.for_model(mt, **raw))
            if model is not None:
                yield what, model

    # ---- the checks ----
    def run(self) -> list[Problem]:
        from nnatlas.tree import fit, introspect

        builds = list(self.builds())
        seen_hosts: set[int] = set()
        live_paths: set[str] = set()  # paths with a live module in some build (a kind may select none of them)
        parents_seen: set[str] = set()
        renamed: set[str] = set()
        for what, model in builds:
            self.renames(model, parents_seen, renamed)
            for k, (ir, spec) in enumerate(zip(self.f.hosts, self.family.hosts, strict=True)):
                for label, host in fit.hosts_at(model, ir.path):
                    if host is None:
                        continue
                    live_paths.add(ir.path)
                    applies = introspect.specs(host)
                    if spec not in applies:
                        continue
                    seen_hosts.add(k)
                    for m in fit.host_misfits(model, host, label, spec, self.model_classes):
                        self.misfit(k, ir, m, what)
                    self.identities(k, ir, spec, host, label, what)
        for std, at in self.f.rename_at:
            parent = std.rsplit(".", 1)[0] if "." in std else "model"
            if parent in parents_seen and std not in renamed:
                natives = dict(self.f.rename)[std]
                self.add(("rename", std), at, self.missing_rename.get(std, f"rename {std}: no module at "
                                                                      f"{' or '.join(natives)}"))
        bad = [std.replace("[i]", "") for kind, *rest in self.problems if kind == "rename" for std in rest]
        if builds:
            for k, ir in enumerate(self.f.hosts):
                if k not in seen_hosts and not any(ir.path.replace("[i]", "").startswith(b) for b in bad):
                    where = " or ".join(w for w, _ in builds)
                    if ir.when_text is not None and ir.path in live_paths:
                        self.add(("host", k), ir.at, f"{_host_words(ir)}: no block of {where} is one where "
                                 f"{ir.when_text}, so its class and reads are checked on none: draw a tiny config whose "
                                 "first draw has such a block (or record a checkpoint that has one)")
                        continue
                    self.add(("host", k), ir.at, f"{_host_words(ir)}: no module here in {where}"
                             + self.nearest_host(ir.path, builds))
        return sorted(self.problems.values())

    def renames(self, model: Any, parents_seen: set[str], renamed: set[str]) -> None:
        from nnatlas.tree import fit

        for std, natives in self.family.rename.items():
            for _, _, gap in fit.rename_places(model, std, tuple(natives)):
                parents_seen.add(std.rsplit(".", 1)[0] if "." in std else "model")
                if gap is None:
                    renamed.add(std)
                    break
                self.missing_rename.setdefault(std, (
                    f"rename {std}: {' or '.join(natives)}: {gap.at} ({gap.cls}) has no child module '{gap.part}'"
                    + fit.children_words(gap.children) + suggest(gap.part, list(gap.children))))

    @property
    def model_classes(self) -> tuple[str, ...]:
        """The classes accepted at the root besides the family's own: the tiny models' (a text model of a wrapper)."""
        return tuple(t["model_class"] for t in (self.tiny, self.tiny.get("image_text")) if t)

    def misfit(self, k: int, ir: Any, m: Any, what: str) -> None:
        """One misfit the runtime's walker found on host ``k`` of build ``what``, at its spec line, with the nearest
        names."""
        if m.kind == "class":
            self.add(("class", k), ir.at, f"{_host_words(ir)}: class {ir.cls}: the module here is {m.found} "
                     f"({m.label} of {what})")
            return
        if m.kind not in ("read", "method"):
            return  # a climb above the root is refused at resolve time
        v_ir = next(v for v in ir.values if v.name == m.value)
        gap = m.gap
        if m.kind == "method":
            msg = f"{gap.cls} has no method '{gap.part}'" + suggest(gap.part, list(gap.children))
        else:
            msg = _gap_words(gap, m.sibling, m.text)
        self.add(("value", k, m.value), v_ir.at, f"{_host_words(ir)}: {m.value}: '{m.text}': {msg} ({m.label} of {what})")

    def identities(self, k: int, ir: Any, spec: Any, host: Any, label: str, what: str) -> None:
        for i_ir, ident in zip(ir.identities, spec.identities, strict=True):
            for term in ident.terms:
                parts = term.split(".")
                if "[" in term or parts[0] == "model":
                    continue
                if parts[-1] not in ("input", "output"):
                    msg = self.tensor(ir, host, term)
                elif len(parts) < 2:
                    continue
                else:
                    msg = self.walk(host, tuple(parts[:-1]), host, term)
                if msg:
                    self.add(("identity", k, term), i_ir.at, f"{_host_words(ir)}: identity term '{term}': {msg} ({label} of {what})")

    def tensor(self, ir: Any, host: Any, term: str) -> str | None:
        """None when ``term`` names a value or a config entry, or a parameter or buffer of the host's
        module or of a child's (``gate.e_score_correction_bias``); else what is missing."""
        from nnatlas.tree import fit, introspect

        by_path: dict[str, set[str]] = {}
        for h in self.f.hosts:
            by_path.setdefault(h.path, set()).update(v.name for v in h.values)
        if term in {k for k, _, _ in self.f.config} or term_exists(ir.path, term, by_path):
            return None
        *prefix, last = term.split(".")
        if prefix:
            msg = self.walk(host, tuple(prefix), host, term)
            if msg is not None:
                return msg
        module = fit.resolved(host, tuple(prefix)) if prefix else introspect.native(host)
        held = {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}
        if last in held:
            return None
        where = type(module).__name__
        target = ".".join([ir.path, *prefix])
        values = by_path.get(pattern_of(target), set())
        return (f"{where} has no parameter or buffer '{last}', and {target} no value of that name (its parameters "
                f"and buffers: {', '.join(sorted(held)) or 'none'})" + suggest(last, [*held, *values]))

    @staticmethod
    def walk(start: Any, path: tuple[str, ...], host: Any, text: str) -> str | None:
        """None when ``path`` leads from ``start`` to a module; else what is missing, and the nearest names
        ("" when a rename entry is what is broken: that entry reports it). ``host``: the term's own host when the
        walk starts there (a sibling found instead is named, with the read that reaches it)."""
        from nnatlas.tree import fit

        gap = fit.host_gap(start, path)
        if gap is None:
            return None
        if gap.renamed_away:
            return ""  # a standard name whose rename finds nothing: reported at the rename entry
        return _gap_words(gap, fit.sibling(host, gap) if host is not None else (), text)

    def nearest_host(self, path: str, builds: list[tuple[str, Any]]) -> str:
        import torch

        from nnatlas.tree import fit, introspect

        parent, _, last = path.rpartition(".")
        last = last.removesuffix("[i]")
        item = re.fullmatch(r"(\w+)\[(\d+)\]", last)  # a list item: self_attn[2]
        for _, model in builds:
            for label, host in fit.hosts_at(model, parent or "model"):
                if host is None:
                    continue
                kids = introspect.child_names(host)
                listed = introspect.child(host, item.group(1)) if item else None
                if item and listed is not None:
                    items = introspect.native(listed)
                    if not isinstance(items, torch.nn.ModuleList):
                        return (f": {label}.{item.group(1)} ({type(items).__name__}) is no list of "
                                f"modules: name it without an index")
                    n = len(items)
                    return (f": {label}.{item.group(1)} is a list of {n} modules: index it with a number "
                            f"from 0 to {n - 1}")
                return f": {label} ({type(introspect.native(host)).__name__}) has no child '{last}'" + fit.children_words(kids) \
                    + suggest(last, kids)
        return ""


def _host_words(ir: Any) -> str:
    """``layers[i].mlp``, or ``layers[i].mlp (kind moe)`` for one kind of a hybrid stack's host."""
    return f"{ir.path} (kind {ir.kind})" if ir.kind else ir.path


def _gap_words(gap: Any, sibling: tuple[str, ...], text: str) -> str:
    """A path of child modules that breaks off (:class:`nnatlas.tree.fit.Gap`), said with the nearest names; a read
    that looked inside its host for a sibling (``sibling``: the parent's label and class) is told to climb."""
    from nnatlas.tree import fit

    where = f"{gap.at} ({gap.cls})"
    if sibling:
        return (f"'{gap.part}' is not inside {where}: this read leaves the host. '{gap.part}' is a sibling (a child "
                f"of {sibling[0]}, {sibling[1]}); a value read outside its host starts with ^. to climb to the parent: "
                f"^.{text}")
    return f"{where} has no child module '{gap.part}'" + fit.children_words(gap.children) + suggest(gap.part, list(gap.children))


def check(f: FamilyIR, adapter_source: str) -> list[Problem]:
    """Every problem of ``f`` against the module trees of its tiny config(s) and checkpoints."""
    return _Checker(f, _adapter(f, adapter_source)).run()
