"""Resolve: specs (with ``extends:``, the shared vocabulary, cross-references) checked and turned into the family
IR, and the spec held against the module trees of its tiny configs and checkpoints.

- ``resolve``: the entry points (``resolve``, ``resolve_texts``, ``resolve_sources``): sources in, the ``Atlas`` out.
- ``sources``: the spec folder read (positions kept), pydantic's errors positioned, the vocabulary checked, the
  shared notes, papers and parts read.
- ``merge``: a family's files merged over its ``extends:`` bases and included parts, positions following.
- ``family``: one merged family built into its ``FamilyIR`` (identity, names, config, functions, diagram), made of
  the mixins over ``context`` (the family being resolved, where its problems go):
  ``hosts`` (hosts and values), ``identities`` (identity terms and positional reads), ``tiny`` (the tiny model and
  the checkpoints' sizes), ``notes`` (the notes and their examples).
- ``treecheck``: the resolved spec against the module trees of its tiny configs and checkpoints.

May import: ``nnatlas.compiler.language``, ``nnatlas.compiler.errors``, the runtime's data model; not emit.
"""
