"""What :func:`attnviz.intervene` returns: the model's next-token :class:`Prediction` before and after
the edits, and the :class:`Intervention` that holds both with the two captures. Data: the one
model call left here is the scorer :func:`~attnviz.workflows.intervene.intervene` hands the
Intervention for continuations of several tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from torch import Tensor

from ..errors import InputError, OutOfRangeError
from .capture import Capture

if TYPE_CHECKING:
    from ..workflows.edits import Edit

__all__ = [
    "Intervention",
    "Prediction",
    "TokenChoice",
    "byte_text",
    "continuation_ids",
    "token_text",
    "tokens_text",
]


class TokenChoice(NamedTuple):
    token: str  # the token as text
    id: int
    probability: float


def token_text(tokenizer: Any, token_id: int) -> str:
    """A token as text. A byte-level piece is shown as the characters its bytes form; the bytes of a
    character it holds only part of are shown as ``‹e5 b0›`` (hex, in single guillemets): 小 (bytes
    e5 b0 8f) split over two tokens reads ``‹e5 b0›`` and ``‹8f›``; a token of 中 and the first byte of
    the next character reads ``中‹e5›``; a whole character is never shown as its bytes (``'\\xe7'``)."""
    if tokenizer is None:
        return str(token_id)
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    decoder = _byte_decoder()
    if isinstance(piece, str) and piece and all(c in decoder for c in piece):
        return byte_text(bytes(decoder[c] for c in piece))
    return piece if isinstance(piece, str) else text


def tokens_text(tokenizer: Any, token_ids: list[int]) -> str:
    """Several tokens as one text: the bytes of byte-level pieces joined before they are read, so the
    pieces of one character read as that character (小, not ``‹e5 b0›‹8f›``); see :func:`token_text`."""
    if tokenizer is None:
        return " ".join(str(i) for i in token_ids)
    text = tokenizer.decode(list(token_ids))
    if "\ufffd" not in text:
        return text
    pieces = tokenizer.convert_ids_to_tokens(list(token_ids))
    decoder = _byte_decoder()
    if all(isinstance(p, str) and p and all(c in decoder for c in p) for p in pieces):
        return byte_text(bytes(decoder[c] for p in pieces for c in p))
    return "".join(token_text(tokenizer, i) for i in token_ids)


def byte_text(data: bytes) -> str:
    """UTF-8 bytes as text: each whole character as itself, each run of bytes that form no whole
    character (a piece of one) as ``‹e5 b0›``."""
    out: list[str] = []
    partial: list[int] = []
    i = 0
    while i < len(data):
        for n in (1, 2, 3, 4):
            try:
                char = data[i : i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            if partial:
                out.append("‹" + " ".join(f"{b:02x}" for b in partial) + "›")
                partial = []
            out.append(char)
            i += n
            break
        else:
            partial.append(data[i])
            i += 1
    if partial:
        out.append("‹" + " ".join(f"{b:02x}" for b in partial) + "›")
    return "".join(out)


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's character for each byte (GPT-2's table: printable bytes as themselves, the
    rest shifted past 255), inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


def continuation_ids(tokenizer: Any, continuation: str | int | list[int], vocab: int) -> list[int]:
    """The token ids of a continuation: its text as it would follow the text, an id, or a list of ids."""
    if isinstance(continuation, int) and not isinstance(continuation, bool):
        continuation = [continuation]
    if isinstance(continuation, list) and continuation and all(isinstance(i, int) for i in continuation):
        for i in continuation:
            if not 0 <= i < vocab:
                raise OutOfRangeError(f"token id {i} is out of range: the vocabulary has {vocab}")
        return list(continuation)
    if not isinstance(continuation, str) or not continuation:
        raise InputError(
            f"give the continuation as a non-empty string, a token id or a list of ids, got {continuation!r}"
        )
    if tokenizer is None:
        raise InputError("this model has no tokenizer here: give the continuation as token ids")
    ids = list(tokenizer(continuation, add_special_tokens=False)["input_ids"])
    if not ids:
        raise InputError(f"{continuation!r} has no tokens for this tokenizer")
    return [int(i) for i in ids]


@dataclass
class Prediction:
    """The model's distribution over the next token (or over the masked token) at one position."""

    logprobs: Tensor  # [vocab] float32 log-softmax
    position: int  # the position in the (decoder's) sequence whose prediction this is
    tokenizer: Any

    def top_tokens(self, k: int = 5) -> list[TokenChoice]:
        """The ``k`` most probable tokens, with their probabilities."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"k must be a whole number ≥ 1, got {k!r}")
        values, ids = self.logprobs.topk(min(k, self.logprobs.numel()))
        return [TokenChoice(self._text(int(i)), int(i), float(v.exp())) for v, i in zip(values, ids)]

    def _text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)

    def token_id(self, continuation: str | int) -> int:
        """The id of a continuation given as one token's text (as it would follow the text) or as an id."""
        ids = continuation_ids(self.tokenizer, continuation, self.logprobs.numel())
        if len(ids) != 1:
            pieces = [self._text(i) for i in ids]
            raise InputError(
                f"{continuation!r} is {len(ids)} tokens for this tokenizer ({pieces}); a Prediction is one next "
                "token — give one of them or its id, or ask the Intervention (out.delta_logprob(…)), which "
                "scores a continuation of several tokens"
            )
        return ids[0]

    def logprob(self, continuation: str | int) -> float:
        """log P(continuation) as the next token."""
        return float(self.logprobs[self.token_id(continuation)])

    def probability(self, continuation: str | int) -> float:
        return float(self.logprobs[self.token_id(continuation)].exp())


