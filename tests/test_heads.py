"""capture(heads=...): a long capture keeps only some query heads, and every head keeps the model's number."""

from __future__ import annotations

import re

import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.analysis import detect_heads, head_stats
from attnviz.data.capture import RECORD_TENSORS
from attnviz.figures.helpers import model_view_cell


def _bytes(cap) -> int:
    return sum(
        t.numel() * t.element_size()
        for rec in cap.records.values()
        for name in RECORD_TENSORS
        if isinstance(t := getattr(rec, name), torch.Tensor)
    )


def _ids(n: int = 24, seed: int = 7) -> torch.Tensor:
    return torch.randint(3, 100, (1, n), generator=torch.Generator().manual_seed(seed))


def _pair(model, heads, **kwargs):
    ids = _ids()
    extra = {"decoder_input_ids": ids[:, :11]} if model.config.is_encoder_decoder else {}
    full = attnviz.capture(model, input_ids=ids, **extra, **kwargs)
    kept = attnviz.capture(model, input_ids=ids, heads=heads, **extra, **kwargs)
    return full, kept


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "bart", "t5"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_the_kept_heads_are_the_full_captures_same_heads_exactly(tiny, family, backend):
    """Maps, Q/K/V, what moves, a tile and A·V of the kept heads equal the same heads of a full capture, bit
    for bit (the independent reference: the full capture, itself checked against the model's own output)."""
    full, kept = _pair(tiny(family, backend), [1, 3])
    assert kept.model["heads"] == [1, 3] and "heads" not in full.model
    assert kept.model["check_error"] == pytest.approx(full.model["check_error"], rel=1e-6, abs=1e-12)  # every head
    for part in full.parts:
        assert kept.kept_heads(part) == [1, 3] and full.kept_heads(part) == [0, 1, 2, 3]
        for layer in full.layer_indices(part):
            rec = kept.layer(layer, part)
            assert rec.heads == [1, 3] and rec.q.shape[0] == 2
            torch.testing.assert_close(
                kept.attention(layer, part=part), full.attention(layer, part=part)[[1, 3]], rtol=0, atol=0
            )
            for head in (1, 3):
                for name in ("q", "k", "v"):
                    theirs, ours = getattr(full, name)(layer, part, head), getattr(kept, name)(layer, part, head)
                    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
                for name in ("attention", "moved", "output", "scores"):
                    ours = getattr(kept, name)(layer, head, part=part)
                    torch.testing.assert_close(ours, getattr(full, name)(layer, head, part=part), rtol=0, atol=0)
                tile = dict(part=part, rows=[0, 5, 10], cols=range(2, 9))
                torch.testing.assert_close(
                    kept.attention(layer, head, **tile), full.attention(layer, head, **tile), rtol=0, atol=0
                )
            if rec.weights is not None:  # eager: the model's own weights, narrowed to the same heads
                torch.testing.assert_close(rec.weights, full.layer(layer, part).weights[[1, 3]], rtol=0, atol=0)
    assert kept.validate().passed


