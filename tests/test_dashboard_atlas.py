"""The Head atlas tab (issue 22): ``attnviz.analysis.head_atlas`` for the page's model over the server's
corpus (or the shipped probe sentences), run as a background job with progress, its map and table the
library's, and a click on a cell or a row selecting that head.

Driven as the page drives the callbacks (``_post``, which polls a background callback as the page does)
on a small app holding the atlas view only."""

from __future__ import annotations

import pytest
from attnviz.dashboard import atlas_view
from attnviz.dashboard.app import background_manager
from attnviz.dashboard.captures import FILE_PREFIX, Captures
from attnviz.dashboard.ids import ID, TID
from dash import Dash, html
from test_dashboard_probes import callback
from test_dashboard_server import _post

import attnviz
from attnviz.analysis import head_atlas

CORPUS = [
    "The cat sat on the mat because it was tired.",
    "A dog chased the ball, and then it ran home.",
    "My sister bought a new bike; she rides it every day.",
    "The river was cold, so the children left it.",
]


def atlas_app(models: dict, corpus: list[str] | None) -> Dash:
    app = Dash(__name__, suppress_callback_exceptions=True, background_callback_manager=background_manager())
    captures = Captures(models)
    app.layout = html.Div(atlas_view.layout())
    atlas_view.register(app, captures, corpus, "mini.txt")
    app.captures = captures
    return app


@pytest.fixture
def folder(model_folder, tiny_bert_words):
    return model_folder("tiny-bert", *tiny_bert_words)


def test_head_atlas_reports_its_progress(folder):
    """on_progress(done, total): the texts as they are added, then a step for the random sequences and one
    for the probe set, ``total`` counting them all; a callback of (done, total, what) — the old form — still
    hears what runs, with a DeprecationWarning."""
    seen: list[tuple[int, int]] = []
    head_atlas(folder, CORPUS, batch_size=2, progress=False, on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(2, 5), (4, 5), (4, 5), (5, 5)]
    with_probes: list[tuple[int, int]] = []
    head_atlas(folder, CORPUS, probes="en", progress=False, on_progress=lambda d, t: with_probes.append((d, t)))
    assert with_probes[-3:] == [(4, 6), (5, 6), (6, 6)]
    old: list[tuple[int, int, str]] = []
    with pytest.warns(DeprecationWarning, match="a callback of \\(done, total\\)"):
        head_atlas(folder, CORPUS, batch_size=2, progress=False, on_progress=lambda *a: old.append(a))
    texts = [s for s in old if s[2].startswith("text ")]
    assert [s[:2] for s in texts] == [(2, 5), (4, 5)] and texts[-1][2] == "text 4 of 4"
    assert old[-2:] == [(4, 5, "induction: 16 repeated random sequences"), (5, 5, "done")]


def test_the_tab_builds_the_librarys_atlas_over_the_servers_corpus(folder):
    app = atlas_app({folder: "tiny BERT"}, CORPUS)
    store = {"key": Captures.key(folder, CORPUS[0]), "model": folder, "bos": False}
    answer = _post(app, callback(app, f"{TID.graph}.figure"), {TID.run: 1}, {ID.store: store, TID.coreference: []})
    expected = head_atlas(folder, CORPUS, progress=False)
    rows = answer[TID.table]["data"]
    assert [(r["layer"], r["head"], r["roles"]) for r in rows] == list(
        zip(expected.layer.tolist(), expected["head"].tolist(), expected.roles.tolist())
    )
    assert rows[0]["sink"] == pytest.approx(round(float(expected.sink.iloc[0]), 3))
    met = int((expected.roles != "").sum())
    assert answer[TID.note]["children"].startswith(
        f"{folder}: {met} of {len(expected)} heads meet a role, over 4 texts"
    )
    assert "the corpus mini.txt" in answer[TID.note]["children"]
    assert "BOS" not in answer[TID.note]["children"]  # [CLS] starts every text: the box changes nothing
    figure = answer[TID.graph]["figure"]
    assert figure["data"][0]["type"] == "heatmap" and figure["layout"]["title"]["text"] == f"Head atlas of {folder}"


