"""Where a head should look, and how much it does: the token classes the statistics count (punctuation,
special tokens, :func:`text_positions`), the named patterns (:data:`DETECTORS`, :func:`pattern_matrix`,
:func:`pattern_rows`) and :func:`detect_heads`, a head's mean mass on a pattern's keys.
:mod:`attnviz.analysis.stats` re-exports them beside the head statistics."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..errors import ArgumentTypeError, InputError

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture

__all__ = [
    "DETECTORS",
    "detect_heads",
    "is_punct",
    "pattern_matrix",
    "pattern_rows",
    "selected",
    "special_positions",
    "text_positions",
]


def is_punct(text: str) -> bool:
    """Whether a token's text is punctuation or symbols only (what the punctuation class counts)."""
    text = text.strip()
    return bool(text) and all(
        unicodedata.category(ch).startswith("P") or unicodedata.category(ch).startswith("S") for ch in text
    )


def special_positions(cap: Capture) -> list[int]:
    """Tokens that cover no characters of the text: [CLS], [SEP], <s>… (never position-less words)."""
    return [i for i, (start, end) in enumerate(cap.offsets) if start == end]


def text_positions(text: str, offsets: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(special tokens after the first, punctuation tokens) of one text, from its offsets."""
    special = [i for i, (start, end) in enumerate(offsets) if start == end and i != 0]
    punct = [i for i, (s, e) in enumerate(offsets) if e > s and is_punct(text[s:e])]
    return special, punct


def pattern_rows(ids: Sequence[int]) -> tuple[int, int]:
    """Query rows with at least one key under ``duplicate_token`` and under ``induction`` (as
    :func:`pattern_matrix` marks them), counted without the n×n matrices."""
    duplicate = induction = 0
    before: set[int] = set()  # the tokens before row i
    earlier: set[int] = set()  # the tokens before row i - 1 (an induction target j + 1 must be < i)
    for i, token in enumerate(ids):
        duplicate += token in before
        induction += token in earlier
        before.add(token)
        if i >= 1:
            earlier.add(ids[i - 1])
    return duplicate, induction


def pattern_matrix(cap: Capture, pattern: str) -> Tensor:  # [query_pos, key_pos] bool
    """Where a named pattern says a head should look.

    - ``previous_token``: key i-1 for query i.
    - ``duplicate_token``: earlier keys j < i holding the same token as i.
    - ``induction``: keys j+1 where token j equals token i (j + 1 < i): after "A B … A", look at B.
    """
    ids = torch.tensor(cap.token_ids)
    n = len(ids)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    same = ids[:, None] == ids[None, :]
    if pattern == "previous_token":
        return j == i - 1
    if pattern == "duplicate_token":
        return same & (j < i)
    if pattern == "induction":
        shifted = torch.zeros(n, n, dtype=torch.bool)
        shifted[:, 1:] = same[:, :-1]  # key j is induction target if token j-1 == token i
        return shifted & (j < i)
    raise InputError(f"unknown pattern {pattern!r}; choose from {', '.join(DETECTORS)} or pass a matrix")


DETECTORS = {
    "previous_token": "attends to the token just before",
    "duplicate_token": "attends to earlier copies of the current token",
    "induction": "attends to the token that followed an earlier copy of the current token",
}


def detect_heads(
    caps: Capture | Sequence[Capture],
    pattern: str | Tensor | Callable[[Capture], Tensor],
    *,
    part: str | None = None,
) -> pd.DataFrame:
    """Score every head for a pattern: the mean attention mass it puts on the pattern's keys.

    ``pattern`` is a name from :data:`DETECTORS`, a ``[query_pos, key_pos]`` bool/0-1 matrix (one
    text), or a function ``capture -> matrix``. The score of a head is the attention mass on the
    pattern's keys, averaged over the query rows where the pattern has at least one key — so 1.0
    means "always looks exactly there", 0.0 "never". Rows without a target do not count (TransformerLens'
    ``detect_head`` averages over all rows instead, which caps scores below 1 on short texts).
    Returns ``layer, head, score, rows`` (rows: how many query rows were scored, over all texts).
    ``part`` picks the encoder or the decoder of an encoder-decoder capture.
    """
    caps = selected(caps, part)
    total: dict[tuple[int, int], float] = {}
    rows_total = 0
    for cap in caps:
        mask = _pattern(cap, pattern)
        rows_total += int((mask.sum(-1) > 0).sum())
        for layer in cap.layer_indices():
            numbers = cap.layer(layer).head_numbers  # the model's heads (capture(heads=) keeps some)
            for head, value in zip(numbers, _pattern_mass(cap.attention(layer).cpu(), mask).tolist()):
                total[(layer, head)] = total.get((layer, head), 0.0) + value
    return _scores_frame(caps[0], total, rows_total)


def selected(caps: Capture | Sequence[Capture], part: str | None) -> list[Capture]:
    """One capture or several, each narrowed to the self-attention part the analysis reads."""
    items: Sequence[Capture] = caps if isinstance(caps, (list, tuple)) else [caps]  # type: ignore[list-item]
    return [c.select(part) for c in items]


def _pattern(cap: Capture, pattern: str | Tensor | Callable[[Capture], Tensor]) -> Tensor:  # [q, k] float
    if isinstance(pattern, str):
        mask = pattern_matrix(cap, pattern)
    elif callable(pattern):
        mask = pattern(cap)
    elif isinstance(pattern, Tensor):
        mask = pattern
    else:
        raise ArgumentTypeError(f"pattern must be a name, a matrix or a function, got {type(pattern).__name__}")
    mask = mask.to(torch.float32).cpu()
    if mask.shape != (cap.n_tokens, cap.n_tokens):
        raise InputError(f"pattern is {tuple(mask.shape)} but the text has {cap.n_tokens} tokens: give [n, n]")
    return mask


def _pattern_mass(
    a: Tensor, mask: Tensor
) -> Tensor:  # a [head, q, k] -> [head]: mass on targets, summed over scored rows
    scored = mask.sum(-1) > 0
    return (a * mask).sum(-1)[:, scored].sum(-1)


def _scores_frame(cap: Capture, total: dict, rows_total: int) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "layer": layer,
                "head": head,
                "score": total.get((layer, head), 0.0) / rows_total if rows_total else float("nan"),
                "rows": rows_total,
            }
            for layer in cap.layer_indices()
            for head in cap.layer(layer).head_numbers
        ]
    )