def test_a_gqa_model_keeps_the_key_value_heads_its_query_heads_read_and_no_more(tiny):
    """Tiny Llama: 4 query heads over 2 KV heads (0,1 read KV 0; 2,3 read KV 1)."""
    full, kept = _pair(tiny("llama"), [0, 1])
    rec = kept.layer(0)
    assert rec.q.shape[0] == 2 and rec.k.shape[0] == 1 and rec.v.shape[0] == 1 and rec.kv_heads == [0, 0]
    torch.testing.assert_close(rec.k[0], full.layer(0).k[0], rtol=0, atol=0)
    _, other = _pair(tiny("llama"), [1, 2])  # one head of each group: both KV heads
    rec = other.layer(1)
    assert rec.k.shape[0] == 2 and rec.kv_heads == [0, 1]
    for head in (1, 2):
        torch.testing.assert_close(other.k(1, head=head), full.k(1, head=head), rtol=0, atol=0)
        torch.testing.assert_close(other.attention(1, head), full.attention(1, head), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_the_bytes_kept_shrink_in_proportion_to_the_heads(tiny, family):
    """Half the query heads (and, under GQA, half the KV heads): every per-head tensor halves; the output
    projection's check, one per layer, stays."""
    full, kept = _pair(tiny(family), [0, 1])
    per_layer = sum(rec.projection_check.numel() * 4 for rec in full.records.values())
    assert _bytes(kept) - per_layer == (_bytes(full) - per_layer) // 2
    assert kept.nbytes <= full.nbytes // 2 + per_layer  # nothing keeps the whole stacks alive
    _, one = _pair(tiny(family), [2])  # a quarter of the query heads; of the KV heads, the one it reads
    kv = _kv_bytes(full)
    query_side = _bytes(full) - per_layer - kv  # q, out, value dots: per query head
    assert _bytes(one) - per_layer == query_side // 4 + (kv // 4 if family == "bert" else kv // 2)


def test_the_bytes_per_token_per_layer_are_what_the_guide_computes_from_the_shapes(tiny):
    """Per query head kept: Q and the output (d_head each, model dtype) and w float32 value dots; per
    key/value head read: K and V (d_head each) — the guide's table, here on tiny Llama (GQA)."""
    _, kept = _pair(tiny("llama"), [1, 2])  # heads 1, 2 read KV heads 0 and 1
    rec = kept.layer(0)
    n, d, es, w = rec.n_queries, rec.q.shape[-1], rec.q.element_size(), rec.value_dots.shape[-1]
    per_token_layer = 2 * (2 * d * es + w * 4) + 2 * (2 * d * es)
    checks = sum(r.projection_check.numel() * 4 for r in kept.records.values())
    assert _bytes(kept) == per_token_layer * n * len(kept.records) + checks


def _kv_bytes(cap) -> int:
    return sum(t.numel() * t.element_size() for rec in cap.records.values() for t in (rec.k, rec.v))


def test_a_saved_capture_keeps_the_head_numbers(tiny, tmp_path):
    _, kept = _pair(tiny("llama"), [1, 2])
    back = attnviz.load(kept.save(tmp_path / "heads.attnviz"))
    assert back.model["heads"] == [1, 2] and back.kept_heads() == [1, 2]
    assert back.layer(0).heads == [1, 2] and back.layer(0).kv_heads == [0, 1]
    for head in (1, 2):
        torch.testing.assert_close(back.attention(1, head), kept.attention(1, head), rtol=0, atol=0)
    with pytest.raises(attnviz.HeadNotKeptError, match=r"head 3 was not kept: this capture kept heads 1, 2"):
        back.attention(0, 3)


def test_a_head_not_kept_is_refused_with_the_heads_kept(tiny):
    _, kept = _pair(tiny("gpt2"), [1, 3])
    message = r"head 2 was not kept: this capture kept heads 1, 3 .*capture again with heads=None or including 2"
    for call in (
        lambda: kept.attention(0, 2),
        lambda: kept.moved(0, 2),
        lambda: kept.q(0, head=2),
        lambda: kept.attention(0, 2, rows=[0], cols=[0]),
        lambda: kept.to_pandas(0, 2),
        lambda: figures.heatmap(kept, 0, 2),
        lambda: figures.validation_comparison(kept, 0, 2),
    ):
        with pytest.raises(attnviz.HeadNotKeptError, match=message):
            call()
    assert issubclass(attnviz.HeadNotKeptError, attnviz.OutOfRangeError)
    with pytest.raises(attnviz.OutOfRangeError, match=r"head 4 is out of range: this model has heads 0\.\.3"):
        kept.attention(0, 4)
    with pytest.raises(attnviz.InputError, match=r"bertviz numbers heads by position, so it needs every head"):
        kept.to_bertviz()


#: heads= a 4-head model cannot keep: the argument, the error, what it says
BAD_HEADS = [
    ([7], attnviz.OutOfRangeError, r"heads=: head 7 is out of range: this model has heads 0\.\.3"),
    ([], attnviz.InputError, r"heads= names no head"),
    (["1"], attnviz.ArgumentTypeError, r"heads= takes ints \(the model's head numbers\), got '1'"),
    ({0: [9]}, attnviz.OutOfRangeError, r"heads= \(layer 0\): head 9 is out of range"),
    (1.5, attnviz.ArgumentTypeError, r"heads= takes a list of head numbers"),
]


@pytest.mark.parametrize("heads, error, message", BAD_HEADS)
def test_heads_that_cannot_be_kept_are_refused_before_the_forward(tiny, heads, error, message, monkeypatch):
    model = tiny("bert")
    ran = []
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: ran.append(1))
    with pytest.raises(error, match=message):
        attnviz.capture(model, input_ids=_ids(), heads=heads)
    assert not ran


