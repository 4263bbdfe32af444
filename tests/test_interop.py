"""Where researchers already work: bertviz and CircuitsVis (the real packages), notebook HTML
reprs, and figures as one self-contained HTML file that renders offline."""

import json
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

import attnviz
from attnviz import figures
from attnviz.cli import main

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def cap(tiny_bert_words):
    model, tok = tiny_bert_words
    return attnviz.capture(model, TEXT, tok)


@pytest.fixture(scope="module")
def seq2seq(bert_tokenizer):
    model = attnviz.testing.tiny_model(
        "bart", vocab_size=bert_tokenizer.vocab_size, pad_token_id=0, decoder_start_token_id=102
    )
    return attnviz.capture(model, TEXT, bert_tokenizer, target="Le chat était fatigué.")


def bertviz_params(html: str) -> dict:
    """The JSON bertviz embeds in its page (``params = {...};``)."""
    start = html.index("params = ") + len("params = ")
    return json.JSONDecoder().raw_decode(html[start:])[0]


def test_bertviz_head_and_model_view_take_a_capture(cap):
    from bertviz import head_view, model_view

    params = bertviz_params(head_view(**cap.to_bertviz(), html_action="return").data)
    attn = torch.tensor(params["attention"][0]["attn"])  # [layer, head, q, k]
    assert attn.shape == (2, 4, cap.n_tokens, cap.n_tokens)
    torch.testing.assert_close(attn[1, 3], cap.attention(1, 3), atol=1e-6, rtol=0)
    assert params["attention"][0]["left_text"] == cap.token_labels
    assert "cat" in model_view(**cap.to_bertviz(words=True), html_action="return").data


def test_bertviz_encoder_decoder_views(seq2seq):
    from bertviz import model_view

    html = model_view(**seq2seq.to_bertviz(), html_action="return").data
    views = {v["name"]: v for v in bertviz_params(html)["attention"]}
    assert set(views) == {"Encoder", "Decoder", "Cross"}
    cross = torch.tensor(views["Cross"]["attn"])
    torch.testing.assert_close(cross[0, 2], seq2seq.attention(0, 2, part="cross"), atol=1e-6, rtol=0)
    assert (
        views["Cross"]["left_text"] == seq2seq.target.token_labels
        and views["Cross"]["right_text"] == seq2seq.token_labels
    )
    partial = attnviz.capture(attnviz.testing.tiny_model("llama"), input_ids=torch.arange(3, 9)[None], layers=[1])
    with pytest.raises(attnviz.InputError, match="bertviz numbers layers by position, so it needs every layer"):
        partial.to_bertviz()


def test_circuitsvis_attention_patterns_take_a_capture(cap, seq2seq):
    import circuitsvis as cv

    args = cap.to_circuitsvis(1)
    torch.testing.assert_close(args["attention"], cap.attention(1))
    rendered = str(cv.attention.attention_patterns(**args))
    assert '"tokens": ["[CLS]", "The", "cat"' in rendered
    heads = str(cv.attention.attention_heads(**args, attention_head_names=[f"L1·H{h}" for h in range(4)]))
    assert "attentionHeadNames" in heads and ("L1·H3" in heads or "L1\\u00b7H3" in heads)
    assert seq2seq.to_circuitsvis(0, part="decoder")["tokens"] == seq2seq.target.token_labels
    with pytest.raises(attnviz.InputError, match="CircuitsVis draws one sequence attending to itself"):
        seq2seq.to_circuitsvis(0, part="cross")


def test_notebook_reprs_are_compact_escaped_html(tiny_bert_words, seq2seq):
    from attnviz.analysis import rank_heads

    model, tok = tiny_bert_words
    tricky = attnviz.capture(model, "The <b>cat</b> & it.", tok)
    html = tricky._repr_html_()
    assert html.startswith("<div") and "&lt;" in html and "<b>cat</b>" not in html
    assert "self-check (sample): " in html and "encoder" in html
    assert "cross" in seq2seq._repr_html_() and "target tokens" in seq2seq._repr_html_()
    report = seq2seq.validate()._repr_html_()
    assert "PASS" in report and "the 5 heads closest to their tolerance" in report
    ranking = rank_heads(tricky, "it", ["cat"])._repr_html_()
    assert "coreference" in ranking and ranking.count("<tr>") == 9  # header + the 8 heads (at most 10)


