"""The status matrix: every family's generated tests under each supported transformers version (``status``) and
the pytest plugin that records their outcomes (``status_plugin``).

May import: ``nnatlas.compiler.language``, ``nnatlas.compiler.resolve``, ``nnatlas.compiler.errors``.
"""
