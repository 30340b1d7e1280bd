"""Test helpers for nnatlas: tiny random models and inputs, and the checks a family's tests run (also a spec of
your own: ``nnatlas generate`` writes them for it). A package of its own that imports the runtime and is never
imported by it; it changes no global setting (the tests' conftest and the generated tests set one torch thread).

    from nnatlas import testing
    model = testing.build("llama")                        # a tiny random model of a family, wrapped
    perturbed = testing.build("llama", perturbed=True)    # its scalar factors and constant weights drawn off defaults
    testing.check_identities(case)                        # a generated test's checks (cases: testing.suite.draw_case)

Everything else the generated tests and nnatlas's own tests use (draws, cases, constants, the oracle's pieces) is
in :mod:`nnatlas.testing.suite`; the modules hold the code: the drawn cases and fixed inputs (``cases``), the checks
(``served``: shapes, support(), missing values, native classes; ``identities``, ``edits``, ``image_text``, the
recomputed ``patterns``, the notes' ``examples``), ``tiny``, ``perturb``, ``oracle``, ``gradients``, ``twins``,
``values``, ``flex``, ``allocations``, ``tp_oracle``.
"""

from .cases import PROMPT
from .edits import check_edit, check_readonly
from .gradients import check_gradients
from .identities import check_identities, check_identity
from .oracle import check_oracle, oracle_checks
from .perturb import perturb_config, perturb_params, perturb_tensors
from .served import check_missing, check_shapes, check_support
from .tiny import WORDS, build, draw_inputs, shared_build
from .twins import twin

__all__ = ["PROMPT", "WORDS", "build", "check_edit", "check_gradients", "check_identities", "check_identity",
           "check_missing", "check_oracle", "check_readonly", "check_shapes", "check_support", "draw_inputs", "oracle_checks",
           "perturb_config", "perturb_params", "perturb_tensors", "shared_build", "twin"]


def __dir__() -> list[str]:
    return sorted([*__all__, "suite"])