@dataclass
class Intervention:
    """A text run twice, as the model is and with edits: predictions and attention, before and after."""

    edits: list[Edit]
    capture_before: Capture  # the attention as the model computed it
    capture_after: Capture  # the attention as the edited model computed it (edited layers: the edited weights)
    before: Prediction | None  # None for a model without a language-model head (see similarity)
    after: Prediction | None
    similarity: Tensor  # [tokens] cosine between the final hidden states (or logits) after and before
    check_error: float  # max |Δ| of the output when attnviz's SDPA replaced the kernel without an edit
    check_tolerance: float
    edited_layers: list[tuple[str, int]]
    _score: Callable[[list[int]], tuple[float, float]] | None = field(default=None, repr=False)

    def logprob(self, continuation: str | int | list[int]) -> tuple[float, float]:
        """(before, after): log P(continuation | text), summed over its tokens (teacher-forced: one
        forward of text + continuation each way, edited and not; a one-token continuation is read
        from the predictions directly)."""
        before, after = self._predictions()
        ids = continuation_ids(before.tokenizer, continuation, before.logprobs.numel())
        if len(ids) == 1:
            return float(before.logprobs[ids[0]]), float(after.logprobs[ids[0]])
        assert self._score is not None
        return self._score(ids)

    def _predictions(self) -> tuple[Prediction, Prediction]:
        if self.before is None or self.after is None:
            raise InputError(
                f"{self.capture_before.model.get('name')} has no language-model head, so it predicts no tokens; "
                "see .similarity (cosine of each token's final hidden state, edited vs not)"
            )
        return self.before, self.after

    def delta_logprob(self, continuation: str | int | list[int]) -> float:
        """How the edits moved log P(continuation): after − before (negative: the edit made it less
        likely). A continuation of several tokens (好 is two byte pieces for SmolLM2) is scored whole."""
        before, after = self.logprob(continuation)
        return after - before

    def to_pandas(self, k: int = 5):
        """The top-``k`` next tokens before and after, side by side."""
        import pandas as pd  # deferred: pandas is heavy and only tables need it

        before, after = self._predictions()
        rows = []
        for rank, (b, a) in enumerate(zip(before.top_tokens(k), after.top_tokens(k)), start=1):
            rows.append(
                {
                    "rank": rank,
                    "before": b.token,
                    "p_before": b.probability,
                    "after": a.token,
                    "p_after": a.probability,
                    "after_was": before.probability(a.id),
                }
            )
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        edits = "; ".join(map(str, self.edits))
        if self.before is not None and self.after is not None:
            b, a = self.before.top_tokens(1)[0], self.after.top_tokens(1)[0]
            change = f"next token {b.token!r} {b.probability:.2f} → {a.token!r} {a.probability:.2f}"
        else:
            change = f"final hidden states: cosine to the unedited ≥ {float(self.similarity.min()):.4f}"
        return (
            f"Intervention({self.capture_before.model.get('name')!r}, {edits}: {change}; "
            f"no-edit path max |Δ| {self.check_error:.1e} ≤ {self.check_tolerance:.0e})"
        )
