"""The dashboard's server side: it loads only the models it was started with, sends no server path
to the page, warns on a public host, opens decoders with a BOS, and picks its opening head from
the query's rows alone."""

from __future__ import annotations

import gc
import json
import logging
import math
import time

import pytest
import torch
from attnviz.dashboard import app as app_module
from attnviz.dashboard import captures as captures_module
from attnviz.dashboard import create_app
from attnviz.dashboard.captures import (
    Captures,
    content_words_before,
    default_head,
    default_query,
    is_encoder_decoder,
    wants_bos,
)
from attnviz.dashboard.common import word_of
from attnviz.dashboard.errors import shows_errors
from attnviz.dashboard.ids import AID, ID
from attnviz.dashboard.run_view import job_text
from dash.exceptions import PreventUpdate

import attnviz

MODELS = {"minilm": "MiniLM (BERT)"}


def test_a_model_name_the_server_was_not_started_with_is_refused_not_loaded(monkeypatch, tmp_path):
    app = create_app(MODELS, default_model="minilm")
    loaded = []
    original = attnviz.load_model

    def spy(name, *args, **kwargs):
        loaded.append(str(name))
        return original(name, *args, **kwargs)

    monkeypatch.setattr(attnviz, "load_model", spy)
    monkeypatch.setattr(app_module.attnviz, "load_model", spy)
    run_output = next(key for key in app.callback_map if f"{ID.store}.data" in key)
    secret = str(tmp_path)  # an existing folder on the server
    response = _post(app, run_output, {ID.run: 1}, {ID.text: "The cat sat.", ID.model: secret, ID.bos: []})
    message = json.dumps(response)
    assert "not one of this dashboard's models" in message and "Traceback" not in message
    assert secret not in loaded and all(name == "minilm" for name in loaded)


def test_no_server_path_reaches_the_page(tmp_path, tiny_bert_words):
    model, tok = tiny_bert_words
    path = attnviz.capture(model, "The cat sat on the mat.", tok).save(tmp_path / "secret-folder-cat.attnviz")
    app = create_app(MODELS, capture_file=str(path))
    page = app.server.test_client().get("/_dash-layout").get_data(as_text=True)  # what a page load receives
    assert "secret-folder-cat.attnviz" in page and str(tmp_path) not in page


