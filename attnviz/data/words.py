"""Words over tokens: join WordPiece ``##`` pieces, byte-level BPE pieces and CJK characters.

Words are found in the *text*, independent of the tokenizer: Latin-script words and numbers are
runs of letters/digits (with inner apostrophes), each punctuation mark is a word, and runs of CJK
characters are segmented with ``jieba`` (so 小猫 is one word) — one character a word if jieba is
not installed. Tokens are then grouped by the characters they cover; a token that straddles two
words merges them, so every word is a contiguous run of tokens and every token is in one word.
Special tokens ([CLS], [SEP], <s>) cover no characters and are words of their own.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import InputError, OutOfRangeError

__all__ = [
    "LABEL_CHARS",
    "TokenSequence",
    "Word",
    "WordIndex",
    "group_matrix",
    "offsets_from_tokens",
    "pool_words",
    "segment",
    "short_label",
    "words_from_offsets",
]

LABEL_CHARS = 24  # a label or a title's word at most (a longer one cut with "…"; hover names it whole)

_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_PATTERN = re.compile(rf"[{_CJK}]+|[^\W{_CJK}_]+(?:['’][^\W{_CJK}_]+)*|[^\s]", re.UNICODE)


@dataclass(frozen=True)
class Word:
    """A word: its text, character span in the text, and token span ``[start, stop)``."""

    text: str
    char_start: int
    char_end: int
    token_start: int
    token_stop: int

    @property
    def tokens(self) -> range:
        return range(self.token_start, self.token_stop)


@dataclass
class TokenSequence:
    """The tokens one stack of the model read: text, pieces, ids, character spans, words."""

    text: str
    tokens: list[str]
    token_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``; (0, 0) for special tokens
    words: list[Word]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def token_labels(self) -> list[str]:
        """Readable labels: the token's text (special tokens as themselves). Byte-level pieces of one
        character (2–3 tokens with the same span, as for 小 in byte-level BPE) get subscripts: 小₁ 小₂."""
        subscripts = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
        count: dict[tuple[int, int], int] = {}
        for span in self.offsets:
            count[span] = count.get(span, 0) + 1
        seen: dict[tuple[int, int], int] = {}
        labels = []
        for token, (start, end) in zip(self.tokens, self.offsets):
            piece = self.text[start:end].strip() if end > start else token
            label = piece or (_blank_label(self.text[start:end]) if end > start else token)
            if end > start and count[(start, end)] > 1:
                seen[(start, end)] = seen.get((start, end), 0) + 1
                label += str(seen[(start, end)]).translate(subscripts)
            labels.append(label)
        return labels

    @property
    def word_labels(self) -> list[str]:
        return [w.text for w in self.words]

    def word_index(self, word: str | int) -> int:
        """Index of a word given by its text (first occurrence) or its index."""
        if isinstance(word, int) and not isinstance(word, bool):
            if not 0 <= word < len(self.words):
                raise OutOfRangeError(f"word {word} is out of range: this text has words 0..{len(self.words) - 1}")
            return word
        for i, w in enumerate(self.words):
            if w.text == word:
                return i
        raise InputError(f"no word {word!r} in this text; its words are {self.word_labels}")


@functools.lru_cache(maxsize=1)
def _blank_label(space: str) -> str:
    """A visible label for a token that is only white space: ↵ per line break, · per other space."""
    return "".join("↵" if ch == "\n" else "⇥" if ch == "\t" else "·" for ch in space) or "·"


def _jieba():
    try:
        import jieba
    except ImportError:
        return None
    jieba.setLogLevel(logging.WARNING)
    return jieba


def segment(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the words of ``text``, in order."""
    spans: list[tuple[int, int]] = []
    for match in _PATTERN.finditer(text):
        start, chunk = match.start(), match.group()
        if re.fullmatch(rf"[{_CJK}]+", chunk):
            jieba = _jieba()
            pieces = jieba.lcut(chunk, HMM=True) if jieba is not None else list(chunk)
            for piece in pieces:
                spans.append((start, start + len(piece)))
                start += len(piece)
        else:
            spans.append((start, match.end()))
    return spans


