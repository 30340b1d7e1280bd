"""The public namespaces hold the API and nothing else: dir(nnatlas) is its __all__ and its lazily imported
submodules (no Any, annotations, importlib or TYPE_CHECKING), every listed name resolves; nnatlas.testing exports
the few helpers a user calls, and the rest (what the generated tests use) is in nnatlas.testing.suite."""

from __future__ import annotations

import subprocess
import sys

import nnatlas
import nnatlas.testing


def test_dir_nnatlas_is_the_api() -> None:
    listed = dir(nnatlas)
    assert listed == sorted({*nnatlas.__all__, "plot", "show", "testing"})
    assert not {"Any", "annotations", "importlib", "TYPE_CHECKING", "_importlib", "hosts", "trace"} & set(listed)
    for name in listed:
        assert getattr(nnatlas, name) is not None, name
    # nnatlas.save is defined in the package (nnsight's object.save would answer a lazy one: test_beside_nnsight)
    assert nnatlas.save is vars(nnatlas)["save"] and nnatlas.plot.__name__ == "nnatlas.views.plot"


def test_import_nnatlas_still_imports_no_torch_and_no_matplotlib() -> None:
    code = "import sys, nnatlas; dir(nnatlas); print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]"
    code = "import sys, nnatlas; nnatlas.plot, nnatlas.show; print('matplotlib' in sys.modules)"  # on a call only
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "False"


def test_nnatlas_testing_exports_the_users_helpers() -> None:
    public = set(nnatlas.testing.__all__)
    assert {"build", "perturb_params", "check_identities", "check_oracle", "check_gradients"} <= public
    assert len(public) < 25 and not any(n.startswith("_") for n in public)
    assert set(dir(nnatlas.testing)) == public | {"suite"}
    from nnatlas.testing import suite

    assert {"Case", "draw_case", "first_params", "standard_values"} <= set(suite.__all__)
    assert all(getattr(nnatlas.testing, n) is getattr(suite, n) for n in public)  # one object, two doors