def test_a_notebook_that_never_imported_the_figures_still_shows_the_html(tmp_path, cap):
    """The data model asks ``attnviz.data.reprs`` for its HTML, never the views: the first repr loads them."""
    path = cap.save(tmp_path / "cap.attnviz")
    code = (
        "import sys, attnviz\n"
        f"cap = attnviz.load({str(path)!r})\n"
        "assert 'attnviz.views.html' not in sys.modules and 'plotly' not in sys.modules\n"
        "html = cap._repr_html_()\n"
        "assert html.startswith('<div') and 'attnviz.views.html' in sys.modules\n"
        "print(cap.validate()._repr_html_().count('PASS'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 1


def test_the_interop_conversions_moved_to_the_data_model_and_keep_their_old_path(cap):
    from attnviz.data import interop
    from attnviz.views import interop as old

    assert old.to_bertviz is interop.to_bertviz and old.to_circuitsvis is interop.to_circuitsvis
    assert cap.to_circuitsvis(1)["tokens"] == interop.to_circuitsvis(cap, 1)["tokens"]


def test_probe_results_show_as_html(tiny_bert_words):
    model, tok = tiny_bert_words
    probes = [
        {
            "text": "The cat saw the dog because it was hungry.",
            "pronoun": "it",
            "candidates": ["cat", "dog"],
            "gold": "cat",
        }
    ] * 2
    html = attnviz.evaluate_probes(model, probes, tok, progress=False)._repr_html_()
    assert "probe set" in html and "2 probes" in html


def test_figures_as_one_html_file_that_needs_no_network(cap, tmp_path):
    figs = [figures.heatmap(cap, 1, 2), figures.model_view(cap)]
    written = figures.to_html(figs, tmp_path / "views.html", title="cat <1>")
    assert written == tmp_path / "views.html"  # the path, not the ~5 MB page (a notebook cell shows it)
    page = written.read_text()
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # each div's own id
    assert uuid.sub("id", page) == uuid.sub("id", figures.html_page(figs, title="cat <1>"))
    assert figures.to_html(figs) is None  # no path: nothing written, nothing returned
    assert "<script src=" not in page and page.count('class="plotly-graph-div"') == 2 and "cat &lt;1&gt;" in page
    with pytest.raises(attnviz.InputError, match="the folder .* does not exist"):
        figures.to_html(figures.heatmap(cap, 1, 2), tmp_path / "missing" / "x.html")


@pytest.mark.browser
def test_the_html_file_renders_in_a_browser_without_network(cap, tmp_path):
    path = tmp_path / "views.html"
    figures.to_html([figures.heatmap(cap, 1, 2), figures.head_view(cap, 1)], path)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Chromium is installed by `make test` (make browser)")
    dom = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tempfile.mkdtemp()}",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=8000",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    ).stdout
    assert dom.count('class="main-svg"') >= 4  # both figures drawn by the inlined plotly.js


def test_cli_export_writes_a_self_contained_page(cap, tmp_path, capsys):
    saved = cap.save(tmp_path / "cat.attnviz")
    out = tmp_path / "cat.html"
    assert (
        main(
            [
                "export",
                "--capture",
                str(saved),
                "-o",
                str(out),
                "--views",
                "heatmap,validation",
                "--layer",
                "1",
                "--head",
                "2",
                "--words",
            ]
        )
        == 0
    )
    assert "3 figure(s) written" in capsys.readouterr().out
    page = out.read_text()
    assert "<script src=" not in page and page.count('class="plotly-graph-div"') == 3
    assert main(["export", "--capture", str(saved), "-o", str(out), "--views", "pie"]) == 2
    assert "--views takes a comma-separated list of heatmap, head, model, validation" in capsys.readouterr().err
