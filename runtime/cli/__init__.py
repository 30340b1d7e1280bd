"""Entry points: ``nnatlas cache``, run over a dataset: the command (``cache``: its arguments, checks and the run),
its processes (``ranks``: torchrun ranks and data-parallel groups, the shard-writing thread), the rows a batch
becomes (``rows``) and the output folder (``out``: taken, resumed, its manifest). A CLI sits above what it calls
(the loaders and the cache); nothing imports it but the program's entry point. It loads the model only when a
command runs (``nnatlas cache --help`` stays quick), so its imports of the loaders sit inside functions.

May import: every room of the runtime.
"""