@pytest.mark.parametrize(("bos", "said"), [(True, ", with a BOS before each text."), (False, ", without a BOS.")])
def test_the_result_line_says_whether_a_bos_went_before_each_text(bos, said, llama_folder):
    # the atlas follows the side panel's box, and the roles move with it (SmolLM2: 244 vs 254 heads meet one)
    app = atlas_app({llama_folder: "tiny Llama"}, CORPUS)
    store = {"key": Captures.key(llama_folder, CORPUS[0], bos), "model": llama_folder, "bos": bos}
    answer = _post(app, callback(app, f"{TID.graph}.figure"), {TID.run: 1}, {ID.store: store, TID.coreference: []})
    expected = head_atlas(llama_folder, CORPUS, add_bos=bos, progress=False)
    note = answer[TID.note]["children"]
    assert note == (
        f"{llama_folder}: {int((expected.roles != '').sum())} of {len(expected)} heads meet a role, over 4 texts "
        f"({expected.attrs['tokens']:,} tokens) of the corpus mini.txt (its first 4 texts){said}"
    )


def test_the_corpus_line_names_the_file_once(folder):
    app = atlas_app({folder: "tiny BERT"}, CORPUS)
    line = _post(app, callback(app, f"{TID.corpus}.children"), {ID.tabs: "atlas"}, {})
    assert line[TID.corpus]["children"] == "Corpus: mini.txt (its first 4 texts)."  # was "Corpus: the corpus mini.txt"


def test_without_a_corpus_the_atlas_reads_the_shipped_probe_sentences(folder):
    app = atlas_app({folder: "tiny BERT"}, None)
    line = _post(app, callback(app, f"{TID.corpus}.children"), {ID.tabs: "atlas"}, {})
    assert line[TID.corpus]["children"] == f"Corpus: {atlas_view.SHIPPED}."
    texts = list(attnviz.workflows.corpus.corpus.read_texts(atlas_view.shipped_corpus()))
    assert len(texts) == 42 and "trophy" in texts[0]


def test_a_capture_file_or_no_capture_gets_a_message(folder):
    app = atlas_app({folder: "tiny BERT"}, CORPUS)
    build = callback(app, f"{TID.graph}.figure")
    nothing = _post(app, build, {TID.run: 1}, {ID.store: None})
    assert "Run the model first." in str(nothing[TID.graph]["figure"])
    refused = _post(app, build, {TID.run: 1}, {ID.store: {"key": "k", "model": FILE_PREFIX + "x.attnviz"}})
    assert "pick a model in the list" in refused[TID.note]["children"]


def test_a_cell_or_a_row_selects_the_head(folder):
    app = atlas_app({folder: "tiny BERT"}, CORPUS)
    select = callback(app, f"{ID.layer}.value")
    cell = _post(app, select, {TID.graph: {"points": [{"x": 3, "y": 1}]}}, {}, changed=[f"{TID.graph}.clickData"])
    assert (cell[ID.layer]["value"], cell[ID.head]["value"]) == (1, 3)
    row = _post(app, select, {TID.table: {"row": 0, "column": 2, "row_id": "0-2"}}, {})
    assert (row[ID.layer]["value"], row[ID.head]["value"]) == (0, 2)


def test_the_table_writes_a_score_on_the_side_of_its_threshold_it_is_on():
    """Rounded to three decimals, L0·H4's broad 0.79965 showed as 0.8 beside "≥ 0.8" with no role."""
    import pandas as pd

    atlas = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [4, 5],
            "roles": ["", "broad"],
            "positional_offset": [-1, 0],
            "broad": [0.799645, 0.81234],
            "coreference": [float("nan"), 0.5714],
        }
    )
    data, columns = atlas_view.table_of(atlas)
    assert [row["broad"] for row in data] == [0.7996, 0.812]
    assert data[1]["coreference"] == 0.571 and data[0]["coreference"] != data[0]["coreference"]  # NaN kept
    assert [c["id"] for c in columns] == ["layer", "head", "roles", "positional_offset", "broad", "coreference"]
    assert [c["name"] for c in columns][-2:] == ["broad (≥ 0.8)", "coreference (p ≤ 0.05)"]  # the intro says so
