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
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Word", "group_matrix", "segment", "words_from_offsets"]

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


@functools.lru_cache(maxsize=1)
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


def words_from_offsets(
    text: str, offsets: Sequence[tuple[int, int]], tokens: Sequence[str]
) -> list[Word]:
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
        lo, hi = touched[t]
        stop = t + 1
        # extend while the next token touches a word already in this group, or bridges into it
        while stop < len(tokens) and touched[stop] is not None and touched[stop][0] <= hi:
            hi = max(hi, touched[stop][1])
            stop += 1
        char_start, char_end = spans[lo][0], spans[hi][1]
        words.append(Word(text[char_start:char_end], char_start, char_end, t, stop))
        t = stop
    return words


def group_matrix(words: Sequence[Word], n_tokens: int, *, mean: bool = False) -> Tensor:  # [word, token]
    """A ``[word, token]`` matrix with 1 where the token belongs to the word (rows averaged if ``mean``)."""
    g = torch.zeros(len(words), n_tokens)
    for i, w in enumerate(words):
        g[i, w.token_start : w.token_stop] = 1.0 / (w.token_stop - w.token_start) if mean else 1.0
    return g
