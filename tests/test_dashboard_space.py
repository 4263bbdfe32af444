"""The Q·K space tab (issue 22): this text's or the server's corpus's queries and keys of one head
(``attnviz.analysis.qk_space``, cached per head and method), a corpus embedded by a background job,
and a click on a point opening its token in the AttentionLab — a query as the Lab's query, a key as its
highlighted key; a corpus text is run first, as the page runs any text.

The callbacks are driven as the page drives them (``_post``) on a small app with the Q·K view only;
one browser test clicks a point of the whole dashboard."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnviz.dashboard import create_app, space_view
from attnviz.dashboard.app import background_manager
from attnviz.dashboard.captures import Captures
from attnviz.dashboard.ids import ID, SID
from dash import Dash, html
from test_dashboard_probes import callback
from test_dashboard_server import _post
from test_stats_moved import _array

import attnviz
from attnviz.analysis import qk_space

TEXT = "The cat sat on the mat because it was tired."
CORPUS = [
    "A dog chased the ball, and then it ran home.",
    "My sister bought a new bike; she rides it every day.",
    "The river was cold, so the children left it.",
]


def space_app(models: dict, corpus: list[str] | None, **kwargs) -> Dash:
    app = Dash(__name__, suppress_callback_exceptions=True, background_callback_manager=background_manager())
    captures = Captures(models, **kwargs)
    app.layout = html.Div(space_view.layout())
    space_view.register(app, captures, corpus, "mini.txt")
    app.captures = captures
    return app


def _callback(app: Dash, *, runs: bool) -> str:
    """The click's callback (``runs``: it may run a corpus text) or the one that moves the Lab once it ran."""
    return next(k for k in app.callback_map if f"{SID.drill}.data" in k and (f"{ID.text}.value" in k) == runs)


@pytest.fixture
def folder(model_folder, tiny_bert_words):
    return model_folder("tiny-bert", *tiny_bert_words)


def _space(app, store, *, source="text", layer=1, head=2, method="pca", page="p1", done=None):
    inputs = {
        ID.store: store,
        ID.layer: layer,
        ID.head: head,
        SID.source: source,
        SID.method: method,
        SID.color: "kind",
        SID.normalise: ["normalise"],
        ID.tabs: "space",
        ID.view_job_done: done,
    }
    return _post(app, callback(app, f"{SID.graph}.figure"), inputs, {ID.page: page})


def test_this_texts_space_is_the_librarys_and_is_computed_once_per_head(folder):
    app = space_app({folder: "tiny BERT"}, None)
    cap = app.captures.get(folder, TEXT)
    store = {"key": Captures.key(folder, TEXT), "model": folder, "bos": False}
    answer = _space(app, store)
    figure = answer[SID.graph]["figure"]
    expected = qk_space(cap, 1, 2)
    assert [t["type"] for t in figure["data"]] == ["scattergl", "scattergl"]
    assert _array(figure["data"][0]["x"]) == pytest.approx(expected[expected.kind == "query"].x.tolist(), abs=1e-6)
    assert answer[SID.note]["children"] == f"this text: {expected.attrs['description']}"
    kept = app.captures.known(store, ("qk space", "text", None, 1, 2, "pca", True))
    assert kept is not None and len(kept) == 2 * cap.n_tokens  # cached: another view of this head reads it
    other = _space(app, store, head=3)[SID.graph]["figure"]
    assert not np.allclose(
        _array(other["data"][0]["x"]), _array(figure["data"][0]["x"])
    )  # another head, embedded again


