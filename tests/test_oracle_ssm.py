"""The oracle on the Mamba families, whose output_hidden_states starts after the first block
(hs[i] is block i's output): it passes on the specs as written and fails, naming the value, when a
spec reads the wrong tensor."""

from __future__ import annotations

import dataclasses

import pytest

from nnatlas import registry
from nnatlas.testing import suite as T


def _misread(family: str, path: str, name: str, source: str) -> object:
    fam = registry.get(family)
    hosts = []
    for h in fam.hosts:
        if h.path == path:
            src = h.value(source)
            assert src is not None
            h = dataclasses.replace(h, values=tuple(dataclasses.replace(v, read=src.read, view=src.view)
                                                    if v.name == name else v for v in h.values))
        hosts.append(h)
    return dataclasses.replace(fam, hosts=tuple(hosts))


def test_mamba_passes_as_written() -> None:
    assert T.oracle_checks("mamba") == (("hidden_states", "eager"), ("logits", "eager"))
    T.check_oracle("mamba", "hidden_states", "eager")


@pytest.mark.parametrize("name,source,says", [
    ("layer_output", "mixer_norm_output", "layers[0].layer_output vs hidden_states[0] (after each block)"),
    ("layer_input", "mixer_norm_output", "layers[1].layer_input vs hidden_states[0] (after each block)"),
])
def test_a_wrong_read_fails(monkeypatch: pytest.MonkeyPatch, name: str, source: str, says: str) -> None:
    monkeypatch.setitem(registry.all_families(), "mamba", _misread("mamba", "layers[i]", name, source))
    with pytest.raises(AssertionError, match=says.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        T.check_oracle("mamba", "hidden_states", "eager")
