"""The page passes keys, not texts (issue 18): its stores name a capture and never hold the text, one
Run tokenizes the text once, and a capture the server let go is a message, never a silent second run."""

import json

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID
from test_dashboard import (
    MODELS,
    choose,
    no_console_errors,
    poll,
    run_text,
    show_heatmap_in_tokens,
    start_minilm,
    wait_status,
)

import attnviz

TEXT = "Zebras quietly juggle violet pineapples near Oslo."

# every dcc.Store of the page with its data, read from the renderer's own state (what callbacks receive)
STORES = """
const found = {};
const walk = (node) => {
    if (Array.isArray(node)) { node.forEach(walk); return; }
    if (!node || typeof node !== "object") { return; }
    if (node.type === "Store" && node.props) {
        found[JSON.stringify(node.props.id)] = node.props.data === undefined ? null : node.props.data;
    }
    Object.values(node).forEach(walk);
};
walk(window.store.getState().layout);
return JSON.stringify(found);
"""


def stores(dash_duo) -> dict:
    return json.loads(dash_duo.driver.execute_script(STORES))


def heatmap_note(dash_duo) -> str:
    """The text the heatmap's figure carries in place of a plot (message_figure's annotation)."""
    return dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.heatmap} .js-plotly-plot');"
        "return (gd && gd.layout && gd.layout.annotations || []).map(a => a.text).join(' ');"
    )


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("background_from", [1024, 4], ids=["in the request", "as a background job"])
def test_the_stores_name_the_capture_and_never_hold_the_text(dash_duo, background_from):
    start_minilm(dash_duo, background_from=background_from)
    run_text(dash_duo, TEXT, expect="14 tokens")
    found = stores(dash_duo)
    assert json.dumps(ID.store) in found and json.dumps(ID.job) in found, sorted(found)
    page = found[json.dumps(ID.store)]
    assert set(page) == {"key", "model", "bos"} and page["model"] == "minilm", page
    dumped = json.dumps(found, ensure_ascii=False)
    for piece in (TEXT, "Zebras", "pineapples", "Oslo"):
        assert piece not in dumped, (piece, dumped)
    if background_from == 4:  # the job's request went through a store too: its key, not its text
        assert found[json.dumps(ID.job)]["key"] == page["key"]
    assert dash_duo.driver.execute_script("return window.sessionStorage.length + window.localStorage.length;") == 0
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_one_run_tokenizes_the_text_once(dash_duo, tokenizer_calls):
    tokenizer = attnviz.load_model("minilm")[1]
    calls = tokenizer_calls(tokenizer)
    start_minilm(dash_duo)
    calls.clear()  # the opening text's run is done: count only the Run below (and what it redraws)
    run_text(dash_duo, TEXT, expect="14 tokens")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L", timeout=30)
    assert calls == [TEXT]
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_capture_the_server_let_go_is_a_message_not_a_second_run(dash_duo, monkeypatch):
    runs = []
    original = attnviz.capture
    monkeypatch.setattr(attnviz, "capture", lambda *a, **k: runs.append(a[1]) or original(*a, **k))
    # one byte of cache: only the newest capture stays (one always fits)
    dash_duo.start_server(create_app(MODELS, default_model="minilm", cache_bytes=1))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, TEXT, expect="14 tokens")
    first = dash_duo.driver.current_window_handle
    dash_duo.driver.switch_to.new_window("tab")
    dash_duo.driver.get(dash_duo.server_url)
    wait_status(dash_duo, "minilm")
    run_text(dash_duo, "Hello there.", expect="5 tokens")  # the server now holds only this one
    dash_duo.driver.switch_to.window(first)
    ran = list(runs)
    choose(dash_duo, f"#{ID.head}", 3)  # the heatmap asks for the first tab's capture again
    poll(lambda: "no longer on the server" in heatmap_note(dash_duo), timeout=30)
    assert "Press Run model to capture the text again" in heatmap_note(dash_duo)
    assert runs == ran  # the model did not run again behind the page's back
    run_text(dash_duo, TEXT, expect="14 tokens")  # a Run captures it again, as the message says
    assert runs == [*ran, TEXT]


def test_a_capture_file_comes_back_from_its_file(tmp_path, tiny_bert_words):
    from attnviz.dashboard.captures import FILE_PREFIX, CaptureGone, Captures

    model, tok = tiny_bert_words
    path = attnviz.capture(model, "The cat sat.", tok).save(tmp_path / "cat.attnviz")
    name = FILE_PREFIX + "cat.attnviz"
    captures = Captures({name: "cat"}, files={name: str(path)})
    store = {"key": captures.key(name, "The cat sat."), "model": name, "bos": False}
    assert captures.from_store(store).text == "The cat sat."  # not cached: read from the file
    assert store["key"] in captures.cache
    with pytest.raises(CaptureGone, match="no longer on the server"):
        captures.from_store(dict(store, key=captures.key(name, "another text")))