def test_per_layer_heads_keep_every_head_of_a_layer_not_named(tiny):
    model = tiny("bert")
    full = attnviz.capture(model, input_ids=_ids())
    kept = attnviz.capture(model, input_ids=_ids(), heads={1: [2]})
    assert kept.layer(0).heads is None and kept.layer(1).heads == [2]
    assert kept.model["heads"] == {"1": [2]}
    torch.testing.assert_close(kept.attention(1, 2), full.attention(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(kept.attention(0), full.attention(0), rtol=0, atol=0)
    with pytest.raises(attnviz.HeadNotKeptError, match="head 0 was not kept"):
        kept.attention(1, 0)
    with pytest.raises(attnviz.InputError, match="different heads in different layers"):
        head_stats(kept)


def test_tables_figures_and_analyses_label_the_models_numbers(tiny):
    full, kept = _pair(tiny("bert"), [1, 3])
    table = kept.to_pandas(0)
    assert sorted(table["head"].unique()) == [1, 3]
    theirs = full.to_pandas(0)
    for head in (1, 3):
        mine, ref = table[table["head"] == head], theirs[theirs["head"] == head]
        assert mine["weight"].tolist() == ref["weight"].tolist()
    report = kept.validate()
    assert {r["head"] for r in report.rows} == {1, 3}
    assert re.search(r"at L\d·H[13]\b", str(report))
    stats, ref = head_stats(kept), head_stats(full)
    assert stats[["layer", "head"]].values.tolist() == [[0, 1], [0, 3], [1, 1], [1, 3]]
    ref = ref[ref["head"].isin([1, 3])].reset_index(drop=True)
    assert stats.drop(columns=[]).equals(ref)
    scores = detect_heads(kept, "previous_token")
    assert scores["head"].tolist() == [1, 3, 1, 3]
    head_view = figures.head_view(kept, 0)
    assert [t.name for t in head_view.data if t.name and t.name.startswith("H")][:2] == ["H1", "H3"]
    model_view = figures.model_view(kept)
    assert list(model_view.layout.xaxis.ticktext) == ["H1", "H3"]
    assert "heads kept (H1, H3)" in model_view.layout.title.text
    assert model_view_cell(kept, x=model_view.layout.xaxis.tickvals[1], y=1) == (0, 3)
    assert "L0·H3" in figures.heatmap(kept, 0, 3).layout.title.text
    circuits = kept.to_circuitsvis(1)
    torch.testing.assert_close(circuits["attention"], full.attention(1)[[1, 3]].cpu(), rtol=0, atol=0)
    assert "kept heads 1, 3" in repr(kept)


def test_the_command_line_keeps_heads_and_refuses_one_out_of_range_before_the_weights(tmp_path, capsys, monkeypatch):
    from attnviz.cli import main

    path = tmp_path / "heads.attnviz"
    assert main(["capture", "minilm", "The cat sat on the mat.", "--heads", "3,7", "-o", str(path)]) == 0
    kept = attnviz.load(path)
    assert kept.kept_heads() == [3, 7] and kept.layer(0).q.shape[0] == 2
    html = tmp_path / "heads.html"
    assert main(["export", "--capture", str(path), "-o", str(html), "--views", "heatmap,model"]) == 0
    capsys.readouterr()
    assert main(["export", "--capture", str(path), "-o", str(html), "--head", "2"]) == 2
    assert "--head 2: " in capsys.readouterr().err

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before --heads was checked")

    monkeypatch.setattr("attnviz.workflows.capture.pipeline.load_model", refuse)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:  # argparse's own one line
        main(["capture", "minilm", "The cat sat.", "--heads", "a"])
    assert stop.value.code == 2 and "--heads takes comma-separated integers like 3,7" in capsys.readouterr().err
    for argv, said in (
        (
            ["capture", "minilm", "The cat sat.", "--heads", "99"],
            "--heads: head 99 is out of range: minilm has heads 0..11",
        ),
        (["validate", "minilm", "The cat sat.", "--heads", "12"], "--heads: head 12 is out of range"),
        (
            ["export", "minilm", "The cat.", "-o", str(html), "--heads", "3,7", "--head", "1"],
            "--head 1 is not among --heads 3,7",
        ),
    ):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err


@pytest.mark.browser
@pytest.mark.slow
def test_the_page_offers_only_the_kept_heads_by_their_numbers(dash_duo, tmp_path, tiny_bert_words):
    """A capture file of heads 1 and 3 opens on one of them; the head selectors offer H1 and H3 only, and
    picking H3 draws the model's head 3 (the title names it)."""
    from attnviz.dashboard import create_app
    from attnviz.dashboard.ids import ID
    from test_dashboard import CAT, MODELS, choose, no_console_errors, show_heatmap_in_tokens, wait_status

    model, tok = tiny_bert_words
    path = attnviz.capture(model, CAT, tok, heads=[1, 3]).save(tmp_path / "heads.attnviz")
    dash_duo.start_server(create_app(MODELS, capture_file=str(path)))
    wait_status(dash_duo, "2 layers × 4 heads (4 KV), kept heads H1, H3")
    show_heatmap_in_tokens(dash_duo)  # the page opens on the Lab in words
    title = dash_duo.find_element(f"#{ID.heatmap} .gtitle").text
    assert re.search(r"L\d·H[13]\b", title), title
    dropdown = dash_duo.find_element(f"#{ID.head}")
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", dropdown)
    dropdown.click()
    dash_duo.wait_for_element(".dash-dropdown-options")
    assert [o.text.strip() for o in dash_duo.find_elements(".dash-dropdown-option")] == ["H1", "H3"]
    dropdown.click()
    choose(dash_duo, f"#{ID.head}", 1)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "·H3")
    no_console_errors(dash_duo)


def test_a_vision_encoder_keeps_some_heads_too():
    """The picture path (its third argument is the image processor) narrows the records as the text path does."""
    from PIL import Image

    model, processor = attnviz.testing.tiny_model("vit"), attnviz.testing.tiny_processor("vit")
    picture = Image.new("RGB", (32, 32), (200, 40, 90))
    full = attnviz.capture(model, picture, processor)
    kept = attnviz.capture(model, picture, processor, heads=[0, 2])
    assert kept.kept_heads() == [0, 2] and kept.layer(0).q.shape[0] == 2
    torch.testing.assert_close(kept.attention(1, 2), full.attention(1, 2), rtol=0, atol=0)
