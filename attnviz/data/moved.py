"""What a head moves between words, from a record's value dot products (``LayerRecord.value_dots``).

What a key word moves into a query word is the norm of the *summed* vectors of its tokens,
``‖Σ_{j∈J} β_Ij f_h(x_j)‖`` with ``β_Ij`` the query word's mean weight on token *j*:
``Σ_{j,j'∈J} β_Ij β_Ij' f_h(x_j)·f_h(x_j')`` under the root, whose terms are the dot products a
capture keeps for tokens up to one word apart (:meth:`attnviz.Capture.moved` uses it).
:class:`WhatMoves` is that part of :class:`attnviz.Capture`: the value norms and :meth:`~attnviz.Capture.moved`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..deprecation import warn_renamed
from ..errors import InputError
from .words import TokenSequence, group_matrix

if TYPE_CHECKING:
    from .records import LayerRecord
    from .spans import Span

__all__ = ["WhatMoves", "word_moved"]


def word_moved(
    weights: Tensor,  # [head, query_pos, key_pos]
    dots: Tensor,  # [head, key_pos, width]: f_h(x_j)·f_h(x_{j-t})
    queries: TokenSequence,
    keys: TokenSequence,
) -> Tensor:  # [head, query word, key word]
    """The norm of the summed vector each query word receives from each key word's tokens."""
    word_of = torch.empty(keys.n_tokens, dtype=torch.long)
    for i, w in enumerate(keys.words):
        word_of[w.token_start : w.token_stop] = i
    longest = max((w.token_stop - w.token_start for w in keys.words), default=1)
    if longest > dots.shape[-1]:
        raise InputError(f"the value dot products reach words of up to {dots.shape[-1]} tokens, not {longest}")
    to_sum = group_matrix(keys.words, keys.n_tokens).to(weights)  # [word, token]
    from_mean = group_matrix(queries.words, queries.n_tokens, mean=True).to(weights)
    mean = from_mean @ weights  # [head, query word, key token]: β
    dots = dots.to(weights)
    squared = (mean.square() * dots[:, None, :, 0]) @ to_sum.T
    for t in range(1, min(longest, keys.n_tokens)):
        same = (word_of[t:] == word_of[:-t]).to(weights)  # token j and j - t in one word
        pair = mean[..., t:] * mean[..., :-t] * (dots[:, None, t:, t] * same)
        squared = squared + 2 * pair @ to_sum[:, t:].T
    return squared.clamp_min(0).sqrt()


class WhatMoves:
    """What each head moves (Kobayashi et al. 2020), a part of :class:`attnviz.Capture`: the value norms it
    kept and what is moved, ``α_ij · ‖f_h(x_j)‖``, with the weights it recomputes."""

    if TYPE_CHECKING:  # the capture's addressing and recomputation, which these methods read

        def layer(self, layer: int, part: str | None = None) -> LayerRecord: ...
        def sequences(self, part: str | None = None) -> tuple[TokenSequence, TokenSequence]: ...
        def attention(
            self,
            layer: int,
            head: int | None = None,
            *,
            part: str | None = None,
            causal: bool | None = None,
            scale: bool | float = True,
            temperature: float = 1.0,
            words: bool = False,
            rows: Span = None,
            cols: Span = None,
        ) -> Tensor: ...

    def value_norms(self, layer: int, *, part: str | None = None) -> Tensor:  # [head, key_pos]
        """‖f_h(x_j)‖ per head and key, float32: the norm of what head *h* would move from key *j*
        at weight 1 — ``f_h(x_j) = W_O^h v_j``, the head's slice of the layer's output projection
        applied to the value it reads (the value projection's bias included; the output
        projection's bias, added once per layer, is no head's). Kept while capturing."""
        return self._moved(layer, part).value_norms  # type: ignore[return-value]

    def _moved(self, layer: int, part: str | None) -> LayerRecord:
        rec = self.layer(layer, part)
        if rec.value_dots is None:
            raise InputError(
                f"this capture holds no value norms for layer {layer}: it was captured without them "
                f"(capture(..., keep=) or --keep without 'norms'), its attention module {rec.name!r} has no output "
                "projection attnviz could read, or the capture file was written before attnviz kept value norms; "
                "capture it again, or show the weights instead"
            )
        return rec

    def moved(
        self,
        layer: int,
        head: int | None = None,
        *,
        part: str | None = None,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """What each head moves from each key into each query: ``‖α_ij · f_h(x_j)‖ = α_ij · ‖f_h(x_j)‖``
        (Kobayashi et al. 2020), float32, with the weights of :meth:`attention` under the same
        ``causal``, ``scale`` and ``temperature``.

        ``words=True`` gives ``[word, word]``: the norm of the *summed* vector a query word receives
        from a key word's tokens, ``‖Σ_{j∈J} β_Ij f_h(x_j)‖`` with ``β_Ij`` the query word's mean weight
        on token *j* — not the sum of the tokens' norms, which would count two tokens moving
        opposite vectors as moving twice as much when together they move nothing.
        """
        rec = self._moved(layer, part)
        assert rec.value_dots is not None  # _moved refuses a record without
        weights = self.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature)
        index = None if head is None else rec.head_index(head)  # the model's head → its place in the stacks
        dots = rec.value_dots if index is None else rec.value_dots[index : index + 1]
        weights = weights if head is None else weights[None]
        if words:
            moved = word_moved(weights, dots, *self.sequences(part))
        else:
            moved = weights * dots[..., 0].clamp_min(0).sqrt().to(weights)[:, None, :]
        return moved if head is None else moved[0]

    def contributions(self, layer: int, head: int | None = None, **kwargs: Any) -> Tensor:
        """:meth:`moved` under its old name (deprecated: it goes in the next release)."""
        warn_renamed("Capture.contributions()", "Capture.moved()")
        return self.moved(layer, head, **kwargs)
