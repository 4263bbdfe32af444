"""Maps in words (issue #56): each word's key columns added, each word's query rows averaged — as scatter-adds
(``P_q · A · P_kᵀ`` without the matrices), equal cell by cell to the dense pooling matrices; the fused
pass's word thumbnails equal ``cap.attention(layer, words=True)`` pooled, on every cell the model view
shows, whatever the chunks cut; and merging into words does no matrix product (the dense one was
O(words × n²) a head: ~40 s a layer of SmolLM2 at 4,096 tokens)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnviz
import attnviz.analysis.summary as summary_module
from attnviz.analysis import summarize
from attnviz.data.words import WordIndex, group_matrix, pool_words
from attnviz.figures import model_view

# multi-token words (byte-level pieces, an apostrophe, a hyphen, CJK), punctuation words of one token
TEXT = "The unbelievably enthusiastic cat's owner, Mr. O'Neill, re-examined 小猫 things."
LONG = " ".join([TEXT] * 4)  # more than MODEL_VIEW_CELLS words: the thumbnails pool


def dense_words(cap: attnviz.Capture, weights: torch.Tensor, part: str | None = None) -> torch.Tensor:
    """The pooling matrices themselves: what to_words computed before issue #56."""
    queries, keys = cap.sequences(part)
    from_mean = group_matrix(queries.words, queries.n_tokens, mean=True)
    return from_mean @ weights @ group_matrix(keys.words, keys.n_tokens).T


@pytest.fixture(scope="module")
def llama(smol_tokenizer):
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=512)
    return model, smol_tokenizer


@pytest.fixture(scope="module")
def decoder(llama):
    return attnviz.capture(llama[0], LONG, tokenizer=llama[1])


@pytest.fixture(scope="module")
def short_decoder(llama):
    return attnviz.capture(llama[0], TEXT, tokenizer=llama[1])


@pytest.fixture(scope="module")
def encoder(bert_tokenizer):
    model = attnviz.testing.tiny_model("bert", vocab_size=bert_tokenizer.vocab_size, max_position_embeddings=512)
    return attnviz.capture(model, LONG, tokenizer=bert_tokenizer)


@pytest.fixture(params=["decoder", "encoder"])
def cap(request):
    return request.getfixturevalue(request.param)


def test_the_texts_have_words_of_several_tokens(decoder, encoder, short_decoder):
    for c in (decoder, encoder, short_decoder):
        sizes = [w.token_stop - w.token_start for w in c.words]
        assert max(sizes) >= 3 and min(sizes) == 1 and len(c.words) < c.n_tokens
    assert len(decoder.words) > 24 and len(short_decoder.words) <= 24
    assert decoder.layer(0).causal and not encoder.layer(0).causal


@pytest.mark.parametrize("causal", [None, False, True])
def test_attention_in_words_equals_the_pooling_matrices(cap, causal):
    for layer in cap.layer_indices():
        tokens = cap.attention(layer, causal=causal)
        words = cap.attention(layer, causal=causal, words=True)
        torch.testing.assert_close(words, dense_words(cap, tokens), atol=1e-6, rtol=1e-5)
        for head in cap.kept_heads():
            one = cap.attention(layer, head, causal=causal, words=True)
            torch.testing.assert_close(one, words[cap.kept_heads().index(head)], atol=0, rtol=0)
        torch.testing.assert_close(words.sum(-1), torch.ones(words.shape[:2]), atol=1e-5, rtol=0)  # rows still sum to 1


@pytest.mark.parametrize("causal", [None, False, True])
def test_rows_and_cols_in_words_are_the_full_maps_cells(cap, causal):
    n = len(cap.words)
    rows, cols = [3, 0, n - 1, 7], range(2, n - 1)
    for layer in cap.layer_indices():
        full = cap.attention(layer, causal=causal, words=True)
        tile = cap.attention(layer, causal=causal, words=True, rows=rows, cols=cols)
        torch.testing.assert_close(tile, full[:, rows][:, :, 2 : n - 1], atol=1e-6, rtol=1e-5)
        head = cap.kept_heads()[-1]
        row = cap.attention(layer, head, causal=causal, words=True, rows=[5])
        torch.testing.assert_close(row, full[-1, 5:6], atol=1e-6, rtol=1e-5)
    assert cap.attention(0, words=True, rows=[]).shape == (len(cap.kept_heads()), 0, n)


