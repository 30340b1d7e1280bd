"""Values kept: ``model.cache(...)`` over one forward (``model_cache``), the folder ``nnatlas cache`` writes and
reads back, tamper-checked (``store``), and the dataset it runs over, planned deterministically per rank
(``data``).

May import: ``nnatlas.errors``, ``nnatlas.spec``, ``nnatlas.trace``, ``nnatlas.tree`` and its own modules; never the
loaders or the CLI (which sit above it).
"""
