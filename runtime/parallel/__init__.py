"""Tensor parallel: a model sharded by transformers' own TP plan, its values rank-local or gathered
(``tensor_parallel``).

May import: ``nnatlas.errors``, ``nnatlas.spec``, ``nnatlas.trace``; nothing above.
"""
