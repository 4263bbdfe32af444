"""Counterfactual edits in the page (edit_view), in a real browser: the AttentionLab's knockout and
switches applied to SmolLM2, the Coreference view's "test it", and the head-importance background job."""

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.ids import AID, EID, ID
from selenium.webdriver.common.keys import Keys
from test_dashboard import MODELS, choose, no_console_errors, open_tab, poll, show_heatmap_in_tokens, wait_status

import attnviz

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def plot_data(dash_duo, graph_id: str) -> list:
    """The graph's traces as plotly holds them (typed arrays decoded): name, x, y, z."""
    return dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{graph_id} .js-plotly-plot');"
        "const list = (a) => a ? Array.from(a, (r) => (r && r.length !== undefined && typeof r !== 'string') "
        "? Array.from(r) : r) : null;"
        "return gd._fullData.map((t) => ({name: t.name, x: list(t.x), y: list(t.y), z: list(t.z)}));"
    )


def click_point(dash_duo, graph_id: str, x: int, y: float | int = 0):
    """A plotly click on (x, y), as the graph reports a click on that bar or cell."""
    dash_duo.driver.execute_script(
        f"document.querySelector('#{graph_id} .js-plotly-plot').emit('plotly_click', "
        f"{{points: [{{x: {x}, y: {y}, curveNumber: 0, pointNumber: {x}, pointIndex: {x}}}]}});"
    )


def type_into(dash_duo, element_id: str, text: str):
    box = dash_duo.find_element(f"#{element_id}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text, Keys.ENTER)


def test_the_lab_knocks_a_key_out_of_smollm2_and_shows_the_prediction_before_and_after(dash_duo):
    dash_duo.start_server(create_app(MODELS, default_model="smollm2"))
    wait_status(dash_duo, "27 tokens", timeout=180)  # SmolLM2's first load, on a busy machine
    show_heatmap_in_tokens(dash_duo)  # the head is chosen where the Lab is not drawn at each step
    dash_duo.find_elements(f"#{ID.words} input")[1].click()  # words
    choose(dash_duo, f"#{ID.layer}", 13)
    choose(dash_duo, f"#{ID.head}", 8)
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '它'")
    dash_duo.wait_for_contains_text(f"#{EID.lab_knock_text}", "none")
    words = attnviz.capture("smollm2", "我家的小猫很可爱，它很好动。", add_bos=True, layers=[0]).word_labels
    kitten = words.index("小猫")
    click_point(dash_duo, ID.lab_graph, kitten)
    # in words the whole word is named, not its five byte pieces (小₁, 小₂, 猫₁, 猫₂, 猫₃)
    dash_duo.wait_for_text_to_equal(f"#{EID.lab_knock_text}", "knocked out: 小猫")
    type_into(dash_duo, EID.lab_continuation, "好")
    dash_duo.find_element(f"#{EID.lab_apply}").click()
    dash_duo.wait_for_contains_text(f"#{EID.lab_result}", "next token", timeout=90)
    result = dash_duo.find_element(f"#{EID.lab_result}").text
    assert "knockout 它 ↛ 小猫 at L13·H8" in result and "log P('好')" in result, result
    assert "reproduces the model on the edited layers" in result
    assert [t["name"] for t in plot_data(dash_duo, EID.lab_predictions)] == ["before", "after"]
    edited = plot_data(dash_duo, EID.lab_row)[0]["y"]
    assert edited[kitten] == 0 and abs(sum(edited) - 1) < 1e-3  # the knocked-out key gets 0, the row renormalises

    # ÷√d_k off for the whole layer, knockouts cleared
    dash_duo.find_element(f"#{EID.lab_knock_clear}").click()
    dash_duo.wait_for_contains_text(f"#{EID.lab_knock_text}", "none")
    dash_duo.find_elements(f"#{ID.lab_switches} input")[1].click()
    dash_duo.find_elements(f"#{EID.lab_scope} input")[1].click()
    dash_duo.find_element(f"#{EID.lab_apply}").click()
    dash_duo.wait_for_contains_text(f"#{EID.lab_result}", "no ÷√d_k (scale 1) at L13·every head", timeout=90)
    no_console_errors(dash_duo)


def test_coreference_test_it_knocks_the_pronoun_out_of_its_top_heads(dash_duo):
    dash_duo.start_server(create_app(MODELS, default_model="smollm2"))
    wait_status(dash_duo, "27 tokens")
    open_tab(dash_duo, "Coreference")
    dash_duo.wait_for_contains_text(f"#{AID.coref_headline}", "它 →", timeout=60)
    poll(lambda: dash_duo.find_element(f"#{EID.coref_candidate}").text.strip() != "")
    type_into(dash_duo, EID.coref_top, "0")  # out of range: said, not run with the default 5 heads unsaid
    dash_duo.find_element(f"#{EID.coref_test}").click()
    dash_duo.wait_for_contains_text(f"#{EID.coref_result}", "Top heads: type a whole number from 1 to 64.")
    type_into(dash_duo, EID.coref_top, "3")
    type_into(dash_duo, EID.coref_continuation, "好")
    dash_duo.find_element(f"#{EID.coref_test}").click()
    dash_duo.wait_for_contains_text(f"#{EID.coref_result}", "Next token", timeout=90)
    result = dash_duo.find_element(f"#{EID.coref_result}").text
    assert "Knocked out 它 →" in result and "top 3 heads" in result and "log P('好')" in result, result
    title = dash_duo.driver.execute_script(
        "return document.querySelector('#' + arguments[0] + ' .js-plotly-plot').layout.title.text;",
        EID.coref_predictions,
    )
    assert title.startswith("knockout 它 ↛") and title.count("knockout") == 1 and "(decoder)" not in title, title
    no_console_errors(dash_duo)


def test_head_importance_runs_in_the_background_and_selects_a_head(dash_duo, model_folder, smol_tokenizer):
    tiny = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=64)
    folder = model_folder("tiny-llama", tiny, smol_tokenizer)
    dash_duo.start_server(create_app({folder: "tiny Llama", **MODELS}, default_model=folder))
    wait_status(dash_duo, "2 layers × 4 heads")
    open_tab(dash_duo, "Coreference")
    dash_duo.find_element(f"#{EID.importance_run}").click()  # no continuation yet: a message
    dash_duo.wait_for_contains_text(f"#{EID.importance_note}", "Type the continuation", timeout=60)
    type_into(dash_duo, EID.coref_continuation, "好")
    dash_duo.find_element(f"#{EID.importance_run}").click()
    dash_duo.wait_for_contains_text(f"#{EID.importance_note}", "log P('好')", timeout=120)
    grid = plot_data(dash_duo, EID.importance_map)[0]["z"]
    assert len(grid) == 2 and len(grid[0]) == 4
    click_point(dash_duo, EID.importance_map, 3, 1)
    dash_duo.wait_for_contains_text(f"#{ID.head}", "3")
    dash_duo.wait_for_contains_text(f"#{ID.layer}", "1")
    no_console_errors(dash_duo)
