"""The spec language (``language``): the YAML loader that keeps file:line:col (``yamlpos``), the pydantic models of a spec
(``models``, extra keys refused), the shared presets (``presets``), names (``names``), the expression grammar
(``expr``) and read points (``readpoint``), and the frozen family IR everything after resolve reads (``ir``).

May import: ``nnatlas.compiler.errors``, ``nnatlas.spec`` and its own modules.
"""
