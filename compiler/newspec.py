"""``nnatlas new FAMILY --from BASE``: a starting spec that extends BASE and compiles as it is.

The new file overrides what cannot be inherited: the identity (title, lines, summary, loads),
the native class names (BASE's classes with BASE's prefix swapped for the new family's, kept only
when transformers has them; otherwise BASE's own, marked TODO), the tiny model and config classes;
and it empties the checkpoints and notes, which describe BASE. The rest is inherited, and the
comments say how to override it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .language.ir import Atlas, FamilyIR


class NewSpecError(ValueError):
    """A bad `nnatlas new` request (the name, the base, the output path)."""


def _prefix(config_class: str) -> str:
    return config_class.removesuffix("Config").removesuffix("Text")


def _transformers_prefix(family: str) -> tuple[str | None, str | None]:
    """(the class prefix transformers uses for model_type ``family``, its modeling module), or Nones."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None, None
    config = CONFIG_MAPPING_NAMES.get(family)
    if config is None:
        return None, None
    return _prefix(config), f"transformers.models.{family}.modeling_{family}"


def _exists(cls: str, module: str | None) -> bool:
    import importlib

    import transformers

    if hasattr(transformers, cls):
        return True
    if module is None:
        return False
    try:
        return hasattr(importlib.import_module(module), cls)
    except ImportError:
        return False


def _camel(family: str) -> str:
    return "".join(w.capitalize() for w in family.split("_"))


def _yaml_str(text: str) -> str:
    """A YAML scalar that reads back as ``text`` (JSON strings are YAML)."""
    return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\[\]]*", text) else json.dumps(text)


def starting_spec(family: str, base: FamilyIR) -> str:
    """The text of specs/<family>.yaml, extending ``base``."""
    known_prefix, module = _transformers_prefix(family)
    new_prefix = known_prefix or _camel(family)
    old_prefix = _prefix(base.tiny.config_class)

    def swap(cls: str) -> tuple[str, bool]:
        """(the class name for the new family, whether transformers has it)."""
        candidate = cls.replace(old_prefix, new_prefix, 1) if old_prefix and cls.startswith(old_prefix) else cls
        if candidate != cls and _exists(candidate, module):
            return candidate, True
        return cls, False

    def line(key: str, cls: str, indent: str = "  ") -> str:
        name, found = swap(cls)
        note = "" if found else f"  # TODO: {base.name}'s class; name {family}'s"
        return f"{indent}{_yaml_str(key)}: {{class: {name}}}{note}"

    # hosts under a name a part renames come with that part, which is not inherited: include it
    part_files = {file for file, _ in base.parts}
    from_parts = {name for name, at in base.rename_at if at is not None and at[0] in part_files}
    hosts: dict[str, str] = {}
    for h in base.hosts:
        if re.split(r"[.\[]", h.path, maxsplit=1)[0] not in from_parts:
            hosts.setdefault(h.path, h.cls)
    includes = [f"#   include: [{{part: {Path(file).stem}, classes: {{...}}}}]  # as specs/{base.name}.yaml includes it"
                for file, _ in base.parts]
    model_class, _ = swap(base.tiny.model_class)
    config_class, _ = swap(base.tiny.config_class)
    classes = [swap(c)[0] for c in base.classes]
    title = known_prefix or _camel(family)
    traits = ", ".join(t for t, _ in base.traits)
    out = [
        f"# specs/{family}.yaml: a starting spec, written by `nnatlas new {family} --from {base.name}`.",
        f"# It extends {base.name}: every key of specs/{base.name}.yaml (and of the specs it extends) holds here",
        "# unless this file sets it. Mappings merge key by key (a host here changes only the keys it gives),",
        "# lists are replaced, and `name: null` drops an inherited value, host, rename or config entry.",
        "# Every key is described in docs/spec.md. Then: `make generate` (checks it) and `make test`.",
        f"family: {family}",
        f"extends: {base.name}",
        "",
        f"title: {_yaml_str(title)}",
        f"lines: [{_yaml_str(title)}]  # the product names",
        "summary: >",
        f"  {base.title}'s architecture; say here, in one paragraph, what {title} changes.",
        f"traits: [{traits}]  # {base.name}'s: keep those that hold (specs/_vocabulary.yaml lists them all)",
        "",
        "loads:  # what loads as this family: config model_type values and model classes",
        f"  model_types: [{_yaml_str(family)}]",
        f"  classes: [{', '.join(classes)}]",
        "",
        f"# the native class of each of {base.name}'s hosts, under this family's names. Override a value with",
        "#   layers[i].self_attn: {class: ..., values: {attention_output: output[0]}}",
        "# and add identities the model must satisfy: the generated tests check them on tiny configs.",
        "hosts:",
        *(line(path, cls) for path, cls in hosts.items()),
        *(["", f"# {base.name} includes parts (specs/parts/), which a family that extends it does not inherit:",
            *includes] if includes else []),
        "",
        "# the tiny random models of the generated tests: the config entries and draws are inherited",
        "tiny:",
        f"  model_class: {model_class}",
        f"  config_class: {config_class}",
        "",
        f"# {base.name}'s checkpoints and notes describe {base.name}: write {family}'s own",
        "#   checkpoints: [{name: org/model, config: {...config.json...}}]",
        "#   notes: [{title: ..., body: ...}]",
        "checkpoints: []",
        "notes: []",
        "",
    ]
    return "\n".join(out)


def write_new(family: str, base_name: str, atlas: Atlas, out: Path, force: bool = False) -> Path:
    """Write the starting spec of ``family`` to ``out``; NewSpecError for a bad name, base or path."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", family):
        raise NewSpecError(f"new: '{family}' is not a family name (lowercase letters, digits and _, like qwen3_next)")
    by_name = {f.name: f for f in atlas.families}
    if family in by_name and not force:
        raise NewSpecError(f"new: family '{family}' exists already (specs/{family}.yaml)")
    if base_name not in by_name:
        from .resolve.resolve import suggest

        raise NewSpecError(f"new: no family '{base_name}' to start from" + suggest(base_name, by_name)
                               + f" (families: {', '.join(sorted(by_name))})")
    if out.name != f"{family}.yaml":
        raise NewSpecError(f"new: a family lives in <specs>/{family}.yaml, not {out.name}")
    if out.exists() and not force:
        raise NewSpecError(f"new: {out} exists; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(starting_spec(family, by_name[base_name]), encoding="utf-8")
    return out
