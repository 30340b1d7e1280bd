"""What ``save()`` hands back while the trace body runs: a tensor that has no value yet.

The forward runs when the ``with`` block ends, so inside the body a saved tensor is only a promise. It
is a :class:`Placeholder`, a ``torch.Tensor`` subclass whose every use (``.shape``, ``.data``,
``.item()``, ``len``, arithmetic …) raises :class:`~nnatlas.errors.NnatlasError` saying the value exists
after the block, instead of answering for an empty tensor of shape ``[0]``. When the block ends, before
the forward, the tracer makes each one a plain ``torch.Tensor`` again (``__class__`` assignment:
the same object the body holds), which the forward then fills; after the trace nothing of this class
is left on a saved value.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..errors import NnatlasError


class Placeholder(torch.Tensor):
    """A saved tensor inside the trace body: no value until the block ends (see the module's doc)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        label = "a saved value"
        for a in (*args, *(kwargs or {}).values()):
            if type(a) is Placeholder:
                label = a.__dict__.get("_nnatlas_label", label)
                break
        name = getattr(func, "__name__", None) or getattr(getattr(func, "__self__", None), "__name__", "")
        what = f".{name}" if name and not name.startswith("_") else f" ({name})" if name else ""
        if label.endswith(ABANDONED):
            raise NnatlasError(f"{label[:-len(ABANDONED)]}{what}: the trace's block raised before its forward ran, so "
                               "it was never computed; run the trace again")
        raise NnatlasError(f"{label}{what}: a saved value exists only after the trace's block ends (the forward "
                           "runs then); inside the body it is a placeholder with no shape, data or items. Use it after "
                           "the with block, or use the value itself (model....output) in an edit or expression")

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        label = self.__dict__.get("_nnatlas_label", "a saved value")
        if label.endswith(ABANDONED):
            return f"<placeholder for {label[:-len(ABANDONED)]}: never filled, the trace's block raised>"
        return f"<placeholder for {label}: filled when the trace's block ends>"

    def __len__(self) -> int:
        return self.__torch_function__(torch.Tensor.__len__, (Placeholder,), (self,))  # type: ignore[no-any-return]

    def __bool__(self) -> bool:
        return self.__torch_function__(torch.Tensor.__bool__, (Placeholder,), (self,))  # type: ignore[no-any-return]

    def __iter__(self) -> Any:
        return self.__torch_function__(torch.Tensor.__iter__, (Placeholder,), (self,))

    def __format__(self, spec: str) -> str:
        return self.__repr__()


def placeholder(empty: torch.Tensor, label: str) -> torch.Tensor:
    """A fresh placeholder of ``empty``'s dtype (its own storage), labelled for the messages: a new plain
    tensor whose class is set to :class:`Placeholder` (half the time of ``Tensor._make_subclass``)."""
    p = empty.new()
    p.__class__ = Placeholder  # type: ignore[assignment]
    p.__dict__["_nnatlas_label"] = label
    return p


ABANDONED = " (abandoned)"


def plain(holders: list[Any]) -> None:
    """Placeholders that ``save()`` made become plain tensors again, as the block ends (the same objects)."""
    for h in holders:
        h.__dict__.pop("_nnatlas_label", None)
        h.__class__ = torch.Tensor


def abandon(holders: Iterable[Any]) -> None:
    """The block raised: its placeholders are never filled, and every use says so (they stay placeholders)."""
    for h in holders:
        if type(h) is Placeholder and not h.__dict__.get("_nnatlas_label", "").endswith(ABANDONED):
            h.__dict__["_nnatlas_label"] = h.__dict__.get("_nnatlas_label", "a saved value") + ABANDONED
