"""One merged family checked and built into its ``FamilyIR``: its identity, names, config, functions and
diagram here; its hosts and values, identities, tiny model and notes by the mixins it is made of.
"""

from __future__ import annotations

from typing import Any

from ..errors import suggest
from ..language import expr, names
from ..language.ir import (
    DEFAULT_BLOCK,
    DEFAULT_TEXT,
    REQUIRED_CONFIG,
    CheckpointIR,
    DiagramIR,
    FamilyIR,
    FunctionIR,
    HostIR,
)
from ..language.models import UnavailableRaw
from ..language.presets import PRESETS
from ..language.yamlpos import Path as DataPath
from .hosts import HOST_PATH, HostValues
from .identities import IdentityChecks
from .notes import NoteChecks
from .sources import VOCABULARY
from .tiny import MAX_EXAMPLES, MIN_EXAMPLES, TinyChecks


class Family(HostValues, IdentityChecks, TinyChecks, NoteChecks):
    """Checks one merged family and builds its IR; problems go to ``found``."""

    def build(self) -> FamilyIR | None:
        r = self.raw
        for req in ("title", "lines", "summary", "traits", "loads", "tiny"):
            if getattr(r, req) is None:
                self.err((), f"family {r.family}: '{req}' is required (here or in the spec it extends)")
        for req in ("title", "summary"):
            if getattr(r, req) is not None and not getattr(r, req).strip():
                self.err((req,), f"{req} is empty: say it in words")
        if r.lines is not None and not r.lines:
            self.err(("lines",), "lines is empty: name at least one product line")
        for k, line in enumerate(r.lines or []):
            if not line.strip():
                self.err(("lines", k), "lines: an empty product line")
        self.check_names()
        for trait in r.traits or []:
            if trait not in self.vocab.traits:
                self.err(("traits", (r.traits or []).index(trait)), f"unknown trait '{trait}'" + suggest(trait, self.vocab.traits))
        if r.loads is not None and r.loads.attention is not None and "eager" not in r.loads.attention:
            self.err(("loads", "attention"), "loads.attention: every class accepts 'eager' (the reference the tests run); list it")
        config = self.config()
        if "model" not in r.hosts:
            self.err(("hosts",), "the hosts must include 'model' (the root)")
        functions = self.functions()
        self.groups = {f.name: f.words for f in functions}
        hosts = [x for path, h in r.hosts.items() for x in self.host(path, h, config)]
        tiny = self.tiny() if r.tiny else None
        notes = self.notes()
        if not self.ok or tiny is None:
            return None
        hosts_ir = tuple(h for h in hosts if h is not None)
        self.check_identities(hosts_ir, {k for k, _, _ in config})
        self.check_kind_whens(hosts_ir)
        self.check_checkpoint_sizes(config)
        self.check_positional_reads(hosts_ir)
        diagram = self.diagram(hosts_ir)
        if not self.ok:
            return None
        assert r.title and r.lines and r.summary and r.traits is not None and r.loads
        extends = () if r.extends is None else (r.extends,) if isinstance(r.extends, str) else tuple(r.extends)
        return FamilyIR(
            name=r.family, file=self.src.rel, sha256=self.src.sha256, extends=extends, title=r.title,
            lines=tuple(r.lines), summary=r.summary.strip(),
            traits=tuple((t, self.vocab.traits[t]) for t in r.traits),
            model_types=tuple(r.loads.model_types), classes=tuple(r.loads.classes),
            rename=tuple((k, tuple(v) if isinstance(v, list) else (v,)) for k, v in r.rename.items()),
            config=tuple(config), functions=functions, hosts=hosts_ir, tiny=tiny,
            checkpoints=tuple(CheckpointIR(c.name, tuple(c.config.items())) for c in r.checkpoints),
            notes=notes, docstring=(r.docstring or r.summary).strip(), diagram=diagram,
            attention=tuple(r.loads.attention) if r.loads.attention is not None else None,
            rename_at=tuple((k, self.at(("rename", k))) for k in r.rename), tiny_at=self.at(("tiny", "model_class")),
            parts=tuple((s.rel, s.sha256) for s in self.merged.parts),
        )

    def module_name_problem(self, path: str, what: str) -> str | None:
        """A module name outside the vocabulary's modules: is a typo or an unmade choice (self_attn_2, dense_mlp)."""
        known = {**self.vocab.modules, **self.raw.modules}
        for name in names.module_names(path):
            if name not in known:
                return (f"{what} '{path}': '{name}' is not a standard module name" + (suggest(name, known) or ".")
                        + f" A new module name is declared once in specs/{VOCABULARY}, under modules:, with its "
                        "one-line meaning (what any family's module of that name is), or for this family alone "
                        "under modules: in its spec")
        return None

    def check_names(self) -> None:
        """Every spec name that becomes a Python name (or a name the runtime looks up) is a name."""
        r = self.raw

        def check(at: DataPath, bad: str | None, key: bool = False) -> None:
            if bad:
                self.err(at, bad, key=key)

        for key, natives in r.rename.items():
            check(("rename", key), names.path_problem(key, "rename key") or self.module_name_problem(key, "rename key"),
                  key=True)
            items = natives if isinstance(natives, list) else [natives]
            for k, native in enumerate(items):
                at = ("rename", key, k) if isinstance(natives, list) else ("rename", key)
                check(at, names.path_problem(native, "native path", block_index=False, digits=True))
        for key in r.config:
            check(("config", key), names.problem(key, "config key"), key=True)
        for path, h in r.hosts.items():
            if h.cls is not None:
                check(("hosts", path, "class"), names.problem(h.cls, "class"))
            if path not in r.rename and not names.path_problem(path, "host path"):  # (those are said elsewhere)
                check(("hosts", path), self.module_name_problem(path, "host"), key=True)
            for kname, kind in h.kinds.items():
                if kind.cls is not None:
                    check(("hosts", path, "kinds", kname, "class"), names.problem(kind.cls, "class"))
        if r.loads is not None:
            for k, cls in enumerate(r.loads.classes):
                check(("loads", "classes", k), names.problem(cls, "class"))
        for name, fn in r.functions.items():
            check(("functions", name), names.problem(name, "function group"), key=True)
            if fn.route is not None:
                for fld in ("torch", "state_arg", "final_state_flag"):
                    value = getattr(fn.route, fld)
                    if value is not None:
                        check(("functions", name, "route", fld), names.problem(value, f"route.{fld}"))
        t = r.tiny
        if t is not None:
            loads: list[tuple[DataPath, Any]] = [(("tiny",), t)]
            if t.image_text is not None:
                loads.append((("tiny", "image_text"), t.image_text))
            for base, load in loads:
                for fld in ("model_class", "config_class"):
                    check((*base, fld), names.problem(getattr(load, fld), fld))
                if load.processor is not None:
                    check((*base, "processor", "class"), names.problem(load.processor.cls, "class"))
                    check((*base, "processor", "image_processor"), names.problem(load.processor.image_processor, "image_processor"))
                for key in load.draw:
                    check((*base, "draw", key), names.path_problem(key, "draw key", block_index=False), key=True)
            if not MIN_EXAMPLES <= t.examples <= MAX_EXAMPLES:
                self.err(("tiny", "examples"), f"tiny.examples: between {MIN_EXAMPLES} and {MAX_EXAMPLES}")
            if t.image_text is not None and not MIN_EXAMPLES <= t.image_text.examples <= MAX_EXAMPLES:
                self.err(("tiny", "image_text", "examples"),
                         f"tiny.image_text.examples: between {MIN_EXAMPLES} and {MAX_EXAMPLES}")
        classes: dict[str, str] = {}
        for path in r.hosts:
            if not HOST_PATH.fullmatch(path) or names.path_problem(path):
                continue  # host() says so
            cls = names.class_name(path)
            if cls in names.RESERVED_CLASSES:
                self.err(("hosts", path), f"host '{path}': its class would be named {cls}, which the adapter "
                         "uses already", key=True)
            elif cls in classes:
                self.err(("hosts", path), f"hosts '{classes[cls]}' and '{path}' would both be class {cls} in the "
                         "adapter: rename one", key=True)
            classes.setdefault(cls, path)

    def diagram(self, hosts: tuple[HostIR, ...]) -> DiagramIR:
        """The optional ``diagram:`` section: every part it names must be a part of the family."""
        d = self.raw.diagram
        rename = set(self.raw.rename)

        def known(prefix: str, host: str, name: str) -> bool:
            full = f"{prefix}.{name}" if prefix else name
            if full in rename or any(h.path == full or h.path.startswith(full + "[i]") for h in hosts):
                return True
            return any(v.read is not None and v.read.module[:1] == (name,) and
                       (h.path == host and not v.read.up or v.read.up == 1 and h.path.rsplit(".", 1)[0] == host)
                       for h in hosts for v in h.values)

        out = {"text": DEFAULT_TEXT, "block": DEFAULT_BLOCK, "vision": (), "vision_block": DEFAULT_BLOCK}
        checks = {"text": ("", "model", ()), "block": ("layers[i]", "layers[i]", ("add", "mixer")),
                  "vision": ("vision", "vision", ()), "vision_block": ("vision.layers[i]", "vision.layers[i]", ("add", "mixer"))}
        for key, (prefix, host, words) in checks.items():
            items = getattr(d, key) if d is not None else None
            if items is None:
                continue
            values = {v.name for h in hosts if h.path == host for v in h.values}
            for k, item in enumerate(items):
                name, _, cond = item.partition(" if ")
                if cond and cond.strip() not in values:
                    self.err(("diagram", key, k), f"diagram.{key}: '{item}': '{cond.strip()}' is no value of {host}")
                    continue
                if words and name.startswith("mul:"):  # a product with a value of the block
                    if name[4:] not in values:
                        self.err(("diagram", key, k), f"diagram.{key}: '{item}': '{name[4:]}' is no value of {host}")
                    continue
                ok = name in words or known(prefix, host, name) or (key == "vision" and known("", "model", name)) or \
                    any(t.split(".")[0] == name for h in hosts if h.path == host for i in h.identities for t in i.terms)
                if not ok:
                    where = f"{prefix} " if prefix else ""
                    self.err(("diagram", key, k), f"diagram.{key}: '{name}' is no {where}part of this family "
                             f"(a rename entry, a host, or a module a value is read at" +
                             (", or add / mixer)" if words else ")"))
            out[key] = tuple(items)
        facts = d.vision_facts if d is not None and d.vision_facts else {}
        if facts and not any(h.path == "vision" for h in hosts):
            self.err(("diagram", "vision_facts"), "diagram.vision_facts: this family has no vision host to say them of")
        return DiagramIR(out["text"], out["block"], out["vision"], out["vision_block"],
                         tuple((k, " ".join(v.split())) for k, v in facts.items()))

    def config(self) -> list[tuple[str, expr.Compiled, str]]:
        out = []
        entries = dict(self.raw.config)
        unknown_preset = False
        for k, name in enumerate(self.raw.presets):
            preset = PRESETS.get(name)
            if preset is None:
                self.err(("presets", k), f"unknown preset '{name}' (presets: {', '.join(sorted(PRESETS))})"
                         + suggest(name, PRESETS))
                unknown_preset = True
                continue
            for key, entry in preset.config(self.raw.title or self.raw.family).items():
                entries.setdefault(key, entry)
        for key in REQUIRED_CONFIG:
            if key not in entries and not unknown_preset:  # a misspelt preset: its error says it all
                hint = (" (an attention-free family takes them all with `presets: [no_attention]`)"
                        if key in dict(PRESETS["no_attention"].reasons) else "")
                self.err(("config",), f"config: the normalized attribute '{key}' is required{hint}", key=True)
        for key, text in entries.items():
            if isinstance(text, UnavailableRaw):
                out.append((key, expr.Compiled(f"_fn.config_unavailable({text.unavailable!r})", ()),
                            f"Unavailable: {text.unavailable}"))
                continue
            try:
                out.append((key, expr.compile_config(text), str(text)))
            except expr.ExprError as e:
                self.err(("config", key), f"config.{key}: {e}", col=e.col)
        return out

    def functions(self) -> tuple[FunctionIR, ...]:
        out = []
        for name, fn in self.raw.functions.items():
            at = ("functions", name)
            if not fn.names:
                self.err((*at, "names"), f"functions.{name}: list at least one function name")
            for n in fn.names:
                if bad := names.problem(n, "function"):
                    self.err((*at, "names"), f"functions.{name}: {bad}")
            route = None
            if fn.route is not None:
                route = tuple(fn.route.model_dump().items())
            out.append(FunctionIR(name, tuple(fn.names), fn.words.strip(), route))
        return tuple(out)

