"""summarize: one pass over a part's heads gives what each heavy view's own function gives —
thumbnails, head statistics, rollout block means and the full validation — on several families."""

from dataclasses import replace

import pandas as pd
import pytest
import torch
from numpy.testing import assert_array_equal

import attnviz
from attnviz.analysis import Summary, head_stats, rollout, rollout_blocks, summarize
from attnviz.analysis.overview import MODEL_VIEW_CELLS, thumbnails
from attnviz.figures import model_view
from attnviz.figures.helpers import model_view_thumbnails

N = 37  # > MODEL_VIEW_CELLS: the thumbnails are pooled


def ids(n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 120, (1, n), generator=torch.Generator().manual_seed(seed))


def padded_encoder() -> attnviz.Capture:
    """A BERT capture whose records carry a key-padding mask (the last 5 keys masked out)."""
    cap = attnviz.capture(attnviz.testing.tiny_model("bert"), input_ids=ids())
    allowed = torch.ones(N, N, dtype=torch.bool)
    allowed[:, -5:] = False
    return replace(cap, records={key: replace(rec, mask=allowed) for key, rec in cap.records.items()})


CASES = {
    "llama-gqa-eager-kept-weights": lambda: attnviz.capture(
        attnviz.testing.tiny_model("llama", attn_implementation="eager"), input_ids=ids(), keep_weights=True
    ),
    "llama-gqa-sdpa": lambda: attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=ids()),
    "bert-padding-mask": padded_encoder,
    "mistral-sliding-window": lambda: attnviz.capture(
        attnviz.testing.tiny_model("mistral", attn_implementation="eager"), input_ids=ids()
    ),
    "falcon-alibi": lambda: attnviz.capture(attnviz.testing.tiny_model("falcon_alibi"), input_ids=ids()),
    "t5-encoder-decoder": lambda: attnviz.capture(
        attnviz.testing.tiny_model("t5"), input_ids=ids(), decoder_input_ids=ids(29, seed=1)
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    return request.param, CASES[request.param]()


def self_parts(cap: attnviz.Capture) -> list[str]:
    return [p for p in cap.parts if p != "cross"]


def assert_same_validation(summary: Summary, cap: attnviz.Capture, part: str) -> None:
    expected = [r for r in cap.validate().rows if r["part"] == part]
    assert len(summary.validation.rows) == len(expected) > 0
    for ours, theirs in zip(summary.validation.rows, expected):
        assert {k: v for k, v in ours.items() if not isinstance(v, float)} == {
            k: v for k, v in theirs.items() if not isinstance(v, float)
        }
        # the summary recomputes in chunks of rows, cap.validate() in tiles of rows and keys (online softmax):
        # the same float32 sums in another order, so an error may differ by a few ulps of the head's scale
        scale = theirs["max_abs_error"] / theirs["rel_error"] if theirs["rel_error"] else 1.0
        ulps = 4 * torch.finfo(torch.float32).eps
        assert ours["tolerance"] == pytest.approx(theirs["tolerance"], rel=1e-6), (ours, theirs)
        assert ours["max_abs_error"] == pytest.approx(theirs["max_abs_error"], rel=1e-5, abs=ulps * scale), (
            ours,
            theirs,
        )
        assert ours["rel_error"] == pytest.approx(theirs["rel_error"], rel=1e-5, abs=ulps), (ours, theirs)
    assert not summary.validation.sample
    assert (summary.validation.model, summary.validation.backend, summary.validation.dtype) == (
        str(cap.model["name"]),
        str(cap.model["backend"]),
        cap.model.get("dtype", "float32"),
    )


def test_every_field_equals_the_separate_functions(case):
    name, cap = case
    for part in self_parts(cap):
        n = cap.select(part).n_tokens
        for block in (1, 3):
            summary = summarize(cap, part=part, rollout_block=block)
            assert summary.part == part and summary.layers == cap.layer_indices(part)
            size = (min(n, MODEL_VIEW_CELLS),) * 2
            assert summary.thumb_size == size
            assert list(summary.thumbnails) == summary.layers
            for layer, pooled in summary.thumbnails.items():
                torch.testing.assert_close(pooled, thumbnails(cap, layer, size, part=part), atol=1e-6, rtol=0)
            pd.testing.assert_frame_equal(summary.head_stats(), head_stats(cap, part=part), rtol=1e-5, atol=1e-6)
            expected = rollout(cap, part=part)[-1] if block == 1 else rollout_blocks(cap, block, part=part)
            assert summary.rollout_block == block and summary.rollout_error is None
            torch.testing.assert_close(summary.rollout, expected, atol=1e-6, rtol=1e-5)
            assert_same_validation(summary, cap, part)
            tensors = [*summary.thumbnails.values(), summary.stats.sums, summary.stats.counts, summary.rollout]
            assert summary.nbytes == sum(t.numel() * t.element_size() for t in tensors)


def test_defaults_sizes_residual_and_detectors():
    cap = CASES["llama-gqa-sdpa"]()
    summary = summarize(cap, thumb_size=(7, 5), residual=0.2, detectors=False)
    assert summary.rollout_block == 1  # ceil(37 / 512)
    torch.testing.assert_close(summary.rollout, rollout(cap, residual=0.2)[-1], atol=1e-6, rtol=1e-5)
    for layer, pooled in summary.thumbnails.items():
        torch.testing.assert_close(pooled, thumbnails(cap, layer, (7, 5)), atol=1e-6, rtol=0)
    pd.testing.assert_frame_equal(summary.head_stats(), head_stats(cap, detectors=False), rtol=1e-5, atol=1e-6)


def test_long_text_default_rollout_block_is_a_512_cell_bound():
    cap = attnviz.capture(attnviz.testing.tiny_model("llama", max_position_embeddings=1100), input_ids=ids(1030))
    summary = summarize(cap)
    assert summary.rollout_block == 3 and summary.rollout.shape == (344, 344)  # ceil(1030 / 512), ceil(1030 / 3)
    torch.testing.assert_close(summary.rollout, rollout_blocks(cap, 3), atol=1e-6, rtol=1e-5)


def test_on_progress_sees_each_layer_and_an_exception_from_it_stops_the_pass():
    cap = CASES["llama-gqa-sdpa"]()
    seen = []
    summarize(cap, on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 2), (2, 2)]

    class Cancelled(Exception):
        pass

    calls = []

    def cancel(done, total):
        calls.append(done)
        raise Cancelled

    with pytest.raises(Cancelled):
        summarize(cap, on_progress=cancel)
    assert calls == [1]  # stopped after the first layer


