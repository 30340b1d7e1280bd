"""Resolve: specs (with ``extends:``, the shared vocabulary, cross-references) checked and turned into the family
IR (``resolve``), and the spec held against the module trees of its tiny configs and checkpoints (``treecheck``).

May import: ``nnatlas.compiler.language``, ``nnatlas.compiler.errors``, the runtime's data model; not emit.
"""