def words_from_offsets(text: str, offsets: Sequence[tuple[int, int]], tokens: Sequence[str]) -> list[Word]:
    """Group tokens (with character ``offsets``) into words of ``text``; see the module docstring."""
    spans = segment(text)
    word_of_char = [-1] * (len(text) + 1)
    for index, (start, end) in enumerate(spans):
        for c in range(start, end):
            word_of_char[c] = index

    # per token: the (first, last) word it touches, or None for a special/whitespace-only token
    touched: list[tuple[int, int] | None] = []
    for start, end in offsets:
        ids = [word_of_char[c] for c in range(start, end) if word_of_char[c] >= 0]
        touched.append((min(ids), max(ids)) if ids else None)

    words: list[Word] = []
    t = 0
    while t < len(tokens):
        if touched[t] is None:
            start, end = offsets[t]
            words.append(Word(tokens[t] if start == end else text[start:end], start, end, t, t + 1))
            t += 1
            continue
        lo, hi = touched[t]  # type: ignore[misc]  # not None: checked above
        stop = t + 1
        # extend while the next token touches a word already in this group, or bridges into it
        while stop < len(tokens) and (nxt := touched[stop]) is not None and nxt[0] <= hi:
            hi = max(hi, nxt[1])
            stop += 1
        char_start, char_end = spans[lo][0], spans[hi][1]
        words.append(Word(text[char_start:char_end], char_start, char_end, t, stop))
        t = stop
    return words


def short_label(name: str, limit: int = LABEL_CHARS) -> str:
    """``name`` cut to ``limit`` characters with "…" (a 300-character word left no room for its map)."""
    return name if len(name) <= limit else name[: limit - 1] + "…"


def group_matrix(words: Sequence[Word], n_tokens: int, *, mean: bool = False) -> Tensor:  # [word, token]
    """A ``[word, token]`` matrix with 1 where the token belongs to the word (rows averaged if ``mean``)."""
    g = torch.zeros(len(words), n_tokens)
    for i, w in enumerate(words):
        g[i, w.token_start : w.token_stop] = 1.0 / (w.token_stop - w.token_start) if mean else 1.0
    return g


@dataclass(frozen=True)
class WordIndex:
    """Which word each token is in, as tensors on one device: the sparse form of :func:`group_matrix`.

    ``P · A`` with ``P = group_matrix(words, n)`` adds the rows of each word: a scatter-add of ``A``'s rows
    by ``of`` (:meth:`sum_rows`), O(size of A), where the dense product is O(words · size of A) (a layer of SmolLM2 at 4,096
    tokens took ~40 s to merge into words that way, on two cores). A token no
    word covers goes to an extra slot, dropped (``group_matrix``'s zero column)."""

    of: Tensor  # [token] long: its word (``n_words`` for a token no word covers)
    sizes: Tensor  # [word] float32: its tokens (1 for a word of none, never read as a divisor of 0)
    n_words: int
    covered: bool  # every token is in a word (no extra slot)

    @classmethod
    def of_words(cls, words: Sequence[Word], n_tokens: int, device: torch.device | str | None = None) -> WordIndex:
        of = [len(words)] * n_tokens
        for i, w in enumerate(words):
            of[w.token_start : w.token_stop] = [i] * (w.token_stop - w.token_start)
        sizes = [max(w.token_stop - w.token_start, 1) for w in words]
        covered = len(words) not in of
        return cls(
            torch.tensor(of, dtype=torch.long, device=device),
            torch.tensor(sizes, dtype=torch.float32, device=device),
            len(words),
            covered,
        )

    def to(self, device: torch.device | str) -> WordIndex:
        return WordIndex(self.of.to(device), self.sizes.to(device), self.n_words, self.covered)

    def sum_along(self, x: Tensor, dim: int, tokens: slice | None = None, *, buffer: Tensor | None = None) -> Tensor:
        """``x`` with its tokens along ``dim`` added into their words (``tokens``: the tokens ``x`` holds
        there, a slice of the sequence; default all): ``[..., token, ...] → [..., word, ...]``.
        ``buffer``: a tensor of at least that many elements, of ``x``'s dtype and device, written over
        instead of fresh memory (a chunked pass re-uses one: fresh pages cost as much as the sum)."""
        dim = dim % x.dim()
        index = self.of if tokens is None else self.of[tokens]
        shape = list(x.shape)
        shape[dim] = self.n_words + (not self.covered)
        size = 1
        for s in shape:
            size *= s
        if buffer is not None and buffer.numel() >= size and buffer.dtype == x.dtype and buffer.device == x.device:
            out = buffer.view(-1)[:size].view(shape).zero_()
        else:
            out = x.new_zeros(shape)
        out.index_add_(dim, index.to(x.device), x)
        return out if self.covered else out.narrow(dim, 0, self.n_words)

    def mean_along(self, x: Tensor, dim: int) -> Tensor:
        """``x``'s tokens along ``dim`` averaged into their words (every token of the sequence there)."""
        dim = dim % x.dim()
        shape = [1] * x.dim()
        shape[dim] = self.n_words
        return self.sum_along(x, dim) / self.sizes.to(x.device, x.dtype).view(shape)


