"""A user's own spec, compiled at load: ``nnatlas.load(path, spec="my_family.yaml")``, ``wrap(model, spec=...)`` and
``NNATLAS_SPECS=dir`` (the runtime's one door here is ``nnatlas.loading.user_specs``, which imports this module lazily).

The spec file is compiled beside the shared vocabulary, notes and parts this nnatlas carries (``specs/`` of a checkout,
the package data ``nnatlas.specs`` of a wheel) and the shipped specs it extends, with ``generate``'s validation: the
spec language, the resolver, the rendered adapter's shape (``pycheck``) and its module tree on the meta device
(``treecheck``), every problem at once as ``file:line:col``. The adapter ``generate`` would write to
``generated/families/`` is rendered and run as a module in memory: nothing is written anywhere.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnatlas.spec import pattern_of

from . import default_root
from .emit import emit, pycheck
from .errors import Problem, SpecError, UserError
from .resolve import treecheck
from .resolve.resolve import resolve_sources
from .resolve.sources import PARTS, parse_sources

__all__ = ["Verified", "checks", "compile_spec", "compile_text", "draft_verified", "model_types_of", "shipped_specs"]


def shipped_specs() -> Path:
    """The specs this nnatlas carries: a checkout's specs/, or the wheel's package data ``nnatlas/specs``."""
    return default_root() / "specs"


def _read_yaml(path: Path) -> dict[str, Any]:
    from .language.yamlpos import MAX_BYTES

    if path.stat().st_size > MAX_BYTES:  # (not read: compiling it says it is too large)
        return {}
    return _parse(path.read_bytes())


def model_types_of(path: Path) -> list[str]:
    """The model types a spec file says it loads (``loads.model_types``), read without compiling it."""
    loads = _read_yaml(path).get("loads")
    found = loads.get("model_types") if isinstance(loads, dict) else None
    return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []


def _bases(data: dict[str, Any]) -> list[str]:
    ext = data.get("extends") or []
    return [ext] if isinstance(ext, str) else [e for e in ext if isinstance(e, str)] if isinstance(ext, list) else []


def compile_spec(path: Path, siblings: list[Path] | None = None) -> types.ModuleType:
    """The adapter module of the family that the spec file ``path`` declares, compiled in memory (its name is
    ``nnatlas.families.<family>``; not registered anywhere: the caller does that). ``siblings``: other user spec
    files the spec may extend (the rest of an NNATLAS_SPECS folder). Raises SpecError with every problem."""
    path = Path(path)
    rel = str(path)
    if not path.is_file():
        raise SpecError([Problem(rel, 1, 1, "no such spec file" if not path.exists() else "not a file")])
    return compile_text(path.read_bytes(), rel, siblings, path)


def compile_text(raw: bytes, rel: str, siblings: list[Path] | None = None, path: Path | None = None,
                 shipped_name: bool = False) -> types.ModuleType:
    """:func:`compile_spec` of a spec's bytes, shown in messages as ``rel`` (``shipped_name``: a family may take the
    name of a shipped one, as the sweep's draft of a shipped model type does)."""
    specs = shipped_specs()
    shipped = {p.stem: p for p in specs.glob("*.yaml") if not p.name.startswith("_")}
    users = {p.stem: p for p in (siblings or []) if path is None or p.resolve() != path.resolve()}
    data = _parse(raw)
    name = data.get("family") if isinstance(data.get("family"), str) else Path(rel).stem
    if name in shipped and not shipped_name:
        raise SpecError([Problem(rel, 1, 1, f"family '{name}' is a family nnatlas ships (specs/{name}.yaml): give "
                                            "your spec a name of its own (family: my_" + name + ")")])
    files: list[tuple[str, str, bytes]] = [(p.name, f"{specs.name}/{p.name}", p.read_bytes())
                                           for p in sorted(specs.glob("_*.yaml"))]
    files.append((f"{name}.yaml", rel, raw))
    todo, seen = _bases(data), {name}
    while todo:  # the specs it extends, directly or not: the user's own siblings first, then the shipped ones
        base = todo.pop()
        src = users.get(base) or shipped.get(base)
        if base in seen or src is None:
            continue  # (an unknown base is the resolver's problem, at the spec's line)
        seen.add(base)
        files.append((f"{base}.yaml", str(src) if base in users else f"{specs.name}/{src.name}", src.read_bytes()))
        todo += _bases(_read_yaml(src))
    parts = [(p.name, f"{specs.name}/{PARTS}/{p.name}", p.read_bytes()) for p in sorted((specs / PARTS).glob("*.yaml"))]
    atlas = resolve_sources(*parse_sources(files), specs.name, parse_sources(parts))
    family = next(f for f in atlas.families if f.name == name)
    source = emit.render_family(family)
    pycheck.check_adapter(f"<adapter of {rel}>", source)
    problems = treecheck.check(family, source)
    if problems:
        raise SpecError(problems)
    module = types.ModuleType(f"nnatlas.families.{name}")
    module.__file__ = rel
    exec(compile(source, f"<adapter of {rel}>", "exec"), module.__dict__)  # our own output, checked above
    return module