def test_missing_layers_leave_rollout_none_with_its_reason_and_the_rest_computed():
    cap = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=ids(), layers=[1])
    summary = summarize(cap)
    with pytest.raises(attnviz.InputError) as refused:
        rollout(cap)
    assert summary.rollout is None and summary.rollout_error == str(refused.value)
    assert summary.rollout_error == "rollout needs every layer; this capture has [1] of 2: capture with layers=None"
    assert summary.layers == [1] and list(summary.thumbnails) == [1]
    torch.testing.assert_close(summary.thumbnails[1], thumbnails(cap, 1, (24, 24)), atol=1e-6, rtol=0)
    pd.testing.assert_frame_equal(summary.head_stats(), head_stats(cap), rtol=1e-5, atol=1e-6)
    assert_same_validation(summary, cap, "decoder")
    assert (
        summary.nbytes
        == sum(t.numel() * t.element_size() for t in summary.thumbnails.values())
        + (summary.stats.sums.numel() + summary.stats.counts.numel()) * 8
    )


def test_refusals():
    cap = CASES["t5-encoder-decoder"]()
    with pytest.raises(attnviz.InputError, match="cross-attention reads the target over the source"):
        summarize(cap, part="cross")
    with pytest.raises(attnviz.InputError, match="say which with part="):
        summarize(cap)
    with pytest.raises(attnviz.InputError, match=r"residual must be in \[0, 1\], got 2"):
        summarize(cap, part="encoder", residual=2)
    with pytest.raises(attnviz.InputError, match=r"block must be a whole number of tokens in 1\.\.37, got 0"):
        summarize(cap, part="encoder", rollout_block=0)
    with pytest.raises(attnviz.OutOfRangeError, match="size"):
        summarize(cap, part="encoder", thumb_size=(0, 4))


def test_model_view_draws_the_summary_thumbnails_and_ignores_ones_of_another_size():
    cap = CASES["llama-gqa-sdpa"]()
    summary = summarize(cap)
    z = model_view(cap).data[0].z
    assert_array_equal(model_view(cap, thumbnails=summary.thumbnails).data[0].z, z)
    zeros = {layer: torch.zeros_like(t) for layer, t in summary.thumbnails.items()}
    drawn = model_view(cap, thumbnails=zeros).data[0].z
    assert (drawn[:MODEL_VIEW_CELLS, :MODEL_VIEW_CELLS] == 0).all()  # L0·H0 is the given (zero) thumbnail
    other = summarize(cap, thumb_size=(7, 5)).thumbnails
    assert_array_equal(model_view(cap, thumbnails=other).data[0].z, z)  # not this figure's size: computed here
    words = model_view(cap, words=True).data[0].z  # word thumbnails: model_view_thumbnails(words=True)'s
    assert_array_equal(model_view(cap, words=True, thumbnails=model_view_thumbnails(cap, words=True)).data[0].z, words)
