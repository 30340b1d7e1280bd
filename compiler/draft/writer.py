"""A proposal as a commented YAML spec. The one place that knows the spec's surface forms: when
the spec language grows (parts, ``identities+:``, sibling reads), only this file changes."""

from __future__ import annotations

import json
import re
from typing import Any

from ..language.names import module_names
from .proposal import Host, Identity, Proposal, Value


def scalar(x: Any) -> str:
    """One YAML scalar: strings double-quoted (JSON escapes are YAML's), floats with a dot and a
    signed exponent (PyYAML reads ``1e-06`` as a string)."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == 0:
            return "0.0"
        text = repr(x)
        if "e" in text or abs(x) < 1e-4 or abs(x) >= 1e16:
            mant, _, exp = f"{x:.6e}".partition("e")
            mant = mant.rstrip("0")
            mant = mant + "0" if mant.endswith(".") else mant
            return f"{mant}e{int(exp):+d}"
        return text
    return json.dumps(str(x), ensure_ascii=False)


def flow(x: Any) -> str:
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in x) + "]"
    return scalar(x)


def comment(text: str) -> str:
    text = " ".join(text.split())
    return f"  # {text}" if text else ""


def value_text(v: Value) -> str:
    if v.missing is not None:
        return flow({"missing": v.missing})
    fields: dict[str, Any] = {}
    if v.read is not None:
        fields["read"] = v.read
    if v.derived is not None:
        fields["derived"] = v.derived
    if v.view is not None:
        fields["view"] = v.view
    if v.needs is not None:
        fields["needs"] = v.needs
    if v.edit is not None:
        fields["edit"] = v.edit
    if v.copy:
        fields["copy"] = True
    if list(fields) == ["read"]:
        return scalar(v.read)
    return flow(fields)


def identity_text(x: Identity) -> str:
    if not x.atol and not x.rtol:
        return scalar(x.check)
    fields: dict[str, Any] = {"check": x.check}
    if x.atol:
        fields["atol"] = float(x.atol)
    if x.rtol:
        fields["rtol"] = float(x.rtol)
    return flow(fields)


def host_lines(h: Host) -> list[str]:
    out = [f"  {h.path}:{comment(h.sure)}"]
    if h.kind:
        out.append(f"    kind: {h.kind}")
    out.append(f"    class: {h.cls or 'null'}")
    if h.stream:
        out.append(f"    stream: {h.stream}")
    if h.dims:
        out.append(f"    dims: {flow(h.dims)}")
    if h.values:
        out.append("    values:")
        for name, v in h.values.items():
            out.append(f"      {name}: {value_text(v)}{comment(v.sure)}")
    if h.identities:
        out.append("    identities:")
        for x in h.identities:
            out.append(f"      - {identity_text(x)}{comment(x.sure)}")
    if h.kinds:
        out.append("    kinds:")
        for k in h.kinds.values():
            out.append(f"      {k.name}:")
            out.append(f"        when: {scalar(k.when)}")
            if k.cls:
                out.append(f"        class: {k.cls}")
            if k.dims:
                out.append(f"        dims: {flow(k.dims)}")
            if k.values:
                out.append("        values:")
                for name, v in k.values.items():
                    out.append(f"          {name}: {value_text(v)}{comment(v.sure)}")
            if k.identities:
                out.append("        identities:")
                for x in k.identities:
                    out.append(f"          - {identity_text(x)}{comment(x.sure)}")
    return out


def write(p: Proposal, transformers_version: str) -> str:
    t = p.tiny
    lines = [
        f"# Drafted by `nnatlas draft {p.model_type}` from one forward of a tiny random {p.model_class}",
        f"# (transformers {transformers_version}). Review every line before it lands in specs/: each",
        "# proposal says how sure the drafter is (sure: read from the dataflow; likely: matched by",
        "# shape or name), identities are the ones that held numerically, and TODO marks what it could",
        "# not map.",
    ]
    for todo in p.todos:
        lines.append(f"# TODO: {' '.join(todo.split())}")
    lines += [f"family: {p.family}"]
    if p.extends:
        lines.append(f"extends: {p.extends}")
    if "heads" not in t.names:  # a state-space stack: the attention sizes do not apply
        lines.append("presets: [no_attention]")
    traits = list(dict.fromkeys(p.traits))
    lines += [
        f"title: {scalar(p.title)}",
        f"lines: {flow([p.title])}",
        "summary: >",
        f"  {p.title} ({p.model_class}), as drafted by machine from one forward of a tiny random model:",
        "  the standard values below were found in the recorded dataflow and checked on it.",
        f"traits: {flow(traits)}",
        "loads:",
        f"  model_types: {flow([p.model_type, *p.tiny.also])}",
        f"  classes: {flow([p.model_class])}",
        "",
        "rename:",
    ]
    for std, native in p.rename.items():
        lines.append(f"  {std}: {scalar(native)}{comment(p.rename_sure.get(std, 'sure: a native name in the recorded forward'))}")
    own = _own_modules(p)
    if own:
        lines += ["", "modules:  # native names the drafter kept: say what each is, or rename it to a standard one"]
        for name in own:
            lines.append(f"  {name}: {scalar(f'the native module {name}, as drafted')}")
    lines += ["", "config:"]
    for key, text in p.config.items():
        lines.append(f"  {key}: {scalar(text)}")
    if p.functions:
        lines += ["", "functions:"]
        for name, f in p.functions.items():
            lines.append(f"  {name}:")
            lines.append(f"    names: {flow(f.names)}")
            lines.append(f"    words: {scalar(f.words)}")
            if f.route:
                lines.append(f"    route: {flow(f.route)}")
    lines += ["", "hosts:"]
    for h in p.hosts.values():
        lines += host_lines(h)
        lines.append("")
    lines += [
        "tiny:",
        f"  model_class: {t.model_class}",
        f"  config_class: {t.config_class}",
        f"  config: {flow(t.config)}",
        "  draw:",
    ]
    for note in t.notes:
        lines.append(f"    # {note}")
    for key, options in t.draw.items():
        lines.append(f"    {key}: {flow(options)}")
    lines += ["  batch: [1, 3]", "  seq: [1, 7]", "  examples: 4"]
    pins = _layout_pins(p)
    if pins:
        lines.append("  layouts:")
        for key, value in pins.items():
            lines.append(f"    {key}:")
            lines.append(f"      pin: {flow(value)}")
            lines.append("      reason: >")
            lines.append(f"        the draft has no block kinds along {key} (one class per host path): a checkpoint")
            lines.append("        laid out otherwise is drafted again on its layout (load(draft=True), nnatlas draft --config)")
    if p.experts:
        lines.append(f"  experts: {flow(p.experts)}")
    return "\n".join(lines) + "\n"


def _layout_pins(p: Proposal) -> dict[str, Any]:
    """The structural options that lay out which blocks take which module (dense-first counts, periods, index
    lists) along which the draft found no kinds, each at its tiny value: the perturbed tests would draw a layout
    the draft does not describe (the kinds it found name their options in their whens)."""
    import copy

    import transformers

    from nnatlas.testing.suite import moves_block_kinds, structural_options

    first = p.tiny.first()
    try:
        found = structural_options(getattr(transformers, p.tiny.config_class)(**copy.deepcopy(first)))
    except Exception:  # noqa: BLE001 - a config the drafter could not build is said elsewhere
        return {}
    named = {n for when in p.whens.values() for n in re.findall(r"[A-Za-z_]\w*", when)}
    return {k: options[0] for k, options in found.items() if moves_block_kinds(k) and k not in named}


def _own_modules(p: Proposal) -> list[str]:
    """The module names of the draft's host paths and rename keys that the shipped vocabulary's modules: lacks."""
    import yaml

    from .. import default_root  # (the specs this nnatlas carries, as userspec.shipped_specs says)

    known = set((yaml.safe_load((default_root() / "specs" / "_vocabulary.yaml").read_text()) or {}).get("modules") or {})
    names = [n for path in (*p.rename, *p.hosts) for n in module_names(path)]
    return [n for n in dict.fromkeys(names) if n not in known]
