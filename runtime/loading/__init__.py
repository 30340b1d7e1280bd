"""Loading: ``nnatlas.wrap`` and ``nnatlas.load`` (``load``), a user's own spec or a draft compiled at load
(``user_specs``, the runtime's one door to the compiler, opened only inside a function), what the status matrix
says of a family under the installed transformers (``version_status``: a warning or a refusal at load), and what a
type checker sees of a wrapped model (``typed``, the generated adapters' bases).

May import: the facade (``nnatlas.model``), ``nnatlas.registry`` and every room below; not the CLI.
"""
