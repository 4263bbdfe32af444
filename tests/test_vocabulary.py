"""One name per idea (issue 43): the old names keep working one release, each use warning with a
DeprecationWarning that names the new one; both spellings at once are refused."""

from __future__ import annotations

import pytest
import torch

import attnviz
from attnviz.analysis import corpus_stats, rollout_rows, summarize
from attnviz.errors import ArgumentTypeError
from attnviz.figures.helpers import model_view_thumbnails

PROGRESS = {
    "summarize": lambda cap, **kw: summarize(cap, **kw),
    "rollout_rows": lambda cap, **kw: rollout_rows(cap, [0, 7], **kw),
    "model_view_thumbnails": lambda cap, **kw: model_view_thumbnails(cap, **kw),
}


@pytest.fixture(scope="module")
def llama():
    model = attnviz.testing.tiny_model("llama")
    return model, attnviz.capture(model, input_ids=torch.arange(1, 9)[None])


@pytest.mark.parametrize("name", sorted(PROGRESS))
def test_on_progress_is_the_progress_callback_and_on_layer_its_deprecated_name(llama, name):
    _, cap = llama
    call = PROGRESS[name]
    new: list[tuple[int, int]] = []
    call(cap, on_progress=lambda done, total: new.append((done, total)))
    assert new == [(1, 2), (2, 2)]
    old: list[tuple[int, int]] = []
    with pytest.warns(DeprecationWarning, match=rf"{name}\(on_layer=…\) is deprecated.*use on_progress="):
        call(cap, on_layer=lambda done, total: old.append((done, total)))
    assert old == new
    with pytest.raises(ArgumentTypeError, match="pass on_progress= only"):
        call(cap, on_progress=print, on_layer=print)


def test_tap_keep_on_device_and_to_cpu_its_deprecated_inverted_name(llama):
    model, _ = llama
    ids = torch.arange(1, 9)[None]
    with attnviz.tap(model, keep_on_device=True) as kept:
        model(input_ids=ids)
    assert kept.keep_on_device
    with attnviz.tap(model) as copied:
        model(input_ids=ids)
    assert not copied.keep_on_device
    with pytest.warns(DeprecationWarning, match=r"tap\(to_cpu=…\) is deprecated.*use keep_on_device="):
        with attnviz.tap(model, to_cpu=False) as old:
            model(input_ids=ids)
    assert old.keep_on_device and len(old.calls) == len(kept.calls)


def test_corpus_stats_on_progress_counts_texts_and_on_batch_is_deprecated(tiny_bert_words):
    model, tok = tiny_bert_words
    texts = ["The cat sat.", "A dog ran far away.", "It rained.", "Birds sing at dawn."]
    seen: list[tuple[int, int]] = []
    new = corpus_stats(model, texts, tok, batch_size=2, progress=False, on_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(2, 4), (4, 4)]
    lazy: list[tuple[int, int]] = []
    corpus_stats(model, iter(texts), tok, batch_size=2, progress=False, on_progress=lambda d, t: lazy.append((d, t)))
    assert lazy == [(2, 0), (4, 0)]  # an iterator's size is not known
    batches: list[tuple[int, int]] = []
    with pytest.warns(DeprecationWarning, match=r"corpus_stats\(on_batch=\) is deprecated"):
        old = corpus_stats(
            model, texts, tok, batch_size=2, progress=False, on_batch=lambda t, n: batches.append((t, n))
        )
    assert [t for t, _ in batches] == [2, 4] and batches[-1][1] == new.attrs.get("tokens", batches[-1][1])
    assert old.equals(new)


def test_what_a_head_moves_is_called_moved_and_contributions_is_its_deprecated_name(llama):
    _, cap = llama
    with pytest.warns(DeprecationWarning, match=r"Capture.contributions\(\) is deprecated.*use Capture.moved\(\)"):
        old = cap.contributions(1, 2, words=True)
    torch.testing.assert_close(old, cap.moved(1, 2, words=True), rtol=0, atol=0)
    table = cap.to_pandas(1, 2)
    assert "moved" in table.columns and "contribution" not in table.columns