def _parse(raw: bytes) -> dict[str, Any]:
    """A spec's mapping, or {} for one that does not read as YAML (the compiler says what is wrong, at its line)."""
    import yaml

    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


Check = tuple[str, str, str, str]  # (as said, oracle | identity | twin | budget, the oracle check or identity text, host)


def checks(family: str, budget_s: float = 60.0) -> tuple[list[str], list[tuple[Check, str]]]:
    """(the checks that held, the ones that failed or did not run, each with why): the family's oracle (its values
    against what transformers returns itself, exactly, on a perturbed tiny twin of its config class, under each
    attention load) and every identity of its spec on that twin (three sequences, padded left and right), within
    ``budget_s`` seconds. The family must be in the lookup."""
    import time

    from nnatlas.testing import suite as testing

    start = time.perf_counter()
    held: list[str] = []
    failed: list[tuple[Check, str]] = []
    todo: list[tuple[Check, Any]] = [((f"oracle {check} [{attn}]", "oracle", check, "model"),
                                      lambda c=check, a=attn: testing.check_oracle(family, c, a))
                                     for check, attn in testing.oracle_checks(family)]
    fam = testing.adapter_module(family).FAMILY
    try:  # (the identities' case draws the same twin: built once)
        params = testing.first_params(family)
        twin = testing.shared_build(family, params, perturbed=True)
        case = testing.Case(family, params, testing._fixed_inputs(twin, text_only=True), seed=0, perturbed=True)
    except Exception as e:  # noqa: BLE001 - said as the draft's finding
        return [], [(("the perturbed tiny twin does not build", "twin", "", ""),
                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")]
    texts: dict[str, list[str]] = {}  # each host path's identities, in the spec's order (check_identity's index)
    for h in fam.hosts:
        if not h.path.startswith("vision"):
            texts.setdefault(h.path, []).extend(i.text for i in h.identities)
    todo += [((f"identity {path}: {text}", "identity", text, path), lambda p=path, k=k: testing.check_identity(case, p, k))
             for path, ts in texts.items() for k, text in enumerate(ts)]
    for check, run in todo:
        if time.perf_counter() - start > budget_s:
            failed.append(((check[0], "budget", check[2], check[3]), f"not run (the {budget_s:.0f} s verification "
                                                                     "budget ran out)"))
            continue
        try:
            run()
        except Exception as e:  # noqa: BLE001 - a failing check is the draft's finding, said as such
            failed.append((check, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
        else:
            held.append(check[0])
    return held, failed


# what each oracle check compares with transformers' own outputs: values it verifies (never refused for an identity)
ORACLE_VALUES = {"hidden_states": ("layer_input", "layer_output", "final_norm_output"), "logits": ("logits",),
                 "attentions": ("attention_probabilities",), "router_logits": ("router_logits",)}
WORD = r"[A-Za-z_][A-Za-z0-9_]*(?:\[[0-9i]+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[[0-9i]+\])?)*"


@dataclass
class Verified:
    """A draft that verified: its adapter, the checks that held, and the values refused (with why) and the identities
    dropped because they did not hold on the twin (each value an identity names is then refused, unless an oracle
    check verified it)."""

    module: types.ModuleType
    text: str
    held: list[str]
    refused: list[str] = field(default_factory=list)
    verify_s: float = 0.0  # (seconds its last round of checks took)


def draft_verified(model_type: str, model_path: str | None = None, budget_s: float = 120.0, shown: str = "",
                   first: bool = False) -> Verified:
    """``draft=True``'s draft: drafted (from the checkpoint folder's config when given), compiled, verified on a perturbed
    tiny twin (:func:`checks`). Serve only what verified: a draft whose oracle on hidden states and logits holds but
    whose other checks fail is drafted again with each failing check's values refused (``missing:``, saying why) and
    its identity dropped, then verified again; one whose hidden states or logits differ from transformers', whose twin
    does not build, or that ran out of time raises UserError listing the failures. The family is added to the lookup
    (``first``: before the shipped ones, as the sweep's draft of a shipped type) and stays there when it verified."""
    import re
    import time

    import transformers

    from nnatlas import registry

    from .draft import DraftError, draft, writer

    try:
        d = draft(model_type, model_path=model_path)
    except DraftError as e:
        raise UserError(f"nnatlas cannot draft a spec for {model_type}: {e}") from None
    p = d.proposal
    shown = shown or f"<draft of {model_type}>"
    refused: list[str] = []
    text = d.text
    taken = {f.stem for f in shipped_specs().glob("*.yaml")}
    if not first and p.family in taken:  # (gpt-sw3 runs GPT-2's classes: its draft is named gpt2, a shipped family)
        own = re.sub(r"[^a-z0-9_]", "_", model_type.lower())
        p.family = own if own not in taken else f"draft_{own}"
        text = writer.write(p, transformers.__version__)
    for _ in range(4):
        try:
            module = compile_text(text.encode("utf-8"), shown, shipped_name=first)
        except SpecError as e:
            e.draft_text = text  # type: ignore[attr-defined]  # (draft=True writes it where the user can edit it)
            raise
        name = module.FAMILY.name
        if first:
            registry.put_first(module)
        else:
            registry.add_user(module)
        start = time.perf_counter()
        held, failed = checks(name, budget_s)
        if held and not failed:
            return Verified(module, text, held, refused, time.perf_counter() - start)
        registry.remove_user(name)  # (a family put first is replaced by the next round's, or stays out of the sweep's way)
        fatal = [f for f in failed if f[0][1] in ("twin", "budget") or (f[0][1] == "oracle" and f[0][2] in
                                                                         ("hidden_states", "logits"))]
        if fatal or not held:
            break
        changed = _refuse_failed(p, held, failed, refused)
        if not changed:
            break
        text = writer.write(p, transformers.__version__)
    said = [f"{what}: {why}" for (what, _, _, _), why in failed]
    raise DraftFailed(model_type, held, said, text)


def _refuse_failed(p: Any, held: list[str], failed: list[tuple[Check, str]], refused: list[str]) -> bool:
    """Refuse in the proposal ``p`` each value a failing check names (``missing:``, saying why; not a value an oracle
    check that held verified), drop the failing identities and those that name a refused value; ``refused`` gets a
    line per value. Whether anything changed."""
    import re

    from .draft.proposal import Value

    verified = {v for h in held if h.startswith("oracle ") for v in ORACLE_VALUES.get(h.split()[1], ())}
    hosts = {h.path: h for h in p.hosts.values()}

    def refuse(host: str, value: str, why: str) -> bool:
        h = hosts.get(pattern_of(host))
        if h is None or value in verified:
            return False
        found = False
        for vals in [h.values, *(k.values for k in h.kinds.values())]:
            if value in vals and vals[value].missing is None:
                vals[value] = Value(missing=f"refused by draft=True: {why}", sure="refused on the tiny twin")
                found = True
        return found

    changed = False
    for (what, kind, check, host), why in failed:
        if kind == "oracle":
            for value in ORACLE_VALUES.get(check, ()):
                for h in list(hosts):
                    if refuse(h, value, f"{what} did not hold ({why})"):
                        refused.append(f"{h}.{value}: {what} did not hold")
                        changed = True
            continue
        reason = f"the identity {check!r} did not hold ({why})"
        for word in dict.fromkeys(re.findall(WORD, check)):
            parts = word.split(".")
            owner = ".".join([host, *parts[:-1]]) if host != "model" or len(parts) == 1 else ".".join(parts[:-1])
            if refuse(owner, parts[-1], reason):
                refused.append(f"{owner}.{parts[-1]}: {reason}")
        for h in hosts.values():  # the identity itself is dropped
            for owner in [h, *h.kinds.values()]:
                kept = [x for x in owner.identities if not (h.path == host and x.check == check)]
                changed |= len(kept) != len(owner.identities)
                owner.identities = kept
    missing = {v for h in hosts.values() for vals in [h.values, *(k.values for k in h.kinds.values())]
               for v, x in vals.items() if x.missing and x.missing.startswith("refused by draft=True")}
    for h in hosts.values():  # an identity that names a refused value cannot be checked: dropped too
        for owner in [h, *h.kinds.values()]:
            owner.identities = [x for x in owner.identities if not set(re.findall(r"[A-Za-z_]\w*", x.check)) & missing]
    return changed


class DraftFailed(UserError):
    def __init__(self, model_type: str, held: list[str], failed: list[str], text: str = ""):
        self.model_type, self.held, self.failed, self.text = model_type, held, failed, text
        super().__init__(f"the drafted spec for {model_type} did not verify on a tiny twin ({len(held)} checks held, "
                         f"{len(failed)} did not)")
