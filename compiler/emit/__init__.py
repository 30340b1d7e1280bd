"""Emit: everything written from the IR — the typed adapters and generated tests (``emit`` with ``templates/``),
the family pages' model (``page_model``), the spec and API references (``reference``, ``apiref``), the cookbook
and the manual's pages (``cookbook``, ``guide``, ``markdown``), the printouts on the meta device (``printouts``), the generated files' marks and
checks (``files``, ``pycheck``), the site's folder and its local server (``outdir``, ``serve``).

May import: ``nnatlas.compiler.language``, ``nnatlas.compiler.resolve``, ``nnatlas.compiler.status``, the runtime.
"""
