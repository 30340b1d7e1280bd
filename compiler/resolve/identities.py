"""A family's identities and reads: every identity term names a value, a config entry or a child's tensor,
and every value read by its position among a forward's calls is pinned by an identity.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from ..errors import suggest
from ..language.ir import HostIR
from .context import FamilyContext


class IdentityChecks(FamilyContext):
    """The identities' terms and the positional reads they pin."""

    def check_identities(self, hosts: tuple[HostIR, ...], config_names: set[str]) -> None:
        by_path: dict[str, set[str]] = {}
        for h in hosts:
            by_path.setdefault(h.path, set()).update(v.name for v in h.values)
        for h in hosts:
            for k, ident in enumerate(h.identities):
                for term in ident.terms:
                    known = sorted(by_path.get(h.path, set()))
                    if term not in config_names and not term_exists(h.path, term, by_path) \
                            and not tensor_term(term) and not own_tensor_term(term, known):
                        self.err(("hosts", h.path, "identities", k), f"identity term '{term}' names nothing on host {h.path}" + suggest(term.split(".")[-1], known))

    def check_positional_reads(self, hosts: tuple[HostIR, ...]) -> None:
        """Every value read by position (``op:add#5``, ``method:f#i``) must be named by an identity:
        transformers adding or removing one such call would otherwise shift the read, silently, onto
        another tensor that may even have the same shape."""
        pinned: set[tuple[str, str]] = set()
        for h in hosts:
            for ident in h.identities:
                for term in ident.terms:
                    pinned.add(_term_value(h.path, term))
        for h in hosts:
            for v in h.values:
                if v.read is None or not v.read.by_position or (h.path, v.name) in pinned:
                    continue
                file, line, col = v.at or (self.src.rel, 1, 1)
                self.found.add(file, (line, col), (
                    f"{h.path}: {v.name}: '{v.read.text}' is read by its position among the calls of the forward, "
                    f"and no identity names {v.name}: a transformers release that adds or removes one such call would "
                    f"shift the read onto another tensor unnoticed. Add an identity that pins it (to a child's "
                    f"boundary, a parameter or another value), or read it by name (a child's .input/.output, "
                    f"call:attention.args[N], fn:NAME.args.PARAM)"))
                self.ok = False


def tensor_term(term: str) -> bool:
    """A term that may name a parameter or buffer of a child module of the host's
    (``gate.e_score_correction_bias``): a plain path of two parts or more, not from the root; checked on the module tree
    of the tiny model and of every checkpoint by treecheck (``make generate``)."""
    parts = term.split(".")
    return len(parts) > 1 and parts[0] != "model" and "[" not in term and parts[-1] not in ("input", "output")


def own_tensor_term(term: str, known: list[str]) -> bool:
    """A one-word term that is not a value's name a letter or two off may name a parameter or buffer of the
    host's own module (MiniMax-M2's ``e_score_correction_bias``, AFMoE's ``expert_bias``, beside the value
    ``expert_indices``): checked on the module tree by treecheck, as a child's is; a near miss of a value's name
    (``mlp_activaton``) is reported here as the typo it likely is."""
    typo = any(difflib.SequenceMatcher(None, term, k).ratio() >= 0.85 for k in known)
    return "." not in term and "[" not in term and term.isidentifier() and not typo


def term_exists(host: str, term: str, by_path: dict[str, set[str]]) -> bool:
    """Whether identity term ``term`` on ``host`` names a value of the hosts ``by_path`` (or a module boundary)."""
    parts = term.split(".")
    if parts[-1] in ("input", "output"):
        return True  # a module boundary: checked on the live model by the generated tests
    if parts[0] == "model" and len(parts) > 1:  # a path from the root
        host, parts = "model", parts[1:]
    prefix = _term_prefix(host, parts[:-1])
    target = host if not prefix else (prefix if host == "model" else f"{host}.{prefix}")
    return parts[-1] in by_path.get(target, set())


def _term_value(host: str, term: str) -> tuple[str, str]:
    """The (host path, value name) an identity term on ``host`` names: ``self_attn.attention_output`` on
    ``layers[i]`` → ("layers[i].self_attn", "attention_output"); ``model.layers[i+1].layer_input`` →
    ("layers[i]", "layer_input"); ``layers[0].input`` on model → ("layers[i]", "input")."""
    parts = term.split(".")
    if parts[0] == "model" and len(parts) > 1:
        host, parts = "model", parts[1:]
    prefix = _term_prefix(host, parts[:-1])
    target = host if not prefix else (prefix if host == "model" else f"{host}.{prefix}")
    return target, parts[-1]


def _term_prefix(host: str, parts: Sequence[str]) -> str:
    """The host path a term's parts name below ``host``, with a stack's index as ``[i]`` (``layers[0]``,
    ``layers[i+1]``: a block of the stack) and a list item's kept (``self_attn[0]`` inside a block: the host
    ``layers[i].self_attn[0]``): an index is a list item's when the path is inside a block already."""
    inside = host != "model" and "[i]" in host
    out = []
    for part in parts:
        m = re.fullmatch(r"(.*)\[(\d+|i|i[+-]\d+)\]", part)
        if m is None:
            out.append(part)
        elif inside and m.group(2).isdigit():
            out.append(part)  # a list item of a block
        else:
            out.append(f"{m.group(1)}[i]")
            inside = True
    return ".".join(out)

