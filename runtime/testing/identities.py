"""The identity checks: each identity of a block kind holds on every host of a drawn case that has it."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from ..errors import Unavailable
from ..tree.values import Value
from .cases import Case
from .values import assert_identity, each_host, host_specs, resolve_term, tensor_term


def _unavailable_term(host: Any, terms: tuple[str, ...], config: Mapping[str, Any], model: Any,
                      block: int | None) -> tuple[str, Any] | None:
    """The first term of an identity this load cannot serve, and why (the value says which load it needs)."""
    for term in terms:
        if term in config or tensor_term(host, term, model, block) is not None:
            continue
        handle = resolve_term(host, term, model, block)
        why = handle.unavailable() if isinstance(handle, Value) else None
        if why is not None:
            return term, why
    return None


def check_identity(case: Case, path: str, index: int, experts: str | None = None, replace: Any = None) -> None:
    """The spec's ``index``-th identity at ``path`` holds on every host of the drawn case that has it.
    ``replace``: an identity (``nnatlas.spec.Identity``) checked instead, on the same hosts: a
    mutation test's changed identity."""
    check_identities(case, path, (index,), experts, replace)


def _where(identity: Any, label: str, case: Case) -> str:
    """An identity check's place in its failure message (made only on failure: a case's repr draws its factors)."""
    return f"{identity.at + ': ' if identity.at else ''}{label} ({case!r})"


def identity_ids(groups: Any) -> list[str]:
    """The test ids of identity groups, ``(path, indices[, experts])``: ``layers[i]-0-1-2`` (``-grouped_mm``)."""
    return ["-".join([g[0], *map(str, g[1]), *map(str, g[2:])]) for g in groups]


def check_identities(case: Case, path: str, indices: tuple[int, ...], experts: str | None = None,
                     replace: Any = None) -> None:
    """Each of the identities ``indices`` at ``path`` (one block kind's: the generated tests group them so)
    holds on every host of the drawn case that has it: every host's terms read in one forward, every failure
    reported at once. A case none of them applies to (a block kind this drawn config lacks) is drawn again
    inside a property test (hypothesis fails the test when no drawn case has one); called outside one, such a
    case fails here."""
    if identities_checked(case, path, indices, experts, replace):
        return
    from hypothesis import assume, currently_in_test_context  # (a test dependency: imported where a test runs)

    if currently_in_test_context():
        assume(False)  # a block kind this drawn config lacks: draw another (none at all fails the test)
    raise AssertionError(f"no host at {path} of {case!r} has the identities {list(indices)}: nothing was checked")


def identities_checked(case: Case, path: str, indices: tuple[int, ...], experts: str | None = None,
                       replace: Any = None) -> int:
    """:func:`check_identities`' checks, without drawing again: how many (host, identity) pairs were checked, 0
    where no host of the case has one of the identities (a checkpoint's twin without that block kind)."""
    model = case.model("eager", experts)
    config = model.normalized_config
    checked = 0
    spec_ids = [i for s in model._family.hosts if s.path == path for i in s.identities]
    reads: list[tuple[str, Any, int | None, Any, dict[str, Any]]] = []
    for label, host in list(each_host(model, path)):
        identities = [i for s in host_specs(model, host) for i in s.identities]
        found = re.search(r"\[(\d+)\]", label)
        block = int(found.group(1)) if found else None
        for index in indices:
            if index >= len(spec_ids) or spec_ids[index] not in identities:
                continue
            identity = spec_ids[index] if replace is None else replace
            missing = _unavailable_term(host, identity.terms, config, model, block)
            if missing is not None:
                # this load cannot serve a term: reading it must say so, naming the load that serves it
                term, why = missing
                try:
                    with model.trace(dict(case.inputs)):
                        resolve_term(host, term, model, block).save()
                except Unavailable as e:
                    assert str(e) == str(why)
                else:
                    raise AssertionError(f"{label}.{term}: unavailable() says {why}, yet the trace read it")
                checked += 1  # checked: the value says which load it needs
                continue
            values: dict[str, Any] = {}
            for term in identity.terms:  # a parameter or buffer the identity names: read outside the trace
                tensor = tensor_term(host, term, model, block) if term not in config else None
                if tensor is not None:
                    values[term] = tensor
            reads.append((label, host, block, identity, values))
    if reads:  # every host's terms in one forward (a forward per host and identity was most of these tests' time)
        with model.trace(dict(case.inputs), order="any"):
            for _, host, block, identity, values in reads:
                for term in identity.terms:
                    if term in values:
                        continue
                    if term in config:
                        values[term] = config[term]
                    else:
                        values[term] = resolve_term(host, term, model, block).save()
    failures = []
    for label, _, _, identity, values in reads:
        values.setdefault("attention_mask", case.inputs.get("attention_mask"))
        lhs, rhs = identity.check(values)
        try:
            assert_identity(identity, lhs, rhs, functools.partial(_where, identity, label, case))
        except AssertionError as e:
            failures.append(str(e))
        checked += 1
    if failures:
        raise AssertionError(f"{len(failures)} of {len(reads)} identity checks failed:\n\n" + "\n\n".join(failures))
    return checked