def test_a_token_of_no_word_is_left_out_as_the_matrices_leave_it(decoder):
    words = decoder.words[1:-1]  # the first and last tokens in no word
    n = decoder.n_tokens
    index = WordIndex.of_words(words, n)
    assert not index.covered and index.n_words == len(words)
    weights = torch.rand(3, n, n)
    expected = group_matrix(words, n, mean=True) @ weights @ group_matrix(words, n).T
    torch.testing.assert_close(pool_words(weights, index, index), expected, atol=1e-6, rtol=1e-5)


def test_merging_into_words_is_no_matrix_product(decoder):
    weights = decoder.attention(0)
    with FlopCounterMode(display=False) as flops:
        decoder.to_words(weights)
    assert flops.get_total_flops() == 0  # the pooling matrices cost 2·words·n² a head (2·words²·n more)


@pytest.mark.parametrize("budget", [summary_module.BUDGET, 600, 150])  # one chunk a layer, a few rows a chunk
def test_the_fused_passs_word_thumbnails_are_the_word_maps_pooled(cap, budget, monkeypatch):
    monkeypatch.setattr(summary_module, "BUDGET", budget)
    summary = summarize(cap)
    size = (min(len(cap.words), 24),) * 2
    assert summary.word_thumb_size == size and list(summary.word_thumbnails) == summary.layers
    for layer, pooled in summary.word_thumbnails.items():
        expected = torch.nn.functional.adaptive_max_pool2d(cap.attention(layer, words=True)[None], size)[0]
        torch.testing.assert_close(pooled, expected, atol=1e-6, rtol=0)


def test_the_fused_pass_costs_no_product_for_its_words(decoder):
    with FlopCounterMode(display=False) as tokens_only:
        summarize(decoder, words=False)
    with FlopCounterMode(display=False) as with_words:
        summary = summarize(decoder)
    assert with_words.get_total_flops() == tokens_only.get_total_flops()
    assert summary.word_thumbnails is not None
    assert summarize(decoder, words=False).word_thumbnails is None


def test_every_cell_the_model_view_shows_in_words_is_the_word_map(short_decoder, decoder):
    """≤ 24 words: each thumbnail is the word map itself, cell by cell; beyond, the figure drawn from
    the fused pass's thumbnails is the figure that pools ``cap.attention(words=True)`` itself."""
    summary = summarize(short_decoder)
    for layer, pooled in summary.word_thumbnails.items():
        torch.testing.assert_close(pooled, short_decoder.attention(layer, words=True), atol=1e-6, rtol=0)
    for c in (short_decoder, decoder):
        fused = model_view(c, words=True, thumbnails=summarize(c).word_thumbnails)
        own = model_view(c, words=True)  # the figure pools cap.attention(layer, words=True) itself
        torch.testing.assert_close(
            torch.tensor(fused.data[0].z, dtype=torch.float32),
            torch.tensor(own.data[0].z, dtype=torch.float32),
            atol=1e-3,  # the figure rounds its cells to 3 decimals
            rtol=0,
            equal_nan=True,
        )


def test_one_token_words_share_the_token_thumbnails():
    cap = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.arange(3, 40)[None])
    assert len(cap.words) == cap.n_tokens
    summary = summarize(cap)
    assert all(summary.word_thumbnails[layer] is summary.thumbnails[layer] for layer in summary.layers)


@pytest.mark.parametrize("causal", [None, False, True])
def test_the_labs_row_in_words_is_the_word_maps_row(cap, causal):
    """The AttentionLab's row (``row_shares``) reads only the query word's token rows: its weights and what
    each key word moves equal the whole maps' row (``cap.attention`` / ``cap.moved``, ``words=True``)."""
    from attnviz.analysis import row_shares

    layer, head = cap.layer_indices()[-1], cap.kept_heads()[-1]
    full_w = cap.attention(layer, head, causal=causal, words=True)
    full_m = cap.moved(layer, head, causal=causal, words=True)
    longest = max(range(len(cap.words)), key=lambda i: cap.words[i].token_stop - cap.words[i].token_start)
    for query in (0, longest, len(cap.words) - 1):
        weight, moved, share = row_shares(cap, layer, head, query, causal=causal, words=True)
        torch.testing.assert_close(weight, full_w[query], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(moved, full_m[query], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(share.sum(), torch.tensor(1.0), atol=1e-5, rtol=0)
    weight, _, _ = row_shares(cap, layer, head, 4, causal=causal)
    torch.testing.assert_close(weight, cap.attention(layer, head, causal=causal)[4], atol=1e-6, rtol=1e-5)
