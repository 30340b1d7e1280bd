"""``nnatlas.AtlasModel``: a transformers model under its family's standard names, and what a researcher
calls on it: ``trace`` and ``generate`` (read and edit values in one forward), ``cache`` (values by standard
path), ``support()`` and ``print(model)``. How it is built: :mod:`nnatlas.loading.load` (``wrap``, ``load``)."""

from __future__ import annotations

from typing import Any

from . import registry
from .cache.model_cache import Cache, cache_values
from .errors import InputError, NnatlasError, UnknownName
from .inputs.prepare import prepare
from .parallel import tensor_parallel
from .trace.tracer import Tracer
from .tree import foreign_names, readout, saes, tables
from .tree.describe import Support, block_runs, load_facts, render, support
from .tree.given import refuse_compiled
from .tree.targets import ModelTargets
from .tree.values import Value


class AtlasModel(ModelTargets):
    """A transformers model wrapped with its family adapter.

    ``model.layers[i].mlp.mlp_output`` and every other standard name resolve to the native
    modules; ``model.trace(...)`` reads and edits them; ``model.support()`` says what this
    load serves; ``print(model)`` shows the native tree with standard names and values.
    """
    # ---- tracing ----
    def trace(self, inputs: Any = None, *, order: str = "strict", grad: bool = False, **kwargs: Any) -> Tracer:
        """Record reads and edits in the ``with`` body; the forward runs when the block ends.

        ``inputs``: a prompt, a list of prompts (left-padded), token ids, or a dict of model
        inputs; extra keyword arguments go to the forward. ``order="any"`` serves requests in
        whatever order the forward reaches them. ``grad=True`` keeps autograd through the
        forward (unless grad mode is off around the trace): every saved tensor is then an autograd
        view of the forward's tensor, a backward from any of them (or from anything computed from
        them) reaches the model, and fills ``.grad`` of every saved value it reaches, the gradient
        with respect to the value where the forward computed it. Edits stay differentiable.
        """
        if grad is not False:
            if grad is not True:
                raise InputError(f"trace(grad=...): expected True or False, got {grad!r}")
            if self._tp is not None:
                tensor_parallel.refuse_grad(self.family)
        module = self._module
        if "_peft" in self.__dict__ or module.__dict__.get("_compiled_call_impl") is not None:
            module = self._runner()  # (a PeftModel's forward; a model compiled in place is refused)
        prepared = prepare(self, inputs, kwargs)
        if grad is False and order == "strict":  # (the common trace, made without Tracer.__init__'s choices)
            return Tracer._plain(self, prepared, module)
        return Tracer(self, None, order, grad, inputs=prepared, call=module)

    @property
    def peft(self) -> Any:
        """The ``peft`` PeftModel this model was wrapped from (its forward is the one a trace runs), or None.
        ``model.native`` is the transformers model inside it, where the standard names resolve."""
        return self.__dict__.get("_peft")

    def _runner(self) -> Any:
        """What a trace calls: the PeftModel when wrapped from one, else the transformers model; refused
        when either has been compiled in place since it was wrapped (before anything compiles)."""
        module = self._module
        peft = self.__dict__.get("_peft")
        if module.__dict__.get("_compiled_call_impl") is not None:
            refuse_compiled(module, "trace")
        if peft is not None:
            if peft.__dict__.get("_compiled_call_impl") is not None:
                refuse_compiled(peft, "trace")
            return peft
        return module

    def generate(self, inputs: Any = None, *, max_new_tokens: int = 8, order: str = "strict", **kwargs: Any) -> Tracer:
        """Like ``trace`` over ``generate``: the body reads step 0 unless inside ``tracer.iter[...]``."""
        model_inputs = prepare(self, inputs, {})
        gen = getattr(self._runner(), "generate", None)
        if gen is None:
            raise NnatlasError(f"{type(self._module).__name__} cannot generate")
        settings = {"max_new_tokens": max_new_tokens, "do_sample": False, "min_new_tokens": max_new_tokens, **kwargs}
        pad = getattr(self._tokenizer, "pad_token_id", None) if self._tokenizer is not None else None
        if pad is not None:
            settings.setdefault("pad_token_id", pad)
        return Tracer(self, lambda: gen(**model_inputs, **settings), order=order, steps=max_new_tokens,
                      inputs=model_inputs)

    def cache(self, inputs: Any = None, values: Any = None, layers: Any = None, **kwargs: Any) -> Cache:
        """One traced forward; the values ``values`` x ``layers`` name, as an :class:`nnatlas.Cache`
        keyed by standard path (``layers[3].layer_output``). Extra keyword arguments go to the forward.
        See :mod:`nnatlas.cache.model_cache`."""
        return cache_values(self, self.trace(inputs, order="any", **kwargs), values, layers)

    # ---- the readout ----
    def unembed(self, x: Any) -> Any:
        """A residual stream (``[..., hidden_size]``, a saved value) read out as logits, as the model reads out its
        last one: the final norm, the head, then its softcaps, scales and multipliers (see :mod:`nnatlas.tree.readout`).
        ``unembed(model.layers[-1].layer_output)`` equals ``logits``; gradients flow through it."""
        return readout.unembed(self, x)

    def logit_lens(self, values: Any) -> Any:
        """``unembed`` of each value: a tensor, or a list, tuple or dict of them (the same container back)."""
        return readout.logit_lens(self, values)

    # ---- names ----
    def value(self, name: Any) -> Value:
        """The value a name stands for, standard or from elsewhere: ``layers[3].layer_output``, a TransformerLens
        hook (``blocks.3.hook_resid_post``, ``blocks.0.attn.hook_pattern``), or an nnsight / transformers module
        path with its boundary (``model.model.layers[3].output``, ``model.layers.3.mlp.down_proj.input``).
        The family page's "coming from" table lists the same map. Raises UnknownName saying what it expected.
        ``name`` may be an SAE (sae-lens's, or anything with ``cfg.metadata.hook_name``): the value its hook name
        stands for, checked to fit it (its ``d_in``, no reshaping of its own; see :mod:`nnatlas.tree.saes`)."""
        if not isinstance(name, str) and hasattr(name, "cfg"):
            return saes.value(self, name)  # type: ignore[no-any-return]
        if not isinstance(name, str) or not name.strip():
            raise UnknownName(f"model.value: expected a name such as 'layers[3].layer_output', got {name!r}")
        foreign = (foreign_names.transformer_lens(self, name), foreign_names.module_path(self, name))
        for path in dict.fromkeys(p for p in (*foreign, name) if p):
            try:
                found = foreign_names.walk(self, path)
            except (AttributeError, IndexError, ValueError):
                continue
            if isinstance(found, Value):
                return found
            label = getattr(found, "_label", path) or "model"
            raise UnknownName(f"{name} is the module {label}, not a value: read model.{label}.output or "
                              f"model.{label}.input, or one of its values (model.support())")
        point = foreign_names.sae_point(name)
        why = (f"'{name}' is an SAE hook point for {point}: name a block, as in blocks.3.hook_{name}" if point else
               "expected a standard path (layers[3].layer_output), a TransformerLens hook (blocks.3.hook_resid_post) "
               "or an nnsight / transformers module path with .output or .input (model.model.layers[3].output)")
        raise UnknownName(f"{name} is no value of {self.family}: {why}")

    # ---- introspection ----
    def support(self) -> Support:
        found = support(self)
        origin = registry.origin(self._family)  # a family not shipped: your spec file, or a draft and what verified it
        if origin:
            found.family = f"{found.family} ({origin})"
        return found

    def __repr__(self) -> str:
        return render(self)

    def _repr_html_(self) -> str:
        """The notebook view: this load's facts, its blocks, and ``print(model)`` folded below them."""
        blocks = tables.table(("blocks", "class", "kind"), block_runs(self))
        return tables.view(f"family {self.family}", [blocks], load_facts(self), render(self), "print(model)")

    def __str__(self) -> str:
        return self.__repr__()