def pool_words(weights: Tensor, queries: WordIndex, keys: WordIndex) -> Tensor:  # [..., q, k] -> [..., qw, kw]
    """``P_q · A · P_kᵀ`` without the matrices (:class:`WordIndex`): each word's key columns added, each
    word's query rows averaged — what ``group_matrix(…, mean=True) @ A @ group_matrix(…).T`` gives, in
    O(size of A) instead of O(words × size of A). Keys first: the rows then add ``[.., q, key word]``."""
    return queries.mean_along(keys.sum_along(weights, -1), -2)


def _fold(ch: str) -> str:
    """A character as uncased, accent-free tokenizers see it (é → e, Ä → a)."""
    return "".join(c for c in unicodedata.normalize("NFD", ch.lower()) if not unicodedata.combining(c))


_SPACE = re.compile(r"\s")


def offsets_from_tokens(text: str, pieces: Sequence[str | None]) -> list[tuple[int, int]] | None:
    """Character spans of tokens found in ``text`` in order, for tokenizers without offset mapping.

    ``pieces`` holds each token's surface text: ``None`` for a special token (span ``(0, 0)``),
    ``""`` for a piece that belongs to the next one (byte-level pieces of one character share its
    span). Matching ignores case and accents, as uncased tokenizers do. A piece that cannot be
    found ([UNK], a normalised character) takes the text between its found neighbours. Returns
    None when fewer than half of the pieces are found.
    """
    folded: list[str] = []
    owner: list[int] = []  # folded char -> original char index
    for i, ch in enumerate(text):
        f = _fold(ch) or ch
        folded.extend(f)
        owner.extend([i] * len(f))
    hay = "".join(folded)
    spans: list[tuple[int, int] | None] = []  # None: not found (yet)
    cursor = found = wanted = 0
    for piece in pieces:
        needle = _fold(piece.strip()) if piece else ""
        if piece is None:
            spans.append((0, 0))
            continue
        if piece == "":
            spans.append(None)  # takes the next piece's span below
            continue
        if not needle:  # a whitespace token (ByT5's bytes, "\n" pieces): the next white space
            space = _SPACE.search(hay, cursor)
            spans.append((owner[space.start()], owner[space.start()] + 1) if space else (0, 0))
            cursor = space.end() if space else cursor
            continue
        wanted += 1
        at = hay.find(needle, cursor)
        if at < 0:
            spans.append(None)
            continue
        found += 1
        spans.append((owner[at], owner[at + len(needle) - 1] + 1))
        cursor = at + len(needle)
    if wanted and found * 2 < wanted:
        return None
    out: list[tuple[int, int]] = [(0, 0)] * len(pieces)
    prev_end = 0
    for i, span in enumerate(spans):
        if pieces[i] == "":
            continue  # takes the next piece's span below
        if span is None:  # between the found neighbours, without surrounding spaces
            nxt = next((s for s in spans[i + 1 :] if s is not None and s[1] > s[0]), None)
            start, end = prev_end, nxt[0] if nxt is not None else len(text)
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            span = (start, end)
        out[i] = span
        if span[1] > span[0]:
            prev_end = span[1]
    for i in range(len(out) - 2, -1, -1):
        if pieces[i] == "":
            out[i] = out[i + 1]
    return out
