"""nnatlas in the same process as nnsight: a researcher compares the two in one run (the bench does too).

nnsight 0.8 puts a ``save`` on every object when it is imported (``object.save``), so a module attribute served
lazily by the module's ``__getattr__`` is never asked for: ``nnatlas.save`` was nnsight's, and saving a computed
tensor in an nnatlas trace failed with nnsight's "save() was called outside a trace" (seen when tests/test_bench.py
ran before tests/test_computed_saves.py on one worker). Each case runs in a fresh interpreter, so that the import
order is the one named and nnsight's patch stays out of this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("nnsight", reason="nnsight is the optional `bench` extra (pip install -e '.[bench]')")

SCRIPT = """
import torch
{first}
{second}
from nnatlas.testing import build
from nnatlas.testing.suite import first_params

model = build("llama", first_params("llama"))
ids = {{"input_ids": torch.tensor([[1, 2, 3, 4, 5]])}}
assert "save" in dir(object()), "nnsight no longer patches object: this test's premise is gone"
# every public name of nnatlas is nnatlas's own, not an attribute every object has
for name in nnatlas.__all__:
    assert getattr(nnatlas, name) is not getattr(object(), name, None), name
with torch.no_grad():
    with model.trace(ids):
        x = model.layers[1].layer_output
        kept = nnatlas.save({{"norm": x.norm(dim=-1), "both": (x * 2, x + 1)}})
        plain = x.save()
hook = []
h = model.native.model.layers[1].register_forward_hook(lambda m, a, out: hook.append(out[0] if isinstance(out, tuple) else out))
with torch.no_grad():
    model.native(**ids)
h.remove()
assert torch.equal(plain, hook[0])
assert torch.equal(kept["norm"], hook[0].norm(dim=-1))
assert torch.equal(kept["both"][0], hook[0] * 2) and torch.equal(kept["both"][1], hook[0] + 1)
try:
    with model.trace(ids):
        nnatlas.save(torch.ones(2))
except nnatlas.NnatlasError as e:
    assert str(e).startswith("nnatlas.save: its argument is a tensor that exists already"), e
else:
    raise AssertionError("nnatlas.save of an existing tensor did not refuse")
print("ok")
"""


@pytest.mark.parametrize("order", ["nnatlas first", "nnsight first"])
def test_nnatlas_save_is_its_own_beside_nnsight(order: str) -> None:
    first, second = "import nnatlas", "import nnsight"
    if order == "nnsight first":
        first, second = second, first
    script = textwrap.dedent(SCRIPT.format(first=first, second=second))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
