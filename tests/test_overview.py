"""Long texts: a head's map pooled to the screen, and a zoom window at full resolution."""

import pytest
import torch

import attnviz
from attnviz.analysis.overview import block_edges, overview, thumbnails, window


def _pool(full: torch.Tensor, rows, cols, mode):
    out = torch.zeros(len(rows) - 1, len(cols) - 1)
    for i, (a, b) in enumerate(zip(rows, rows[1:])):
        for j, (c, d) in enumerate(zip(cols, cols[1:])):
            block = full[a:b, c:d]
            out[i, j] = block.max() if mode == "max" else block.mean()
    return out


@pytest.mark.parametrize("family", ["llama", "mistral", "gpt_oss", "t5"])
@pytest.mark.parametrize("mode", ["max", "mean"])
def test_overview_is_the_pooled_map_and_a_window_is_the_map_there(family, mode):
    model = attnviz.testing.tiny_model(family, attn_implementation="eager")
    ids = torch.randint(3, 120, (1, 61), generator=torch.Generator().manual_seed(0))
    kwargs = {"decoder_input_ids": ids[:, :23]} if model.config.is_encoder_decoder else {}
    cap = attnviz.capture(model, input_ids=ids, **kwargs)
    for part in cap.parts:
        full = cap.attention(1, 2, part=part)  # [query, key]
        ov = overview(cap, 1, 2, part=part, size=8, mode=mode)
        assert ov.row_edges == block_edges(full.shape[0], 8) and ov.col_edges == block_edges(full.shape[1], 8)
        assert ov.values.shape == (len(ov.row_edges) - 1, len(ov.col_edges) - 1)
        torch.testing.assert_close(ov.values, _pool(full, ov.row_edges, ov.col_edges, mode), atol=1e-6, rtol=0)
        n_q, n_k = full.shape
        zoom = window(cap, 1, 2, (n_q // 3, n_q - 2), (1, n_k // 2), part=part)
        torch.testing.assert_close(zoom, full[n_q // 3 : n_q - 2, 1 : n_k // 2], atol=1e-6, rtol=0)


def test_block_edges_cover_every_token_once():
    assert block_edges(10, 512) == list(range(11))
    assert block_edges(8192, 512) == list(range(0, 8193, 16))
    edges = block_edges(1000, 512)
    assert edges[0] == 0 and edges[-1] == 1000 and len(edges) - 1 <= 512


def test_overview_and_window_errors():
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), input_ids=torch.randint(3, 120, (1, 20)))
    with pytest.raises(attnviz.InputError, match="mode"):
        overview(cap, 0, 0, mode="median")
    with pytest.raises(attnviz.InputError, match="size"):
        overview(cap, 0, 0, size=0)
    with pytest.raises(attnviz.OutOfRangeError, match="rows"):
        window(cap, 0, 0, (5, 30), (0, 4))
    with pytest.raises(attnviz.ArgumentTypeError, match="keys"):
        window(cap, 0, 0, (0, 4), "all")
    with pytest.raises(attnviz.OutOfRangeError, match="head"):
        overview(cap, 0, 9)


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "t5"])
def test_thumbnails_are_every_head_pooled_as_adaptive_max_pooling_bins_it(family):
    model = attnviz.testing.tiny_model(family, attn_implementation="eager")
    ids = torch.randint(3, 120, (1, 61), generator=torch.Generator().manual_seed(0))
    kwargs = {"decoder_input_ids": ids[:, :23]} if model.config.is_encoder_decoder else {}
    cap = attnviz.capture(model, input_ids=ids, **kwargs)
    for part in cap.parts:
        full = cap.attention(1, part=part)  # [head, query, key]
        n_q, n_k = full.shape[1:]
        for size in [(7, 5), (min(24, n_q), 9), (n_q, n_k)]:  # bins that overlap by a row; none pooled
            expected = torch.nn.functional.adaptive_max_pool2d(full[None], size)[0]
            torch.testing.assert_close(thumbnails(cap, 1, size, part=part), expected, atol=1e-6, rtol=0)
    with pytest.raises(attnviz.OutOfRangeError, match="size"):
        thumbnails(cap, 1, (0, 4), part=part)
    with pytest.raises(attnviz.ArgumentTypeError, match="size"):
        thumbnails(cap, 1, 24, part=part)


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "t5", "bloom", "bert"])
def test_the_overview_pass_fills_the_heads_log_sum_exp_so_the_first_zoom_reads_no_key_pass(family, monkeypatch):
    """The overview sees every row of the head: each row's log-sum-exp comes out of its weights
    (``lse_from_weights``) and is kept on the record, equal to what ``fill_lse()``'s key-tiled pass computes
    (sinks — gpt-oss —, T5's position bias, ALiBi — BLOOM —, padding-free masks); the zoom after it
    computes no log-sum-exp of its own (``online_attention`` is never called) and is the map's tile."""
    model = attnviz.testing.tiny_model(family)
    ids = torch.randint(3, 120, (1, 57), generator=torch.Generator().manual_seed(1))
    kwargs = {"decoder_input_ids": ids[:, :19]} if model.config.is_encoder_decoder else {}
    cap = attnviz.capture(model, input_ids=ids, **kwargs)
    for part in cap.parts:
        rec = cap.layer(1, part)
        rec.lse = None
        overview(cap, 1, 2, part=part, size=8)
        filled = rec.lse.clone()
        assert not torch.isnan(filled[2]).any() and torch.isnan(filled[[0, 1, 3]]).all()  # that head's rows only
        rec.lse = None
        reference = rec.fill_lse()
        torch.testing.assert_close(filled[2], reference[2], atol=2e-6, rtol=0)
        rec.lse = filled
        full = cap.attention(1, 2, part=part)

        def no_key_pass(*args, **kwargs):
            raise AssertionError("the first zoom ran a key-tiled pass: the overview did not fill the lse")

        with monkeypatch.context() as patched:
            patched.setattr("attnviz.data.records.online_attention", no_key_pass)
            n_q, n_k = full.shape
            zoom = window(cap, 1, 2, (3, n_q - 1), (0, n_k // 2), part=part)
        torch.testing.assert_close(zoom, full[3 : n_q - 1, : n_k // 2], atol=1e-6, rtol=0)