def test_each_page_load_gets_its_own_page_id(tiny_bert_words):
    """Whose background jobs are whose: the layout is made per page load, with a fresh id in its store."""
    app = create_app(MODELS, default_model="minilm")

    def page_id() -> str:
        found = []

        def walk(node) -> None:
            if isinstance(node, dict):
                if node.get("props", {}).get("id") == ID.page:
                    found.append(node["props"]["data"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(app.server.test_client().get("/_dash-layout").get_json())
        [value] = found
        return value

    first, second = page_id(), page_id()
    assert len(first) == 32 and first != second


def test_a_public_host_warns_that_there_is_no_authentication(monkeypatch, capsys):
    served = []
    monkeypatch.setattr(app_module.Dash, "run", lambda self, **kwargs: served.append(kwargs))
    app_module.run(models=["minilm"], host="0.0.0.0", port=8123)
    err = capsys.readouterr().err
    assert "no authentication" in err and served == [{"host": "0.0.0.0", "port": 8123, "debug": False}]
    app_module.run(models=["minilm"])
    assert "no authentication" not in capsys.readouterr().err


@pytest.mark.slow
def test_decoders_without_a_bos_open_with_one(monkeypatch):
    """Read from the config and tokenizer alone: picking a model on the page loads no weights (it did,
    and a test's teardown interrupting that load was CI's unhandled-thread warning)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the weights were loaded to read a config fact")

    monkeypatch.setattr("attnviz.workflows.capture.models._load_cached", refuse)
    assert wants_bos("smollm2") is True  # its tokenizer starts a text with its first word
    assert wants_bos("minilm") is False  # [CLS] comes first already
    assert wants_bos("file:x.attnviz") is False
    assert is_encoder_decoder("smollm2") is False


@pytest.mark.slow
def test_the_opening_head_reads_only_the_query_rows_and_matches_the_full_maps(smollm2):
    """A benchmark as well (printed, not timed): the opening head of a 512-token text."""
    model, tok = smollm2
    base = " ".join(f"In paragraph {i}, the cat chased the mouse because it was hungry." for i in range(1, 80))
    text = tok.decode(tok(base)["input_ids"][:511])
    cap = attnviz.capture(model, text, tok, add_bos=True)
    assert cap.n_tokens == 512
    query = default_query(cap)
    q = word_of(cap, query)
    keys = content_words_before(cap, q)
    best, best_score = None, -math.inf
    for layer in cap.layer_indices():  # the full word-level maps, independently
        scores = cap.attention(layer, words=True)[:, q, keys].max(-1).values
        if float(scores.max()) > best_score:
            best, best_score = (layer, int(scores.argmax())), float(scores.max())
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        assert default_head(cap, query) == best
        times.append(time.perf_counter() - t0)
    print(f"\nopening head at 512 tokens (SmolLM2, {len(keys)} candidate words): {min(times):.3f} s (best of 3)")
    captures = Captures({"smollm2": "SmolLM2"})
    store = {"key": captures.key("smollm2", text, True), "model": "smollm2", "bos": True}
    with pytest.MonkeyPatch.context() as mp:  # the same capture and query again: memoised, not re-picked
        picks = []
        mp.setattr(captures_module, "default_head", lambda *args: picks.append(args) or best)
        assert captures.opening_head(store, "self", cap, query) == best
        assert captures.opening_head(store, "self", cap, query) == best and len(picks) == 1
        assert captures.opening_head(store, "self", cap, query - 1) == best and len(picks) == 2


def test_attention_rows_equal_the_full_maps(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat on the mat because it was tired.", tok)
    rows = [0, 5, 8]
    torch.testing.assert_close(cap.attention_rows(1, rows), cap.attention(1)[:, rows], atol=1e-6, rtol=0)
    with pytest.raises(attnviz.OutOfRangeError, match="rows"):
        cap.attention_rows(1, [99])


def test_the_head_statistics_view_shows_a_corpus_table(tmp_path, tiny_bert_words, bert_tokenizer):
    from attnviz.analysis import corpus_stats
    from attnviz.workflows.corpus.corpus import write_table

    model, tok = tiny_bert_words
    table = corpus_stats(model, ["The cat sat.", "It was tired, so it slept."], tok, progress=False)
    path = write_table(table, tmp_path / "stats.csv")
    app = create_app(MODELS, default_model="minilm", stats_file=str(path))
    sources = _post(app, f"..{AID.stats_source}.options...{AID.stats_source}.value..", {ID.tabs: "stats"}, {})
    options = json.dumps(sources)
    assert "the corpus stats.csv (2 texts" in options
    output = next(key for key in app.callback_map if f"{AID.stats_table}.data" in key)
    response = _post(app, output, {ID.tabs: "stats", AID.stats_source: "corpus", AID.stats_column: "previous"}, {})
    rows = response[AID.stats_table]["data"]
    assert len(rows) == len(table) and rows[3]["previous"] == pytest.approx(round(table["previous"].iloc[3], 4))
    broken = tmp_path / "broken.csv"
    broken.write_text("a,b\n1,2\n")
    broken_app = create_app(MODELS, default_model="minilm", stats_file=str(broken))
    run_output = next(key for key in broken_app.callback_map if f"{ID.store}.data" in key)
    opening = json.dumps(
        _post(broken_app, run_output, {ID.run: 0}, {ID.text: "The cat sat.", ID.model: "minilm"}, changed=[])
    )
    assert "Could not open the statistics file" in opening and "not a table of attnviz stats" in opening
    both_app = create_app(  # two files that cannot be opened: both said (the second overwrote the first)
        MODELS, default_model="minilm", stats_file=str(broken), corpus_file=str(tmp_path / "nothing.txt")
    )
    run_output = next(key for key in both_app.callback_map if f"{ID.store}.data" in key)
    opening = json.dumps(
        _post(both_app, run_output, {ID.run: 0}, {ID.text: "The cat sat.", ID.model: "minilm"}, changed=[])
    )
    assert "Could not open the statistics file" in opening and "Could not open the corpus file" in opening


def _post(app, callback_output: str, inputs: dict, state: dict, changed: list | None = None) -> dict:
    callback = app.callback_map[callback_output]
    outputs = [o.split(".") for o in callback_output.strip(".").split("...")]
    body = {
        "output": callback_output,
        "outputs": [{"id": i, "property": p} for i, p in outputs],
        "inputs": [
            {"id": i["id"], "property": i["property"], "value": inputs.get(i["id"])} for i in callback["inputs"]
        ],
        "state": [{"id": s["id"], "property": s["property"], "value": state.get(s["id"])} for s in callback["state"]],
        "changedPropIds": [f"{callback['inputs'][0]['id']}.{callback['inputs'][0]['property']}"]
        if changed is None
        else changed,
    }
    client = app.server.test_client()
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200, response.data[:500]
    answer = response.get_json()
    if "response" not in answer and "job" in answer:  # a background callback: poll it as the page does
        deadline = time.monotonic() + 120
        query = {"cacheKey": answer["cacheKey"], "job": answer["job"]}
        while "response" not in answer:
            assert time.monotonic() < deadline, "the background callback did not finish in 120 s"
            time.sleep(0.1)
            response = client.post("/_dash-update-component", json=body, query_string=query)
            assert response.status_code in (200, 204), response.data[:500]
            answer = response.get_json(silent=True) or {}
    return answer["response"]


@pytest.mark.browser
@pytest.mark.slow
def test_a_probe_set_runs_in_the_background_with_progress_and_can_be_cancelled(dash_duo, tmp_path):
    import json

    from test_dashboard import open_tab, run_text, start_minilm

    from attnviz.analysis import load_probes

    # the shipped en set 60 times (2,520 probes): batched, MiniLM scores it in tens of seconds, not at once
    many = [
        {**p.__dict__, "candidates": list(p.candidates), "id": f"{p.id}-{c}"}
        for c in range(60)
        for p in load_probes("en")
    ]
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in many), encoding="utf-8")
    start_minilm(dash_duo)
    open_tab(dash_duo, "Coreference")
    dash_duo.find_element(f"#{AID.probe_upload} input").send_keys(str(path))
    dash_duo.wait_for_contains_text(f"#{AID.probe_loaded}", "2,520 probes", timeout=30)
    dash_duo.find_element(f"#{AID.probe_run}").click()
    dash_duo.wait_for_contains_text(f"#{AID.probe_progress_text}", "probe ", timeout=60)
    assert dash_duo.find_element(f"#{AID.probe_run}").get_attribute("disabled")
    cancel = dash_duo.find_element(f"#{AID.probe_cancel}")
    dash_duo.driver.execute_script("arguments[0].click();", cancel)  # most of the probes still to go
    dash_duo.wait_for_style_to_equal(f"#{AID.probe_cancel}", "display", "none", timeout=30)
    run_text(dash_duo, "The dog chased the cat.")  # the page keeps working
    assert "probes on minilm" not in dash_duo.find_element(f"#{AID.probe_summary}").text
    assert not dash_duo.find_element(f"#{AID.probe_run}").get_attribute("disabled")


def test_one_helper_turns_any_failure_into_a_page_message_never_a_traceback(caplog):
    @shows_errors(lambda message: ("shown", message))
    def callback(err):
        raise err

    assert callback(attnviz.InputTooLongError("The text has 9,000 tokens; smollm2 reads at most 8,192.")) == (
        "shown",
        "The text has 9,000 tokens; smollm2 reads at most 8,192.",
    )
    with caplog.at_level(logging.ERROR, logger="attnviz.dashboard"):
        shown = callback(KeyError("/srv/secret/path"))
    assert shown == ("shown", "Something went wrong on the server; its log has the details.")  # no class name
    assert "Traceback" in caplog.text and "/srv/secret/path" in caplog.text  # the details: in the server's log
    with pytest.raises(PreventUpdate):
        callback(PreventUpdate())


def test_a_background_job_leaves_its_capture_for_the_server(tmp_path, model_folder, tiny_bert_words):
    """The job runs in a forked copy of the server: it saves the capture into the server's folder, and
    the server adopts the file into its own cache on first use (the file then goes)."""
    folder = model_folder("tiny-bert", *tiny_bert_words)
    server = Captures({folder: "tiny BERT"}, folder=tmp_path)
    job = Captures({folder: "tiny BERT"}, folder=tmp_path)  # the job's copy: its cache is not the server's
    request = server.request(folder, "The cat sat on the mat because it was tired.")
    key = request.key
    store = {"key": key, "model": folder, "bos": False}
    run = server.leave_request(request)  # the page sends the key; the text reaches the job through the folder
    steps = []
    job.save_for_server(key, run, lambda done, layers: steps.append((done, layers)))
    assert steps == [(1, 2), (2, 2)]  # one call per layer of the forward
    assert server.job_file(key).exists() and key not in server.cache
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.attnviz"]  # the job read its request: gone
    cap = server.from_store(store)
    assert key in server.cache and not server.job_file(key).exists()
    torch.testing.assert_close(cap.attention(1, 2), job.from_store(store).attention(1, 2))
    again = server.leave_request(server.request(folder, "The cat sat on the mat because it was tired."))
    job.job_file(key).write_bytes(b"")  # a second page's job finds the first one's capture already left
    job.save_for_server(key, again)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.attnviz"]  # its request went too (the soak's leak)
    assert [job_text(d, 30, None) for d in (0, 11, 30)] == [
        "layer 1 of 30",
        "layer 12 of 30",
        "layer 30 of 30 — checking and saving the capture…",
    ]
    assert job_text(95, 30, 20) == "new token 4 of 20"


def test_the_lab_shows_a_window_of_chips_around_the_query():
    from attnviz.dashboard.lab_view import CHIPS, chip_window

    assert chip_window(27, 5) == (0, 27)
    assert chip_window(8192, 4000) == (4000 - CHIPS // 2, 4000 + CHIPS // 2)
    assert chip_window(8192, 3) == (0, CHIPS) and chip_window(8192, 8190) == (8192 - CHIPS, 8192)
    lo, hi = chip_window(8192, 4000)
    assert lo <= 4000 < hi and hi - lo == CHIPS


def test_derived_results_are_computed_once_per_capture_and_bounded_in_bytes():
    captures = Captures({"smollm2": "SmolLM2"}, cache_bytes=4 * 4000)  # derived tensors: at most 4,000 bytes
    store = {"key": captures.key("smollm2", "a"), "model": "smollm2", "bos": False}
    other = dict(store, key=captures.key("smollm2", "b"))
    calls = []

    def compute(n: int):
        return lambda: calls.append(n) or torch.zeros(n)  # n float32: 4n bytes

    first = captures.derived(store, ("rollout", None), compute(500))
    assert captures.derived(store, ("rollout", None), compute(500)) is first and calls == [500]
    captures.derived(other, ("rollout", None), compute(500))  # another capture: its own result
    assert calls == [500, 500]
    captures.derived(store, ("rollout", "decoder"), compute(600))  # 2,000 + 2,000 + 2,400 bytes: the oldest goes
    captures.derived(store, ("rollout", None), compute(500))
    assert calls == [500, 500, 600, 500]
    captures.derived(store, ("big",), compute(5000))  # one result always fits, however large
    assert captures.derived(store, ("big",), compute(5000)).numel() == 5000 and calls[-1] == 5000 and len(calls) == 5


def test_a_folder_the_captures_made_goes_with_them_one_given_stays(tmp_path):
    own = Captures({"smollm2": "SmolLM2"})
    folder = own.folder
    (folder / "job.attnviz").write_bytes(b"a capture a job left")
    del own
    gc.collect()
    assert not folder.exists()
    given = Captures({"smollm2": "SmolLM2"}, folder=tmp_path)
    del given
    gc.collect()
    assert tmp_path.is_dir()
