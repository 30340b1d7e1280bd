"""The standard-name tree of a wrapped model: its hosts (``hosts``), their value handles (``values``) and the
deferred expressions built from them (``lazy``), the native module tree matched to the spec (``model_tree``), the
model's targets (``targets``: what ``model.layers[3].mlp`` resolves to), the printout and ``support()``
(``describe``), functions tools ask of the tree (``introspect``), TransformerLens and nnsight names
(``foreign_names``), the readout (``readout``: ``unembed``, ``logit_lens``) and the model as given (``given``: PEFT,
torch.compile).

May import: ``nnatlas.errors``, ``nnatlas.spec``, ``nnatlas.trace``, ``nnatlas.inputs``, ``nnatlas.parallel`` and
its own modules; not the cache, the loaders or the facade.
"""
