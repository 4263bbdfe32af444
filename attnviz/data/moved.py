"""What moves between words, from a record's value dot products (``LayerRecord.value_dots``).

A key word's contribution to a query word is the norm of the *summed* vectors of its tokens,
``‖Σ_{j∈J} β_Ij f_h(x_j)‖`` with ``β_Ij`` the query word's mean weight on token *j*:
``Σ_{j,j'∈J} β_Ij β_Ij' f_h(x_j)·f_h(x_j')`` under the root, whose terms are the dot products a
capture keeps for tokens up to one word apart (:meth:`attnviz.Capture.contributions` uses it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError
from .words import TokenSequence, group_matrix

__all__ = ["word_contributions"]


def word_contributions(
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
