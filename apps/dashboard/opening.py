"""Where the page opens: the AttentionLab in words (:data:`TAB`, :data:`UNITS` — the README's first picture,
它 → 小猫), on the text's last pronoun (else its last word) and the head that puts the most weight from it
on one earlier content word — for a pronoun, usually a coreference head. Pure functions of a capture; the
server memoises the head per capture (``Captures.opening_head``)."""

from __future__ import annotations

import torch

import attnviz
from attnviz.analysis import STOP_WORDS

from .common import word_of

#: the tab and the units the page opens on: the Lab reads one query's row, in words (a newcomer's first look at
#: 它 → 小猫, not at a byte piece of 它 that parks its weight on the sink)
TAB = "lab"
UNITS = "words"

PRONOUNS = {"it", "he", "she", "they", "him", "her", "them", "它", "他", "她", "它们", "他们", "她们"}


def default_query(cap: attnviz.Capture) -> int:
    """The token the lab opens on: the last piece of the text's last pronoun (它, it …), else of its last
    word. In words it is the word; in tokens the piece that has read the whole word (SmolLM2 splits 它 in two
    byte pieces, and the first, which has not seen the character yet, looks at the sink)."""
    words = [w for w in cap.words if w.token_stop > w.token_start and w.char_end > w.char_start]
    for w in reversed(words):
        if w.text.lower() in PRONOUNS:
            return w.token_stop - 1
    return (words[-1] if words else cap.words[-1]).token_stop - 1


def content_words_before(cap: attnviz.Capture, q: int) -> list[int]:
    """The words before word ``q`` that may be its antecedent: not the first (a decoder's sink), not a
    stop word, punctuation or a special token."""
    return [
        i
        for i, w in enumerate(cap.words[:q])
        if i > 0
        and w.text.lower() not in STOP_WORDS
        and any(ch.isalnum() for ch in w.text)
        and w.char_end > w.char_start
    ]


def default_head(cap: attnviz.Capture, query: int) -> tuple[int, int]:
    """Open on the head where the query word puts the most weight on one earlier content word
    (not the first word, which decoders use as a sink, nor a stop word or punctuation): for a
    pronoun, usually a coreference head.

    Only the query word's rows are computed (``Capture.attention_rows``: from a word averaged over its
    tokens), and each layer's ``[head, key token]`` rows are summed into ``[head, candidate word]`` by one
    ``index_add`` over a token→candidate index built once — no Python loop over words per layer."""
    q = word_of(cap, query)
    keys = content_words_before(cap, q)
    layers = cap.layer_indices()
    if not keys:
        return min(layers), cap.layer(min(layers)).head_numbers[0]  # the first head kept (capture(heads=))
    word = cap.words[q]
    rows = list(range(word.token_start, word.token_stop))
    column = torch.full((cap.layer(layers[0]).n_keys,), len(keys), dtype=torch.long)  # len(keys): no candidate
    for j, i in enumerate(keys):
        column[cap.words[i].token_start : cap.words[i].token_stop] = j
    best, numbers = [], []
    for layer in layers:
        weights = cap.attention_rows(layer, rows).mean(1).cpu().float()  # [head, key token]
        per_word = torch.zeros(weights.shape[0], len(keys) + 1).index_add_(1, column, weights)
        best.append(per_word[:, :-1].max(-1).values)  # the head's weight on its strongest candidate
        numbers.append(cap.layer(layer).head_numbers)  # the model's numbers of the rows (capture(heads=))
    scores = torch.nn.utils.rnn.pad_sequence(best, batch_first=True, padding_value=-1.0)  # [layer, head]
    flat = int(scores.flatten().argmax())  # the first maximum in (layer, head) order
    row, col = divmod(flat, scores.shape[1])
    return layers[row], numbers[row][col]
