"""The statistics' sums of one chunk, as the corpus pass and the head atlas add them (one product of the
weights with the key features per row, the weights summed over texts in float32 then a float64 product),
against an independent float64 computation by loops over the same weights."""

from __future__ import annotations

import numpy as np
import torch

from attnviz.analysis.batch_texts import COLUMNS, PATTERNS, BatchTexts
from attnviz.analysis.layer_reduction import add_masses, key_classes

WORDS = ["the", "cat", ",", "sat", "on", "the", "mat", ".", "and", "the", "cat", "sat", "!"]


def _batch(lengths: list[int]) -> tuple[BatchTexts, list[list[int]]]:
    """Texts of ``lengths`` words (a [SEP]-like special token last, zero-width), right-padded."""
    encoded, texts, ids_of = [], [], []
    for b, m in enumerate(lengths):
        words = [WORDS[(b + i) % len(WORDS)] for i in range(m - 1)]
        text = " ".join(words)
        offsets, at = [], 0
        for w in words:
            offsets.append((at, at + len(w)))
            at += len(w) + 1
        offsets.append((len(text), len(text)))  # the special token
        ids = [3 + WORDS.index(w) for w in words] + [1]
        encoded.append((ids, offsets, [*words, "[SEP]"]))
        texts.append(text)
        ids_of.append(ids)
    return BatchTexts(encoded, texts, detectors=True), ids_of


def _reference(a: np.ndarray, batch: BatchTexts, ids_of: list[list[int]]) -> np.ndarray:
    """[column, head] float64 sums over every real row, by loops: the mass on the first / special /
    punctuation keys, Σ a·|i - j|, the weights on i, i - 1, i + 1, and the detectors' single keys."""
    b, h, n, _ = a.shape
    keyed = batch.keyed.numpy()
    sums = np.zeros((len(COLUMNS), h))
    for t, m in enumerate(batch.lengths):
        ids = ids_of[t]
        for i in range(m):
            for j in range(m):
                w = a[t, :, i, j].astype(np.float64)
                for c in range(3):
                    sums[c] += w * keyed[t, j, c]
                sums[COLUMNS.index("distance")] += w * abs(i - j)
                sums[COLUMNS.index("self")] += w * (j == i)
                sums[COLUMNS.index("previous")] += w * (j == i - 1)
                sums[COLUMNS.index("next")] += w * (j == i + 1)
                if j < i and ids[i] == ids[j]:
                    sums[COLUMNS.index(PATTERNS[0])] += w  # duplicate_token
                if 1 <= j < i and ids[i] == ids[j - 1]:
                    sums[COLUMNS.index(PATTERNS[1])] += w  # induction
    return sums


def test_a_chunks_sums_equal_float64_loops_over_its_weights_to_float_rounding():
    g = torch.Generator().manual_seed(5)
    lengths, heads = [13, 9, 12, 5], 3
    batch, ids_of = _batch(lengths)
    n = max(lengths)
    scores = torch.randn(len(lengths), heads, n, n, generator=g) * 3
    valid = batch.valid
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    a = torch.softmax(scores, -1) * valid[:, None, :, None]  # padded keys and rows 0, as reduce_layer has them
    part = batch.chunk(0, n, n, torch.device("cpu"))
    sums = torch.zeros(len(COLUMNS), heads, dtype=torch.float64)
    add_masses(sums, a, part, None)
    expected = _reference(a.numpy(), batch, ids_of)
    found = sums.numpy()
    entropy = COLUMNS.index("entropy")
    mine, theirs = np.delete(found, entropy, 0), np.delete(expected, entropy, 0)
    assert (theirs[: COLUMNS.index("entropy")] > 0).all()  # every class, feature and pattern has mass here
    np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=0)
    assert (found[entropy] == 0).all()  # no entropy given, none added


def test_each_rows_key_class_masses_are_its_weights_on_those_keys():
    g = torch.Generator().manual_seed(6)
    batch, _ = _batch([7, 6])
    a = torch.softmax(torch.randn(2, 2, 7, 7, generator=g), -1)
    part = batch.chunk(0, 7, 7, torch.device("cpu"))
    classes = key_classes(a, part)  # [b, h, r, KEYED]
    assert classes.shape == (2, 2, 7, 3)
    assert torch.equal(classes[..., 0], a[..., 0])  # the first key: one term, exact
    special = batch.keyed[:, :, 1].bool()
    for t in range(2):
        expected = a[t][..., special[t]].double().sum(-1)
        torch.testing.assert_close(classes[t, ..., 1].double(), expected, rtol=1e-6, atol=0)
