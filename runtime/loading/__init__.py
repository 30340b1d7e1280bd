"""Loading: ``nnatlas.wrap`` and ``nnatlas.load`` (``load``), a user's own spec or a draft compiled at load
(``user_specs``, the runtime's one door to the compiler, opened only inside a function), and what a type checker
sees of a wrapped model (``typed``, the generated adapters' bases).

May import: the facade (``nnatlas.model``), ``nnatlas.registry`` and every room below; not the CLI.
"""