def test_the_corpus_is_captured_in_the_background_then_embedded(folder):
    app = space_app({folder: "tiny BERT"}, CORPUS, background_from=16)
    app.captures.get(folder, TEXT)
    store = {"key": Captures.key(folder, TEXT), "model": folder, "bos": False}
    jobs, ask = [], app.captures.jobs.ask

    def asked(*args, **kwargs):  # the jobs the view starts, also one that ends before the test looks
        jobs.append(ask(*args, **kwargs))
        return jobs[-1]

    app.captures.jobs.ask = asked
    first = _space(app, store, source="corpus")
    assert "in the background" in str(first[SID.graph]["figure"])  # the job runs: the view says so
    assert len(jobs) == 1 and jobs[0].label == "the corpus at layer 1"
    jobs[0].thread.join(60)
    second = _space(app, store, source="corpus", done=1)  # the job bar's "done" re-renders the view
    if "in the background" in str(second[SID.graph]["figure"]):  # the embedding is a job of its own (≥ 16 points)
        for job in app.captures.jobs.running():
            job.thread.join(60)
        second = _space(app, store, source="corpus", done=2)
    model, tok = attnviz.load_model(folder)
    expected = qk_space(attnviz.capture(model, CORPUS, tok, layers=[1]), 1, 2)
    figure = second[SID.graph]["figure"]
    assert _array(figure["data"][1]["x"]) == pytest.approx(expected[expected.kind == "key"].x.tolist(), abs=1e-5)
    assert second[SID.note]["children"].startswith("3 texts of the corpus mini.txt: L1·H2")


def test_the_largest_corpus_view_stays_under_2mb(folder, tiny_bert_words):
    """A corpus of the view's whole token budget (twice as many points): a seeded sample of MAX_POINTS
    points is shown, the note says so, and the response stays under 2 MB."""
    _, tok = tiny_bert_words
    sentence = "The cat sat on the mat because it was tired, and the dog slept by the door all day long."
    per_text = len(tok(sentence)["input_ids"])
    corpus = [sentence] * (space_view.CORPUS_TOKENS // per_text + 5)
    app = space_app({folder: "tiny BERT"}, corpus, background_from=10**9)  # all in the request
    app.captures.get(folder, TEXT)
    store = {"key": Captures.key(folder, TEXT), "model": folder, "bos": False}
    inputs = {ID.store: store, ID.layer: 0, ID.head: 1, SID.source: "corpus", SID.method: "pca"}
    inputs |= {SID.color: "kind", SID.normalise: ["normalise"], ID.tabs: "space"}
    body = _post(app, callback(app, f"{SID.graph}.figure"), inputs, {ID.page: "p"})
    size = len(json.dumps(body))
    shown = sum(len(_array(t["x"])) for t in body[SID.graph]["figure"]["data"])
    assert shown == space_view.MAX_POINTS and size < 2_000_000, size
    texts = space_view.CORPUS_TOKENS // per_text
    assert f"{space_view.MAX_POINTS} of {2 * texts * per_text} points (seed 0)" in body[SID.note]["children"]


@pytest.mark.parametrize("bos", [False, True])
def test_the_corpus_is_tokenized_as_the_page_runs_its_texts(llama_folder, bos):
    """A corpus point's position must be its token's in the page's own capture of that text (with the
    page's BOS or without), or the Lab would open on another token."""
    captures = Captures({llama_folder: "tiny Llama"})
    seen = []
    caps = space_view.corpus_captures(llama_folder, CORPUS, bos, 1, lambda *a: seen.append(a))
    assert seen == [(0, 3, "text 0 of 3")] and [c.layer_indices() for c in caps] == [[1]] * 3
    for text, cap in zip(CORPUS, caps):
        assert cap.token_ids == captures.get(llama_folder, text, bos=bos).token_ids


def test_a_click_on_a_query_opens_it_in_the_lab_and_a_key_is_highlighted(folder):
    app = space_app({folder: "tiny BERT"}, CORPUS)
    store = {"key": Captures.key(folder, TEXT), "model": folder, "bos": False}
    click = _callback(app, runs=True)
    query = _post(
        app, click, {SID.graph: {"points": [{"customdata": [0, 4, "query"]}]}}, {SID.source: "text", ID.store: store}
    )
    assert query[ID.lab_query]["data"] == 4 and query[ID.lab_key]["data"] is None and query[ID.tabs]["value"] == "lab"
    key = _post(
        app,
        click,
        {SID.graph: {"points": [{"customdata": [0, 2, "key"]}]}},
        {SID.source: "text", ID.store: store, ID.lab_query: 7},
    )
    assert key[ID.lab_query]["data"] == 7 and key[ID.lab_key]["data"] == {"key": store["key"], "position": 2}


def test_a_corpus_point_runs_its_text_then_opens_the_lab_on_its_capture(folder):
    app = space_app({folder: "tiny BERT"}, CORPUS)
    store = {"key": Captures.key(folder, TEXT), "model": folder, "bos": False}
    opened = _post(
        app,
        _callback(app, runs=True),
        {SID.graph: {"points": [{"customdata": [1, 3, "key"]}]}},
        {SID.source: "corpus", ID.store: store, ID.run: 2, ID.layer: 1, ID.head: 3},
    )
    assert opened[ID.text]["value"] == CORPUS[1] and opened[ID.run]["n_clicks"] == 3
    drill = opened[SID.drill]["data"]
    assert drill == {"key": Captures.key(folder, CORPUS[1], False), "position": 3, "kind": "key", "layer": 1, "head": 3}
    show = _callback(app, runs=False)
    other = _post(app, show, {ID.store: store}, {SID.drill: drill})
    assert other[SID.drill]["data"] is None and ID.tabs not in other  # another capture: dropped
    ran = {"key": drill["key"], "model": folder, "bos": False}
    shown = _post(app, show, {ID.store: ran}, {SID.drill: drill, ID.lab_query: None})
    assert shown[ID.lab_key]["data"] == {"key": drill["key"], "position": 3} and shown[ID.tabs]["value"] == "lab"
    assert shown[ID.lab_query]["data"] == 3  # no query yet: the key's own row
    assert (shown[ID.layer]["value"], shown[ID.head]["value"]) == (1, 3)  # the head the point was embedded for


def test_a_corpus_file_that_cannot_be_read_is_said_on_the_page(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(attnviz.InputError, match="holds no texts"):
        space_view.read_corpus(str(empty))
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"Text {i}." for i in range(space_view.CORPUS_TEXTS + 5)))
    assert len(space_view.read_corpus(str(texts))) == space_view.CORPUS_TEXTS


