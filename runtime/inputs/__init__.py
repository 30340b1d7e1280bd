"""The inputs: what ``trace``, ``generate`` and ``cache`` accept, checked and turned into the forward's keyword
arguments (``prepare``), the checks themselves (``validate``: ids in the vocabulary, layouts' sizes, edits' shapes)
and a processor for prompts with images (``processing``).

May import: ``nnatlas.errors``, ``nnatlas.spec``, ``nnatlas.trace`` (its protocols) and its own modules.
"""
