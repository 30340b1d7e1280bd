"""Pictures and notebook views of what a trace saved: ``plot`` (matplotlib figures, ``nnatlas.plot``; matplotlib
is imported when a function is called, ``pip install 'nnatlas[plot]'``) and ``show`` (self-contained HTML views for
notebooks, ``nnatlas.show``). They take saved tensors and a model, and draw; nothing of a trace runs here.

May import: ``nnatlas.errors`` and its own modules (a model is used through its public methods).
"""
