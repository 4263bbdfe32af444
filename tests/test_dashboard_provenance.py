"""The page shows where its capture came from (issue 46, item 2): the Recomputed-vs-model tab's Provenance
panel holds the capture's provenance — the hash of the weights the server ran, the versions, the check — and
says so when a capture file was saved before attnviz recorded it."""

import pytest
import torch
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import ID
from test_dashboard import CAT, MODELS, no_console_errors, open_tab, poll, run_text, start_minilm, wait_status

import attnviz
from attnviz.workflows.capture.provenance import weights_hash


def panel(dash_duo) -> dict:
    rows = dash_duo.find_elements(f"#{ID.provenance} tr")
    return {r.find_elements("css selector", "td")[0].text: r.find_elements("css selector", "td")[1].text for r in rows}


@pytest.mark.browser
@pytest.mark.slow
def test_the_validation_tab_shows_the_captures_provenance(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="13 tokens")
    open_tab(dash_duo, "Recomputed vs model")
    poll(lambda: "weights_sha256" in panel(dash_duo), timeout=30)
    shown = panel(dash_duo)
    model = attnviz.load_model("minilm")[0]
    assert shown["weights_sha256"] == weights_hash(model)
    assert shown["name"] == "minilm" and shown["torch"] == torch.__version__ and shown["check_passed"] == "True"
    assert shown["add_bos"] == "False" and shown["edits"] == "-"
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_a_capture_file_without_provenance_says_so(dash_duo, tmp_path, tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, "The cat sat.", tok)
    del cap.model["provenance"]
    path = cap.save(tmp_path / "old.attnviz")
    dash_duo.start_server(create_app(MODELS, capture_file=str(path)))
    wait_status(dash_duo, "tokens")
    open_tab(dash_duo, "Recomputed vs model")
    dash_duo.wait_for_contains_text(f"#{ID.provenance}", "saved before attnviz recorded", timeout=30)
    no_console_errors(dash_duo)
