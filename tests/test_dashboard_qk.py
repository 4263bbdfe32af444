"""The heatmap's "why" panel in a real browser: a click on a cell takes its score apart (the bars, the
check's error ≤ 1e-4), and the knock-out button runs the edit and shows the score the model really
gives beside the linear prediction."""

import re

import pytest
from attnviz.dashboard.ids import ID, QKID
from test_dashboard import CAT, no_console_errors, open_tab, poll, run_text, start_minilm
from test_dashboard_edits import click_point

import attnviz


@pytest.mark.browser
@pytest.mark.slow
def test_clicking_a_cell_takes_its_score_apart_and_the_knockout_shows_what_the_model_does(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L", timeout=30)
    layer = int(dash_duo.find_element(f"#{ID.layer}").text.strip()[1:].split()[0])
    head = int(re.search(r"\d+", dash_duo.find_element(f"#{ID.head}").text).group())
    click_point(dash_duo, ID.heatmap, 2, 8)  # query 'it' (token 8) → key 'cat' (token 2)
    dash_duo.wait_for_contains_text(f"#{QKID.note}", "relative error", timeout=60)
    note = dash_duo.find_element(f"#{QKID.note}").text
    assert note.startswith(f"L{layer}·H{head}: 'it' @8 → 'cat' @2."), note
    error = float(re.search(r"relative error ([0-9.e+-]+)", note).group(1))
    assert error <= 1e-4
    # the score the page says is the model's own, as the library computes it on the same capture
    model, tok = attnviz.load_model("minilm")
    cap = attnviz.capture(model, CAT, tokenizer=tok)
    why = attnviz.qk_attribution(model, cap, layer, head, 8, 2)
    assert f"The model's score {why.score:+.4f}; Σ pairs {why.total:+.4f}" in note
    dash_duo.wait_for_contains_text(f"#{QKID.bars} .gtitle", f"L{layer}·H{head}")
    bars = dash_duo.driver.execute_script(
        f"return document.querySelector('#{QKID.bars} .js-plotly-plot')._fullData.map(t => t.y.length);"
    )
    assert bars == [8, 8, 8]
    button = dash_duo.find_element(f"#{QKID.knock}")
    assert button.text.startswith("Knock out L") and "linear: score" in button.text
    button.click()
    dash_duo.wait_for_contains_text(f"#{QKID.knocked}", "knocked out (attnviz.edits.ablate)", timeout=90)
    said = dash_duo.find_element(f"#{QKID.knocked}").text
    assert "the linear prediction, every norm's scale held" in said and "the weight" in said
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_choosing_a_key_in_the_lab_takes_the_querys_score_on_it_apart(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    open_tab(dash_duo, "AttentionLab")
    poll(lambda: "it" in [c.text for c in dash_duo.find_elements(".lab-token")])
    {c.text: c for c in dash_duo.find_elements(".lab-token")}["it"].click()
    dash_duo.select_dcc_dropdown(f"#{QKID.lab_key}", "2: cat")
    dash_duo.wait_for_contains_text(f"#{QKID.lab_note}", "relative error", timeout=60)
    note = dash_duo.find_element(f"#{QKID.lab_note}").text
    assert re.match(r"L\d+·H\d+: 'it' @8 → 'cat' @2\. The model's score", note), note
    assert float(re.search(r"relative error ([0-9.e+-]+)", note).group(1)) <= 1e-4
    dash_duo.wait_for_contains_text(f"#{QKID.lab_bars} .gtitle", "it @8 → cat @2")
    no_console_errors(dash_duo)
