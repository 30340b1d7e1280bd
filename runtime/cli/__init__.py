"""Entry points: ``nnatlas cache`` (``cache``), run over a dataset. A CLI sits above what it calls (the loaders and
the cache); nothing imports it but the program's entry point.

May import: every room of the runtime.
"""
