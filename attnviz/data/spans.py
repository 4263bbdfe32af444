"""Which rows, columns and settings a recomputation reads: a capture's query rows or key columns as
Python reads an index (:data:`Span`), and the ``scale`` / ``causal`` arguments of
:meth:`attnviz.Capture.attention` checked and resolved."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ArgumentTypeError, InputError, OutOfRangeError

__all__ = ["Span", "check_causal", "row_index", "scale_factor", "span_index"]


def scale_factor(scale: object, model: float) -> float:
    """The factor on Q·Kᵀ that ``scale`` (of :meth:`Capture.attention`) means, the model's being ``model``."""
    if scale is True:
        return model
    if scale is False:
        return 1.0
    if isinstance(scale, (int, float)):
        return float(scale)
    raise ArgumentTypeError(f"scale must be True (the model's), False (none) or a number, got {scale!r}")


def check_causal(causal: object, part: str) -> None:
    """Refuse a ``causal`` (of :meth:`Capture.attention`) that is not None / True / False, or True for cross-attention."""
    if causal not in (None, True, False) or not isinstance(causal, (bool, type(None))):
        raise ArgumentTypeError(f"causal must be None (the model's), True or False, got {causal!r}")
    if causal is True and part == "cross":
        raise InputError(
            "cross-attention has no causal mask: each target token reads the whole source; leave causal=None (or False)"
        )


#: which query rows or key columns: a range, a slice, a sequence of ints or a 1-d tensor (None: all)
Span = range | slice | Sequence[int] | Tensor | None


def row_index(span: Span, n: int, name: str, what: str) -> Tensor:
    """:func:`span_index` as a tensor of indices always."""
    index = span_index(span, n, name, what, tensor=True)
    assert isinstance(index, Tensor)  # tensor=True
    return index


def span_index(span: Span, n: int, name: str, what: str, *, tensor: bool = False) -> Tensor | slice:
    """``span`` as a slice (a range or slice of step 1, unless ``tensor``) or a 1-d long tensor of
    indices, read as Python reads them: a slice clamps to ``0..n-1`` and may step backwards, an index
    may count from the end (``-1`` is the last); an :class:`OutOfRangeError` naming ``0..n-1`` for an
    index outside ``-n..n-1``."""
    if span is None:
        span = range(n)
    if isinstance(span, slice):
        span = range(*span.indices(n))
    if isinstance(span, range):
        if not len(span):
            return slice(0, 0) if not tensor else torch.zeros(0, dtype=torch.long)
        if span.step == 1 and 0 <= span[0] and span[-1] < n and not tensor:
            return slice(span.start, span.stop)
        span = list(span)
    if isinstance(span, Tensor):
        if span.dim() > 1 or span.dtype.is_floating_point or span.dtype == torch.bool:
            raise ArgumentTypeError(
                f"{name} must be a 1-d tensor of ints, got {span.dtype} of shape {tuple(span.shape)}"
            )
        index = span.long().flatten()
    elif isinstance(span, Sequence) and all(isinstance(x, int) and not isinstance(x, bool) for x in span):
        index = torch.tensor(list(span), dtype=torch.long)
    else:
        raise ArgumentTypeError(
            f"{name} must be a range, a slice, a sequence of ints or a 1-d tensor of ints, got {type(span).__name__}"
        )
    if index.numel():
        low, high = int(index.min()), int(index.max())  # one wait: the indices are checked once
        if low < -n or high >= n:
            raise OutOfRangeError(
                f"{name} must lie in 0..{n - 1} (or -{n}..-1 from the end; {n} {what}), got {low if low < -n else high}"
            )
        if low < 0:
            index = torch.where(index < 0, index + n, index)
    return index
