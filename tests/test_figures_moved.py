"""The map views' "moved" switch (``measure="moved"``): each figure draws α_ij·‖f_h(x_j)‖, checked
against a reference computed here from the model's own output projection and the capture's values —
not from ``cap.moved`` — and each says which measure it shows."""

import copy

import numpy as np
import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.analysis.overview import ThumbnailPool, block_edges, overview, thumbnails, window

TEXT = "The cat sat on the mat because it was tired."
MOVED_BAR, WEIGHT_BAR = "‖α·f(x)‖", "α"


# ---------------------------------------------------------------- references by hand
def llama_value_vectors(model, cap, layer: int) -> torch.Tensor:  # [head, key, hidden]: f_h(x_j) = W_O^h v_j
    rec = cap.layer(layer)
    w_o = model.model.layers[layer].self_attn.o_proj.weight.detach().float()  # [hidden, head · d]
    heads, d = cap.info()["n_heads"], rec.v.shape[-1]
    per_kv = heads // rec.v.shape[0]
    return torch.stack([rec.v[h // per_kv].float() @ w_o[:, h * d : (h + 1) * d].T for h in range(heads)])


def bert_value_vectors(model, cap, layer: int) -> torch.Tensor:  # [head, key, hidden]
    rec = cap.layer(layer)
    w_o = model.encoder.layer[layer].attention.output.dense.weight.detach().float()
    d = rec.v.shape[-1]
    return torch.stack([rec.v[h].float() @ w_o[:, h * d : (h + 1) * d].T for h in range(rec.v.shape[0])])


def moved_by_hand(model, cap, layer: int, head: int | None = None, *, bert: bool = False) -> torch.Tensor:
    """α_ij·‖f_h(x_j)‖ from the model's W_O and the captured V ([head, q, k], or [q, k] for one head)."""
    vectors = (bert_value_vectors if bert else llama_value_vectors)(model, cap, layer)
    moved = cap.attention(layer).float() * vectors.norm(dim=-1)[:, None, :]
    return moved if head is None else moved[head]


def word_moved_by_hand(model, cap, layer: int, head: int) -> torch.Tensor:  # [word, word]
    """‖Σ_{j∈J} β_Ij f_h(x_j)‖: the query word's mean weights, the key word's summed vectors."""
    vectors = bert_value_vectors(model, cap, layer)[head]  # [key, hidden]
    alpha = cap.attention(layer, head).float()
    spans = [(w.token_start, w.token_stop) for w in cap.words]
    out = torch.zeros(len(spans), len(spans))
    for i, (a, b) in enumerate(spans):
        beta = alpha[a:b].mean(0)  # [key]
        for j, (c, e) in enumerate(spans):
            out[i, j] = (beta[c:e, None] * vectors[c:e]).sum(0).norm()
    return out


def heat(fig, trace: int = 0) -> np.ndarray:
    return np.array(fig.data[trace].z, dtype=float)


# ---------------------------------------------------------------- captures
@pytest.fixture(scope="module")
def llama():
    return attnviz.testing.tiny_model("llama")


@pytest.fixture(scope="module")
def decoder_cap(llama):
    return attnviz.capture(llama, input_ids=torch.arange(3, 13)[None])


@pytest.fixture(scope="module")
def bert_cap(tiny_bert_words):
    model, tok = tiny_bert_words
    return attnviz.capture(model, TEXT, tok, keep_weights=True)


@pytest.fixture(scope="module")
def long_llama():
    return attnviz.testing.tiny_model("llama", max_position_embeddings=1024)


@pytest.fixture(scope="module")
def long_pair(long_llama):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, long_llama.config.vocab_size, (2, 600), generator=g)
    return attnviz.capture(long_llama, input_ids=ids[:1]), attnviz.capture(long_llama, input_ids=ids[1:])


def test_the_reference_is_not_the_weights(llama, decoder_cap):
    # the point of every test below: moved differs from the weights, not by one common factor
    moved, w = moved_by_hand(llama, decoder_cap, 1, 2), decoder_cap.attention(1, 2)
    ratio = moved[w > 0] / w[w > 0]
    assert float(ratio.max() - ratio.min()) > 1e-3 * float(ratio.max())


# ---------------------------------------------------------------- heatmap
def test_heatmap_moved_draws_alpha_times_the_norm_of_w_o_v(llama, decoder_cap):
    fig = figures.heatmap(decoder_cap, 1, 2, measure="moved")
    z, ref = heat(fig), moved_by_hand(llama, decoder_cap, 1, 2).numpy()
    lower = np.tril_indices(10)
    np.testing.assert_allclose(z[lower], ref[lower], rtol=1e-4, atol=1e-7)
    assert np.isnan(z[np.triu_indices(10, 1)]).all()  # the causal triangle stays empty
    weights = figures.heatmap(decoder_cap, 1, 2)
    assert not np.allclose(heat(weights)[lower], z[lower], atol=1e-4)
    # the colour scale comes from the data (rows of moved do not sum to 1)
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == pytest.approx(float(ref[lower].max()), rel=1e-5)
    assert weights.data[0].zmax == pytest.approx(float(decoder_cap.attention(1, 2).max()), rel=1e-5)
    assert fig.data[0].colorbar.title.text == MOVED_BAR and weights.data[0].colorbar.title.text == WEIGHT_BAR
    assert "attention: moved (‖α·f(x)‖)" in fig.layout.title.text and "L1·H2" in fig.layout.title.text
    assert "attention weights" in weights.layout.title.text and "moves" not in weights.layout.title.text
    assert "moved ‖α·f(x)‖" in fig.data[0].hovertemplate


def test_heatmap_moved_follows_the_settings_of_the_weights(decoder_cap):
    free = figures.heatmap(decoder_cap, 1, 2, measure="moved", causal=False, temperature=2.0)
    norms = decoder_cap.value_norms(1)[2]
    ref = decoder_cap.attention(1, 2, causal=False, temperature=2.0) * norms[None, :]
    np.testing.assert_allclose(heat(free), ref.numpy(), rtol=1e-4, atol=1e-7)
    assert "no mask" in free.layout.title.text and "T=2" in free.layout.title.text


def test_heatmap_moved_in_words_is_the_norm_of_the_summed_vectors(tiny_bert_words, bert_cap):
    model, _ = tiny_bert_words
    fig = figures.heatmap(bert_cap, 1, 3, words=True, measure="moved")
    ref = word_moved_by_hand(model, bert_cap, 1, 3).numpy()
    np.testing.assert_allclose(heat(fig), ref, rtol=1e-4, atol=1e-6)
    sum_of_norms = bert_cap.moved(1, 3) @ torch.ones(bert_cap.n_tokens, 1)  # not what a word moves
    assert heat(fig).shape == (len(bert_cap.words),) * 2 and sum_of_norms.shape[0] == bert_cap.n_tokens
    assert "word × word attention: moved" in fig.layout.title.text


# ---------------------------------------------------------------- head view
LEVELS = [(0.0, 0.1, 0.15), (0.1, 0.3, 0.35), (0.3, 0.6, 0.6), (0.6, 1.01, 0.95)]


def drawn(fig, head: int) -> dict[tuple[int, int], float]:
    """{(query, key): opacity} of one head's lines."""
    out = {}
    for t in fig.data:
        if t.mode == "lines" and t.name == f"H{head}" and len(t.y) > 1:
            for start in range(0, len(t.y), 3):
                out[(t.y[start], t.y[start + 1])] = t.opacity
    return out


def test_head_view_moved_sets_opacity_by_the_share_of_the_largest_contribution(tiny_bert_words, bert_cap):
    model, _ = tiny_bert_words
    fig = figures.head_view(bert_cap, 1, [0, 3], threshold=0.05, measure="moved")
    moved = moved_by_hand(model, bert_cap, 1, bert=True)
    largest = float(moved[[0, 3]].max())
    for head in (0, 3):
        share = moved[head] / largest
        expected = {}
        for i, j in zip(*torch.nonzero(share >= 0.05, as_tuple=True)):
            s = float(share[i, j])
            expected[(int(i), int(j))] = next(alpha for lo, hi, alpha in LEVELS if lo <= s < hi)
        assert drawn(fig, head) == expected
    weights = figures.head_view(bert_cap, 1, [0, 3], threshold=0.05)
    assert drawn(weights, 0) != drawn(fig, 0)
    assert "head view, moved" in fig.layout.title.text and f"the largest ({largest:.3g})" in fig.layout.title.text
    assert "head view — every query: weights ≥ 0.05" in weights.layout.title.text


def test_head_view_moved_mass_is_a_share_of_what_the_row_receives(tiny_bert_words, bert_cap):
    model, _ = tiny_bert_words
    fig = figures.head_view(bert_cap, 1, [2], threshold=0.0, mass=0.5, measure="moved")
    moved = moved_by_hand(model, bert_cap, 1, 2, bert=True)
    expected = set()
    for i, row in enumerate(moved):
        values, order = (row / row.sum()).sort(descending=True)
        before = values.cumsum(0) - values
        expected |= {(i, int(j)) for j, b in zip(order, before) if b < 0.5}
    assert set(drawn(fig, 2)) == expected
    assert "50% of each row (of what it receives)" in fig.layout.title.text


# ---------------------------------------------------------------- model view
def test_model_view_moved_thumbnails_are_the_max_pooled_contributions(llama, decoder_cap):
    fig = figures.model_view(decoder_cap, cells=4, measure="moved")
    z = heat(fig)
    layers, t = decoder_cap.layer_indices(), 4
    top = 0.0
    for r, layer in enumerate(layers):
        pooled = torch.nn.functional.adaptive_max_pool2d(moved_by_hand(llama, decoder_cap, layer)[None], (t, t))[0]
        top = max(top, float(pooled.max()))
        for head in range(4):
            cell = z[r * (t + 1) : r * (t + 1) + t, head * (t + 1) : head * (t + 1) + t]
            np.testing.assert_allclose(cell, pooled[head].numpy(), rtol=1e-4, atol=1e-7)
    assert fig.data[0].zmax == pytest.approx(top, rel=1e-5) and fig.data[0].showscale
    assert fig.data[0].colorbar.title.text == MOVED_BAR
    assert fig.layout.title.text.startswith("Model view: 2 layers × 4 heads, moved (‖α·f(x)‖")
    weights = figures.model_view(decoder_cap, cells=4)
    assert weights.data[0].zmax == 1 and not weights.data[0].showscale
    assert not np.allclose(heat(weights), z, equal_nan=True, atol=1e-3)


def test_model_view_moved_of_a_short_text_holds_the_whole_maps(llama, decoder_cap):
    thumbs = figures.helpers.model_view_thumbnails(decoder_cap, measure="moved")
    for layer in decoder_cap.layer_indices():
        np.testing.assert_allclose(thumbs[layer].numpy(), moved_by_hand(llama, decoder_cap, layer).numpy(), rtol=1e-4)


def test_model_view_moved_in_words(tiny_bert_words, bert_cap):
    model, _ = tiny_bert_words
    n = len(bert_cap.words)
    thumbs = figures.helpers.model_view_thumbnails(bert_cap, words=True, cells=4, measure="moved")
    by_hand = torch.stack([word_moved_by_hand(model, bert_cap, 0, h) for h in range(bert_cap.info()["n_heads"])])
    pooled = torch.nn.functional.adaptive_max_pool2d(by_hand[None], (4, 4))[0]
    np.testing.assert_allclose(thumbs[0].numpy(), pooled.numpy(), rtol=1e-4, atol=1e-6)
    assert n > 4


def test_thumbnail_pool_with_value_norms_matches_pooling_the_contributions(long_llama, long_pair):
    cap = long_pair[0]
    ref = torch.nn.functional.adaptive_max_pool2d(moved_by_hand(long_llama, cap, 0)[None], (7, 9))[0]
    np.testing.assert_allclose(thumbnails(cap, 0, (7, 9), measure="moved").numpy(), ref.numpy(), rtol=1e-4)
    with pytest.raises(attnviz.ArgumentTypeError, match=r"value_norms must be \[head, key\] = \(4, 600\)"):
        ThumbnailPool(4, 600, 600, (7, 9), value_norms=torch.ones(4, 599))


# ---------------------------------------------------------------- long texts: overview and window
@pytest.mark.parametrize("mode", ["max", "mean"])
def test_overview_moved_pools_the_contributions_in_blocks(long_llama, long_pair, mode):
    cap = long_pair[0]
    moved = moved_by_hand(long_llama, cap, 1, 3)
    rows = block_edges(600, 64)
    ov = overview(cap, 1, 3, size=64, mode=mode, measure="moved")
    ref = torch.zeros(len(rows) - 1, len(rows) - 1)
    for i, (a, b) in enumerate(zip(rows, rows[1:])):
        for j, (c, e) in enumerate(zip(rows, rows[1:])):
            block = moved[a:b, c:e]
            ref[i, j] = block.max() if mode == "max" else block.mean()  # masked cells: 0 in the mean
    np.testing.assert_allclose(ov.values.numpy(), ref.numpy(), rtol=1e-4, atol=1e-8)
    fig = figures.overview_figure(cap, 1, 3, size=64, mode=mode, measure="moved")
    z = heat(fig)
    keep = ref.numpy() != 0
    np.testing.assert_allclose(z[keep], ref.numpy()[keep], rtol=1e-4)
    assert np.isnan(z[~keep]).all()
    assert fig.data[0].zmax == pytest.approx(float(ref.max()), rel=1e-5)
    assert fig.data[0].colorbar.title.text == MOVED_BAR
    assert f"the {mode} moved (‖α·f(x)‖) of each block of 10×10 tokens" in fig.layout.title.text
    weights = overview(cap, 1, 3, size=64, mode=mode)
    assert not torch.allclose(weights.values, ov.values, atol=1e-4)


def test_window_moved_is_the_exact_contributions(long_llama, long_pair):
    cap = long_pair[0]
    moved = moved_by_hand(long_llama, cap, 1, 3)
    w = window(cap, 1, 3, (300, 340), (250, 310), measure="moved")
    np.testing.assert_allclose(w.numpy(), moved[300:340, 250:310].numpy(), rtol=1e-4, atol=1e-8)
    fig = figures.window_figure(cap, 1, 3, (300, 340), (250, 310), measure="moved")
    z = heat(fig)
    ref = moved[300:340, 250:310].numpy()
    allowed = cap.allowed(1)[300:340, 250:310].numpy()
    np.testing.assert_allclose(z[allowed], ref[allowed], rtol=1e-4)
    assert np.isnan(z[~allowed]).all()
    assert "exact moved (‖α·f(x)‖) of queries 300–339 × keys 250–309" in fig.layout.title.text
    assert fig.data[0].colorbar.title.text == MOVED_BAR
    plain = figures.window_figure(cap, 1, 3, (300, 340), (250, 310))
    assert "exact weights of queries" in plain.layout.title.text and plain.data[0].colorbar.title.text == WEIGHT_BAR


# ---------------------------------------------------------------- compare
def test_compare_heads_moved_sets_the_two_contribution_maps_side_by_side(llama, decoder_cap):
    other = attnviz.capture(llama, input_ids=torch.arange(20, 30)[None])
    fig = figures.compare_heads(decoder_cap, other, 1, 2, measure="moved")
    ref_a, ref_b = moved_by_hand(llama, decoder_cap, 1, 2), moved_by_hand(llama, other, 1, 2)
    lower = np.tril_indices(10)
    np.testing.assert_allclose(heat(fig, 0)[lower], ref_a.numpy()[lower], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(heat(fig, 1)[lower], ref_b.numpy()[lower], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(heat(fig, 2)[lower], (ref_a - ref_b).numpy()[lower], rtol=1e-3, atol=1e-6)
    assert fig.data[0].zmax == pytest.approx(float(max(ref_a.max(), ref_b.max())), rel=1e-5)
    assert fig.data[0].colorbar.title.text == MOVED_BAR
    assert "tokens, moved (‖α·f(x)‖): max |A − B|" in fig.layout.title.text
    weights = figures.compare_heads(decoder_cap, other, 1, 2)
    assert "tokens, weights: max |A − B|" in weights.layout.title.text
    assert not np.allclose(heat(weights, 0)[lower], heat(fig, 0)[lower], atol=1e-4)


def test_compare_heads_moved_of_long_texts_pools_block_means(long_llama, long_pair):
    a, b = long_pair
    fig = figures.compare_heads(a, b, 0, 1, blocks=50, measure="moved")
    edges = block_edges(600, 50)
    ma, mb = moved_by_hand(long_llama, a, 0, 1), moved_by_hand(long_llama, b, 0, 1)

    def pooled(m):
        return torch.tensor(
            [[float(m[p:q, r:s].mean()) for r, s in zip(edges, edges[1:])] for p, q in zip(edges, edges[1:])]
        )

    pa, pb = pooled(ma), pooled(mb)
    keep = pa.numpy() != 0
    np.testing.assert_allclose(heat(fig, 0)[keep], pa.numpy()[keep], rtol=1e-4)
    np.testing.assert_allclose(heat(fig, 2), (pa - pb).numpy(), rtol=1e-3, atol=1e-7)
    exact = float((ma - mb).abs().max())
    assert f"max |A − B| {exact:.3f} cell by cell" in fig.layout.title.text
    assert "of moved (‖α·f(x)‖)" in fig.layout.title.text and fig.data[0].colorbar.title.text == "mean ‖α·f(x)‖"


def test_comparison_moved_weighs_the_models_own_weights_by_the_value_norms(tiny_bert_words, bert_cap):
    model, _ = tiny_bert_words
    fig = figures.validation_comparison(bert_cap, 1, 3, measure="moved")
    norms = bert_value_vectors(model, bert_cap, 1)[3].norm(dim=-1)
    theirs = bert_cap.layer(1).weights[3].float() * norms[None, :]
    np.testing.assert_allclose(heat(fig, 0), theirs.numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(heat(fig, 1), moved_by_hand(model, bert_cap, 1, 3, bert=True).numpy(), rtol=1e-4)
    assert "‖A·f(x)‖ (moved)" in fig.layout.annotations[0].text and ", moved: max" in fig.layout.title.text


def test_comparison_moved_needs_the_models_weights(decoder_cap):
    with pytest.raises(
        attnviz.InputError, match=r"moved \(‖α·f\(x\)‖\) is compared only against the model's own weights"
    ):
        figures.validation_comparison(decoder_cap, 1, 2, measure="moved")


# ---------------------------------------------------------------- bad input
BAD = "measure must be 'weights' (the attention weights α) or 'moved' (what each head moves, ‖α·f(x)‖), got 'norm'"


@pytest.mark.parametrize(
    "draw",
    [
        lambda c: figures.heatmap(c, 1, 2, measure="norm"),
        lambda c: figures.head_view(c, 1, [0], measure="norm"),
        lambda c: figures.model_view(c, measure="norm"),
        lambda c: figures.helpers.model_view_thumbnails(c, measure="norm"),
        lambda c: figures.overview_figure(c, 1, 2, measure="norm"),
        lambda c: figures.window_figure(c, 1, 2, (0, 4), (0, 4), measure="norm"),
        lambda c: figures.compare_heads(c, c, 1, 2, measure="norm"),
        lambda c: figures.validation_comparison(c, 1, 2, measure="norm"),
    ],
    ids=["heatmap", "head_view", "model_view", "thumbnails", "overview", "window", "compare_heads", "comparison"],
)
def test_a_bad_measure_names_the_two_allowed(decoder_cap, draw):
    with pytest.raises(attnviz.InputError) as err:
        draw(decoder_cap)
    assert str(err.value) == BAD


def test_a_layer_without_value_norms_is_the_captures_message(decoder_cap):
    cap = copy.deepcopy(decoder_cap)
    cap.layer(1).value_dots = None
    for draw in (
        lambda: figures.heatmap(cap, 1, 2, measure="moved"),
        lambda: figures.head_view(cap, 1, [0], measure="moved"),
        lambda: figures.model_view(cap, measure="moved"),
        lambda: figures.overview_figure(cap, 1, 2, size=4, measure="moved"),
    ):
        with pytest.raises(attnviz.InputError, match="this capture holds no value norms for layer 1"):
            draw()
    figures.heatmap(cap, 1, 2)  # the weights are still drawn
