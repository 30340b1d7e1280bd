"""Emit: everything written from the IR — the typed adapters and generated tests (``emit`` with ``templates/``,
the Python literals and checked names of ``pysource``, the jinja2 environment of ``templating``), the site's pages
(``pages``: each family's, the index, the matrix, status, llms.txt; its search index ``search_index``), the family
pages' model (``page_model``: its drawing ``diagram``, the values' ``cards``, the index's ``value_marks``, the
``config_words``), the spec and API references (``reference``, ``apiref``), the cookbook and the manual's pages
(``cookbook``, ``guide``, ``markdown``), the printouts on the meta device (``printouts``), the generated files' marks and
checks (``files``, ``pycheck``), the site's folder and its local server (``outdir``, ``serve``).

May import: ``nnatlas.compiler.language``, ``nnatlas.compiler.resolve``, ``nnatlas.compiler.status``, the runtime.
"""
