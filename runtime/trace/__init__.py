"""The trace: what happens between ``with model.trace(...)`` and its end.

The tracer (``tracer``) turns the values a trace body asks for into requests (``requests``: a value's site, its
box, its edits), installs one mechanism per read point for the length of one forward (``installers``: module
boundaries and child boundaries; ``function_sites``: module-level functions; ``op_scopes`` and ``patterns``: an
operation inside a forward, attention patterns recomputed; ``sites``: the table of what can be patched), serves
placeholders before a value exists (``placeholders``), stops a forward early (``interrupts``), and evaluates a spec's
conditions and expression functions (``conditions``, ``expressions``). ``protocols`` types what the trace needs of a
wrapped model. Nothing installed here outlives one forward.

May import: ``nnatlas.errors``, ``nnatlas.spec`` and its own modules; nothing of the other rooms.
"""