@pytest.mark.browser
def test_the_space_tab_clicks_into_the_lab_at_that_token(dash_duo, folder, tmp_path):
    from test_dashboard import open_tab, run_text, show_heatmap_in_tokens, wait_status

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    dash_duo.start_server(create_app({folder: "tiny BERT"}, corpus_file=str(corpus)))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, TEXT, expect="tokens")
    open_tab(dash_duo, "Q·K space")
    dash_duo.wait_for_contains_text(f"#{SID.note}", "this text: L")
    head = dash_duo.find_element(f"#{SID.note}").text.split(": ")[1].split(",")[0]  # the page's head, e.g. L1·H3
    # plotly's click on the query trace's point 3 (dcc.Graph reads its customdata: text 0, position 3)
    dash_duo.driver.execute_script(
        f"document.querySelector('#{SID.graph} .js-plotly-plot').emit('plotly_click', "
        "{points: [{curveNumber: 0, pointNumber: 3}]});"
    )
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", f"'sat' → {head}")
    open_tab(dash_duo, "Q·K space")
    dash_duo.driver.execute_script(
        f"document.querySelector('#{SID.graph} .js-plotly-plot').emit('plotly_click', "
        "{points: [{curveNumber: 1, pointNumber: 2}]});"
    )
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph}", "key 'cat'")
    assert f"'sat' → {head}" in dash_duo.find_element(f"#{ID.lab_graph} .gtitle").text  # the query stays
    # the corpus: its point 4 of text 1's queries opens that text, run as the page's, at that token
    open_tab(dash_duo, "Q·K space")
    dash_duo.find_elements(f"#{SID.source} input")[1].click()
    dash_duo.wait_for_contains_text(f"#{SID.note}", "3 texts of the corpus corpus.txt", timeout=60)
    index = dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{SID.graph} .js-plotly-plot');"
        "return gd.data[0].customdata.findIndex((c) => c[0] === 1 && c[1] === 4);"
    )
    dash_duo.driver.execute_script(
        f"document.querySelector('#{SID.graph} .js-plotly-plot').emit('plotly_click', "
        f"{{points: [{{curveNumber: 0, pointNumber: {index}}}]}});"
    )
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", f"'a' → {head}", timeout=60)  # [CLS] my sister bought a
    assert dash_duo.find_element(f"#{ID.text}").get_attribute("value") == CORPUS[1]
