"""Flex attention run uncompiled, for tests on CPU.

transformers compiles flex attention the first time a model calls it (``WrappedFlexAttention``, a
singleton holding ``torch.compile(flex_attention)``) and builds each call's ``BlockMask`` with
``create_block_mask(..., _compile=True)``: on CPU that takes minutes per family, more than CI can
spend. Uncompiled, both are the same functions (torch's own ``flex_attention`` and
``create_block_mask``, which the compiled ones trace), run eagerly: what a test checks about flex
attention's inputs and outputs holds for the compiled kernel. Even uncompiled, torch's
``flex_attention`` traces its operator with Dynamo (an eager backend) once per new score or mask
function, about a second per family on CPU (measured); its debug switch
(``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``) calls the same operator without that trace, which has no
backward: the context is for forward checks. The runtime never imports this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_MISSING = object()

# transformers refuses a family with this trait under flex attention on CPU ("Attention sinks cannot be
# run on CPU with flex attention", integrations/flex_attention.py: flex returns no log-sum-exp on CPU, and
# the sinks are applied with it); compiler/emit/emit.py renders no flex pattern test for it either
REFUSED_ON_CPU = "Attention sinks"


def runs_on_cpu(family: str, traits: tuple[str, ...]) -> bool:
    """Whether a traced pattern read of ``family`` (with these traits) runs under flex attention on CPU."""
    return REFUSED_ON_CPU not in traits


@contextmanager
def uncompiled_flex_attention() -> Iterator[None]:
    """For its duration, transformers' flex attention calls torch's ``flex_attention`` uncompiled (its
    operator run directly, forward only) and builds its block masks with ``_compile=False``. It changes
    three things and restores each exactly, also on error: the ``_instance`` of ``WrappedFlexAttention``
    (a singleton whose ``__init__`` would compile; a subclass instance stands in, so whatever instance
    there was is untouched), the ``create_block_mask`` global of ``transformers.masking_utils`` and
    torch's ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``."""
    import torch.nn.attention.flex_attention as torch_flex
    import transformers.masking_utils as masking
    from transformers.integrations.flex_attention import WrappedFlexAttention

    flex_attention, create_block_mask = torch_flex.flex_attention, torch_flex.create_block_mask

    class Uncompiled(WrappedFlexAttention):
        def __init__(self, training: bool) -> None:  # the singleton's __init__ compiles: nothing to do here
            pass

        def __call__(self) -> Callable[..., Any]:
            return flex_attention

    def block_mask(*args: Any, **kwargs: Any) -> Any:
        return create_block_mask(*args, **{**kwargs, "_compile": False})

    changed = [(WrappedFlexAttention, "_instance", object.__new__(Uncompiled)),
               (masking, "create_block_mask", block_mask),
               (torch_flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True)]
    before = [(owner, name, owner.__dict__.get(name, _MISSING)) for owner, name, _ in changed]
    try:
        for owner, name, value in changed:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(before):
            _restore(owner, name, value)


def _restore(owner: Any, name: str, value: Any) -> None:
    if value is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, value)
