"""One query's row, by weight and moved: each key's weight α_ij beside its share of what the
head moves into the query, ``α_ij·‖f(x_j)‖ / Σ_j' α_ij'·‖f(x_j')‖`` (Kobayashi et al. 2020).

A weight says where a query looks; the moved share says how much of the vector the head writes into
the query comes from each key. A large weight on a key whose value the head barely projects
(``f(x) = W_O·v`` short) moves little — the seeds' point that a high weight is not a copy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..data.moved import word_moved
from ..data.words import TokenSequence, Word, WordIndex
from ..errors import OutOfRangeError

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture

__all__ = ["moved_shares", "row_shares"]


def row_shares(
    cap: Capture,
    layer: int,
    head: int,
    query: int,
    *,
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
    words: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:  # weight [key], moved [key], moved share [key]
    """(weights, moved, moved shares) of one query's row, float32 on the CPU: ``α_ij``,
    ``α_ij·‖f(x_j)‖`` (:meth:`~attnviz.Capture.moved`, with the same switches) and
    ``moved_j / Σ_j' moved_j'`` (all zeros when the head moves nothing into the query).

    ``words=True``: a word query's mean weights summed over a key word's tokens, and the norm of the
    summed vector the word moves. Raises :class:`~attnviz.errors.InputError` when the layer holds no
    value norms (its module has no output projection attnviz could read)."""
    switches: dict[str, Any] = dict(part=part, causal=causal, scale=scale, temperature=temperature)
    norms = cap.value_norms(layer, part=part)  # [head, key]; refuses a layer without norms
    queries, keys = cap.sequences(part)
    n = len(queries.words) if words else queries.n_tokens
    if not 0 <= query < n:
        raise OutOfRangeError(f"query {query} is out of range: 0..{n - 1}")
    if words:  # only the query word's token rows (O(its tokens × keys), not the head's whole map):
        # its mean weights summed over each key word, and the norm of the summed vectors each key word moves
        # (the capture's dot products, not a sum of norms) — cap.moved(words=True)[query]'s numbers
        word = queries.words[query]
        span = range(word.token_start, word.token_stop)
        rows = cap.attention(layer, head, rows=span, **switches)  # [its tokens, key]
        alone = TokenSequence(
            "", [""] * len(span), [0] * len(span), [(0, 0)] * len(span), [Word("", 0, 0, 0, len(span))]
        )
        dots = cap.layer(layer, part).value_dots
        at = cap.head_index(layer, head, part)
        assert dots is not None  # value_norms refused a layer without
        to_words = WordIndex.of_words(keys.words, keys.n_tokens, rows.device)
        weight = to_words.sum_along(rows.mean(0), -1).float().cpu()  # the word's rows averaged, key words summed
        moved = word_moved(rows[None].float(), dots[at : at + 1], alone, keys)[0, 0].float().cpu()
    else:  # the same α·‖f(x)‖ as cap.moved, without computing the head's map twice
        weight = cap.attention(layer, head, rows=[query], **switches)[0].float().cpu()
        moved = weight * norms[cap.head_index(layer, head, part)].float().cpu()  # the model's head → its row
    total = moved.sum()
    share = moved / total if float(total) > 0 else torch.zeros_like(moved)
    return weight, moved, share


def moved_shares(
    cap: Capture,
    layer: int,
    head: int,
    query: int,
    *,
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
    words: bool = False,
) -> pd.DataFrame:
    """One query's row as a table, one line per key (index ``key``, its position in tokens or words):
    ``label``, ``weight`` (α), ``moved`` (α·‖f(x)‖), ``moved_share`` (its share of what the head moves
    into the query) and ``ratio`` (``moved_share / weight``: above 1 the key moves more than its weight
    says, below 1 less; NaN at weight 0). The switches are :meth:`~attnviz.Capture.attention`'s.

    >>> attnviz.analysis.moved_shares(cap, 13, 8, cap.word_labels.index("它"), words=True)  # doctest: +SKIP
    """
    import pandas as pd  # deferred: pandas is heavy and only the tables need it

    weight, moved, share = row_shares(
        cap, layer, head, query, part=part, causal=causal, scale=scale, temperature=temperature, words=words
    )
    _, keys = cap.sequences(part)
    labels = keys.word_labels if words else keys.token_labels
    ratio = torch.where(weight > 0, share / weight.clamp_min(1e-30), torch.full_like(weight, float("nan")))
    frame = pd.DataFrame(
        {
            "label": labels,
            "weight": weight.numpy(),
            "moved": moved.numpy(),
            "moved_share": share.numpy(),
            "ratio": ratio.numpy(),
        }
    )
    frame.index.name = "key"
    return frame
