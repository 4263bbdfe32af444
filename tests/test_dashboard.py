"""The dashboard in a real browser (Debian's headless Chromium via dash_duo), and its server side."""

import time

import pytest
import torch
from attnviz.dashboard import CaptureCache, create_app
from attnviz.dashboard.cache import capture_key
from attnviz.dashboard.captures import default_query
from attnviz.dashboard.export_view import matrix_frame
from attnviz.dashboard.ids import AID, ID
from selenium.webdriver.common.keys import Keys

import attnviz

CAT = "The cat sat on the mat because it was tired."
ZH = "我家的小猫很可爱，它很好动。"
MODELS = {"minilm": "MiniLM (BERT)", "smollm2": "SmolLM2 (decoder)"}


def wait_status(dash_duo, contains: str, timeout: float = 60):
    dash_duo.wait_for_contains_text(f"#{ID.status}", contains, timeout=timeout)


def run_text(dash_duo, text: str, *, expect: str = "tokens"):
    box = dash_duo.find_element(f"#{ID.text}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(text)
    dash_duo.find_element(f"#{ID.run}").click()
    if expect:
        dash_duo.wait_for_text_to_equal(f"#{ID.message}", "", timeout=60)
        wait_status(dash_duo, expect)


def show_heatmap_in_tokens(dash_duo):
    """The page opens on the AttentionLab in words (the README's first picture, ``opening.py``): a test of
    another view starts, after the first capture, where it did before that — the Heatmap, in tokens."""
    open_tab(dash_duo, "Heatmap")
    dash_duo.find_elements(f"#{ID.words} input")[0].click()


def start_minilm(dash_duo, **options):
    """Serve the dashboard on MiniLM (fast to run), wait for its first capture, and show the Heatmap in tokens."""
    dash_duo.start_server(create_app(MODELS, default_model="minilm", **options))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)


def poll(condition, timeout: float = 15):
    """Wait until ``condition()`` is true, re-reading the page each time (elements re-render)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: BLE001 - an element replaced while we read it
            pass
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def choose(dash_duo, selector: str, index: int):
    """Pick a dcc.Dropdown option by position (scrolled into view first)."""
    dropdown = dash_duo.find_element(selector)
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", dropdown)
    dropdown.click()
    dash_duo.wait_for_element(".dash-dropdown-options")
    option = dash_duo.find_elements(".dash-dropdown-option")[index]
    dash_duo.driver.execute_script("arguments[0].click();", option)  # the search box may cover it


def figure_title(dash_duo, graph_id: str) -> str:
    return dash_duo.find_element(f"#{graph_id} .gtitle").text


def open_tab(dash_duo, label: str):
    for tab in dash_duo.find_elements(".tab"):
        if tab.text.strip() == label:
            # in view first: a view above the tabs may have scrolled them to the window's edge
            dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", tab)
            tab.click()
            return
    raise AssertionError(f"no tab {label!r}")


def no_console_errors(dash_duo):
    logs = [entry for entry in dash_duo.get_logs() or [] if entry.get("level") == "SEVERE"]
    assert logs == [], logs


@pytest.fixture
def app():
    return create_app(MODELS, default_model="smollm2")


@pytest.mark.browser
@pytest.mark.slow
def test_opens_on_the_chinese_example_and_types_a_sentence(dash_duo, app):
    dash_duo.start_server(app)
    # a decoder whose tokenizer adds no BOS opens with one (the sink is not the text's first word)
    assert dash_duo.find_element(f"#{ID.bos} input").is_selected()
    wait_status(dash_duo, "smollm2: 27 tokens, 11 words, 30 layers × 9 heads (3 KV), sdpa", timeout=180)
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, CAT, expect="smollm2: 12 tokens, 12 words")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "token × token attention")
    ticks = [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")]
    assert ticks == ["<|im_start|>", "The", "cat", "sat", "on", "the", "mat", "because", "it", "was", "tired", "."]
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_pick_layer_and_head_and_switch_to_words(dash_duo, app):
    dash_duo.start_server(app)
    wait_status(dash_duo, "27 tokens")
    show_heatmap_in_tokens(dash_duo)
    choose(dash_duo, f"#{ID.layer}", 15)  # L15
    choose(dash_duo, f"#{ID.head}", 3)  # H3
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L15·H3")
    dash_duo.find_elements(f"#{ID.words} input")[1].click()
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "word × word")
    ticks = [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")]
    assert ticks == ["<|im_start|>", "我家", "的", "小猫", "很", "可爱", "，", "它", "很", "好动", "。"]
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_lab_click_token_and_flip_switches(dash_duo, app):
    dash_duo.start_server(app)
    wait_status(dash_duo, "27 tokens", timeout=180)
    show_heatmap_in_tokens(dash_duo)  # the head is chosen where the Lab is not drawn at each step
    dash_duo.find_elements(f"#{ID.words} input")[1].click()  # words: 它 is one chip
    choose(dash_duo, f"#{ID.layer}", 15)  # L15
    choose(dash_duo, f"#{ID.head}", 3)  # H3
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '它'")
    stats = dash_duo.find_element(f"#{ID.lab_stats}").text
    assert "top weight 0.47 on '小猫'" in stats, stats  # pinned from the carried SmolLM2 checkpoint, with its BOS
    # click another token as the query
    chips = {c.text: c for c in dash_duo.find_elements(".lab-token")}
    chips["好动"].click()
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '好动'")
    chips = {c.text: c for c in dash_duo.find_elements(".lab-token")}
    chips["它"].click()
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query '它'")
    causal_stats = dash_duo.find_element(f"#{ID.lab_stats}").text
    assert "over 8 visible words" in causal_stats  # 它 sees itself, the six words before it and the BOS
    switches = dash_duo.find_elements(f"#{ID.lab_switches} input")
    switches[0].click()  # causal mask off: 它 now sees the words on its right too
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "over 11 visible words")
    switches[0].click()
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "over 8 visible words")
    before = float(causal_stats.split("entropy ")[1].split(" nats")[0])
    switches[1].click()  # ÷√d_k off: the row sharpens toward one-hot
    dash_duo.wait_for_contains_text(f"#{ID.lab_graph} .gtitle", "unscaled")
    deadline = time.time() + 20
    while time.time() < deadline:
        text = dash_duo.find_element(f"#{ID.lab_stats}").text
        after = float(text.split("entropy ")[1].split(" nats")[0])
        if after != before:
            break
        time.sleep(0.2)
    assert after < before, (before, after)
    assert "unscaled" in figure_title(dash_duo, ID.lab_graph)
    assert "Without ÷√d_k the scores are 8× larger (d_k = 64)" in dash_duo.find_element(f"#{ID.lab_stats}").text
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_model_view_click_selects_the_head(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    open_tab(dash_duo, "Model view")
    dash_duo.wait_for_contains_text(f"#{ID.model_view} .gtitle", "6 layers × 12 heads")
    # click the thumbnail of L2·H5: hover it through plotly, then emit plotly's click event, as a
    # mouse click on the hovered point does (13 tokens → 13×13 thumbnails, one blank line apart)
    dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.model_view} .js-plotly-plot');"
        "Plotly.Fx.hover(gd, {xval: 5 * 14 + 6, yval: 2 * 14 + 6});"
        "gd.emit('plotly_click', {points: gd._hoverdata, event: {}});"
    )
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L2·H5")
    assert dash_duo.find_element(f"#{ID.layer}").text.strip().startswith("L2")
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_validation_and_cost_views(dash_duo):
    start_minilm(dash_duo)
    open_tab(dash_duo, "Recomputed vs model")
    dash_duo.wait_for_contains_text(f"#{ID.validation_summary}", "attnviz validation PASS: minilm, 6 layers × 12 heads")
    dash_duo.wait_for_contains_text(f"#{ID.validation_map} .gtitle", "worst L")
    dash_duo.wait_for_contains_text(f"#{ID.comparison} .gtitle", "max |difference|")
    open_tab(dash_duo, "Shapes & cost")
    dash_duo.wait_for_contains_text(f"#{ID.cost}", "QKᵀ")
    assert "131,072" in dash_duo.find_element(f"#{ID.cost}").text
    open_tab(dash_duo, "Head view")
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "head view — every query")
    # hovering a query token on the left isolates its lines (the query markers are the last-but-one trace)
    dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.head_view} .js-plotly-plot');"
        "Plotly.Fx.hover(gd, [{curveNumber: gd.data.length - 2, pointNumber: 2}]);"
        "gd.emit('plotly_hover', {points: gd._hoverdata, event: {}});"
    )
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "(#2): weights")
    assert "from '" in figure_title(dash_duo, ID.head_view)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_bad_input_shows_a_message_and_the_page_keeps_working(dash_duo):
    start_minilm(dash_duo, max_tokens=40)
    run_text(dash_duo, "   ", expect="")
    dash_duo.wait_for_contains_text(f"#{ID.message}", "The text is empty")
    run_text(dash_duo, "word " * 60, expect="")
    dash_duo.wait_for_contains_text(f"#{ID.message}", "tokens; this dashboard shows at most 40. Shorten the text")
    open_tab(dash_duo, "Rollout")  # another tab is another thing done: the message about the text goes
    poll(lambda: dash_duo.find_element(f"#{ID.message}").text == "")
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_a_model_that_fails_to_load_is_a_message(dash_duo):
    dash_duo.start_server(create_app({"no-such/model-xyz": "missing"}, default_model="no-such/model-xyz"))
    dash_duo.wait_for_contains_text(f"#{ID.message}", "could not load model 'no-such/model-xyz'", timeout=30)
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_capture_file_opens_and_a_broken_one_is_a_message(dash_duo, tmp_path, tiny_bert_words):
    model, tok = tiny_bert_words
    path = attnviz.capture(model, CAT, tok).save(tmp_path / "cat.attnviz")
    broken = tmp_path / "broken.attnviz"
    broken.write_bytes(b"nonsense")
    dash_duo.start_server(create_app(MODELS, capture_file=str(broken)))
    dash_duo.wait_for_contains_text(f"#{ID.message}", "Could not open the capture file", timeout=30)
    dash_duo.server.stop()
    dash_duo.start_server(create_app(MODELS, capture_file=str(path)))
    wait_status(dash_duo, "13 tokens, 13 words, 2 layers × 4 heads")
    assert "capture file: cat.attnviz" in dash_duo.find_element(f"#{ID.model}").text
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_two_browser_sessions_keep_their_own_text(dash_duo):
    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="13 tokens")
    first = dash_duo.driver.current_window_handle
    dash_duo.driver.switch_to.new_window("tab")
    dash_duo.driver.get(dash_duo.server_url)
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, "Hello there.", expect="5 tokens")
    second = dash_duo.driver.current_window_handle
    dash_duo.driver.switch_to.window(first)
    assert "13 tokens" in dash_duo.find_element(f"#{ID.status}").text
    # a new head makes the server rebuild the heatmap from this session's store: shared server
    # state would show the other session's text here
    choose(dash_duo, f"#{ID.head}", 3)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "·H3")
    poll(lambda: "cat" in [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")])
    assert "Hello" not in [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")]
    dash_duo.driver.switch_to.window(second)
    choose(dash_duo, f"#{ID.head}", 2)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "·H2")
    poll(lambda: "Hello" in [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")])
    assert "5 tokens" in dash_duo.find_element(f"#{ID.status}").text


# ---------------------------------------------------------------- server side, no browser
def test_cache_is_bounded_in_bytes(tiny):
    model = tiny("gpt2")
    caps = [attnviz.capture(model, input_ids=torch.randint(3, 100, (1, 20))) for _ in range(3)]
    size = caps[0].nbytes
    cache = CaptureCache(max_bytes=2 * size)
    for i, cap in enumerate(caps):
        cache.put(f"k{i}", cap)
    assert len(cache) == 2 and "k0" not in cache and cache.total_bytes <= 2 * size
    assert cache.get("k1") is caps[1]
    cache.put("k3", caps[0])  # k1 was used last, so k2 goes
    assert "k1" in cache and "k2" not in cache
    assert capture_key("smollm2", "a") != capture_key("minilm", "a")


def test_csv_matrix_and_default_query(tiny_bert_words):
    model, tok = tiny_bert_words
    cap = attnviz.capture(model, CAT, tok)
    df = matrix_frame(cap, 1, 2, words=True)
    assert list(df.columns) == cap.word_labels and df.index.name == "query"
    assert df.loc["it", "cat"] == pytest.approx(cap.attention(1, 2, words=True)[8, 2].item())
    assert cap.words[[w.token_stop - 1 for w in cap.words].index(default_query(cap))].text == "it"


# ---------------------------------------------------------------- analysis views (coreference, statistics, rollout)


@pytest.mark.browser
@pytest.mark.slow
def test_coreference_view_ranks_heads_and_clicks_change_candidates(dash_duo, app):
    dash_duo.start_server(app)
    wait_status(dash_duo, "27 tokens")
    open_tab(dash_duo, "Coreference")
    dash_duo.wait_for_contains_text(f"#{AID.coref_headline}", "它 → 小猫", timeout=30)
    chips = {c.text: c for c in dash_duo.find_elements(".coref-word")}
    assert "pronoun" in chips["它"].get_attribute("class")
    assert "candidate" in chips["小猫"].get_attribute("class")
    headline = dash_duo.find_element(f"#{AID.coref_headline}").text
    assert "leaving out" in headline and "renormalising" in headline
    # remove 我家 from the candidates: the headline no longer mentions it
    assert "candidate" in chips["我家"].get_attribute("class") and "它 → 我家" in headline
    chips["我家"].click()
    poll(
        lambda: (
            "它 → 小猫" in (text := dash_duo.find_element(f"#{AID.coref_headline}").text) and "它 → 我家" not in text
        )
    )
    # click the first row of the ranking: that head becomes the selected one
    first_row = dash_duo.find_elements(f"#{AID.coref_table} td")
    layer_cell, head_cell = first_row[0].text, first_row[1].text
    first_row[2].click()
    open_tab(dash_duo, "Heatmap")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"L{layer_cell}·H{head_cell}")
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_probe_set_runs_from_the_page(dash_duo):
    start_minilm(dash_duo)
    open_tab(dash_duo, "Coreference")
    choose(dash_duo, f"#{AID.probe_set}", 0)  # en: MiniLM's vocabulary reads no Chinese pronoun (zh is refused)
    dash_duo.find_element(f"#{AID.probe_run}").click()
    dash_duo.wait_for_contains_text(f"#{AID.probe_summary}", "42 probes on minilm", timeout=120)
    dash_duo.wait_for_contains_text(f"#{AID.probe_map} .gtitle", "baselines: nearest 50.0 %")
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_head_statistics_and_rollout_views(dash_duo):
    start_minilm(dash_duo)
    open_tab(dash_duo, "Head statistics")
    dash_duo.wait_for_contains_text(f"#{AID.stats_map} .gtitle", "previous_token: attends to the token just before")
    headers = [h.text for h in dash_duo.find_elements(f"#{AID.stats_table} th")]
    for column in ("layer", "head", "first", "special", "punctuation", "entropy", "induction"):
        assert any(column in h for h in headers), headers
    choose(dash_duo, f"#{AID.stats_column}", 7)  # entropy
    dash_duo.wait_for_contains_text(f"#{AID.stats_map} .gtitle", "entropy")
    cells = dash_duo.find_elements(f"#{AID.stats_table} td")
    layer_cell, head_cell = cells[0].text, cells[1].text
    cells[3].click()
    open_tab(dash_duo, "Heatmap")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"L{layer_cell}·H{head_cell}")
    open_tab(dash_duo, "Rollout")
    dash_duo.wait_for_contains_text(f"#{AID.rollout_graph} .gtitle", "not an attribution")

    # Units: words reaches the rollout too (it stayed in tokens): the page's words, 小猫 one of them
    def axis() -> list:
        return dash_duo.driver.execute_script(
            "const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot'); return gd.data[0].x;",
            AID.rollout_graph,
        )

    poll(lambda: axis())
    tokens = axis()
    dash_duo.find_elements(f"#{ID.words} input")[1].click()
    poll(lambda: axis() and axis() != tokens)
    words = axis()
    assert len(words) < len(tokens) and any(label.endswith(":小猫") for label in words), (tokens, words)
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_exports_download_the_shown_matrix_and_the_capture(dash_duo):
    from pathlib import Path

    import pandas as pd

    start_minilm(dash_duo)
    run_text(dash_duo, CAT, expect="minilm: 13 tokens")
    dash_duo.select_dcc_dropdown(f"#{ID.layer}", value="L5")
    dash_duo.select_dcc_dropdown(f"#{ID.head}", value="H11")
    dash_duo.find_elements(f"#{ID.words} input")[1].click()
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L5·H11 — word × word")
    folder = Path(dash_duo.download_path)
    dash_duo.find_element(f"#{ID.csv_button}").click()
    poll(lambda: (folder / "attention-L5-H11-words.csv").exists(), timeout=20)
    df = pd.read_csv(folder / "attention-L5-H11-words.csv", index_col=0)
    cap = attnviz.capture("minilm", CAT)
    assert list(df.columns) == cap.word_labels
    assert df.loc["it", "cat"] == pytest.approx(cap.attention(5, 11, words=True)[8, 2].item(), abs=1e-6)
    dash_duo.find_element(f"#{ID.capture_button}").click()
    poll(lambda: (folder / "capture.attnviz").exists() and (folder / "capture.attnviz").stat().st_size > 0, timeout=20)
    back = attnviz.load(folder / "capture.attnviz")
    assert back.text == CAT and back.validate().passed
    open_tab(dash_duo, "Model view")  # the shown view as one self-contained HTML page
    dash_duo.find_element(f"#{ID.html_button}").click()
    page = folder / "attnviz-model-L5-H11.html"
    poll(lambda: page.exists() and page.stat().st_size > 3_000_000, timeout=30)
    html = page.read_text()
    assert "Model view: 6 layers \\u00d7 12 heads" in html and "<script src=" not in html
    open_tab(dash_duo, "Heatmap")
    dash_duo.find_elements(f"#{ID.export_format} input")[1].click()  # SVG: no error, figures keep working
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L5·H11")
    no_console_errors(dash_duo)


@pytest.fixture(scope="module")
def bart_folder(tmp_path_factory, bert_tokenizer):
    """A tiny random BART that reads MiniLM's vocabulary, saved as a model folder (an encoder-decoder
    the page loads like any hub name)."""
    folder = tmp_path_factory.mktemp("models") / "tiny-bart"
    model = attnviz.testing.tiny_model(
        "bart", vocab_size=bert_tokenizer.vocab_size, pad_token_id=0, decoder_start_token_id=102
    )
    model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.browser
@pytest.mark.slow
def test_encoder_decoder_target_box_and_part_selector(dash_duo, bart_folder):
    dash_duo.start_server(create_app({bart_folder: "tiny BART", **MODELS}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    assert not dash_duo.find_element(f"#{ID.target_box}").is_displayed()  # MiniLM reads one text
    assert not dash_duo.find_element(f"#{ID.part_box}").is_displayed()
    choose(dash_duo, f"#{ID.model}", 0)
    dash_duo.wait_for_style_to_equal(f"#{ID.target_box}", "display", "block")
    dash_duo.find_element(f"#{ID.target}").send_keys("Le chat était fatigué.")
    run_text(dash_duo, CAT, expect="target 8 tokens")
    status = dash_duo.find_element(f"#{ID.status}").text
    assert "13 tokens" in status and "encoder 2 layers × 4 heads" in status and "cross 2 layers" in status
    assert dash_duo.find_element(f"#{ID.part_box}").is_displayed()
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "encoder L")
    choose(dash_duo, f"#{ID.part}", 2)  # cross (target × source)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "target token × source token attention")
    poll(
        lambda: (
            [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .ytick text")][:4]
            == ["[SEP]", "[CLS]", "Le", "chat"]
        )
    )
    assert [t.text for t in dash_duo.find_elements(f"#{ID.heatmap} .xtick text")][:3] == ["[CLS]", "The", "cat"]
    open_tab(dash_duo, "AttentionLab")  # the lab's query chips are the target's tokens now
    poll(lambda: "chat" in [c.text for c in dash_duo.find_elements(".lab-token")])
    {c.text: c for c in dash_duo.find_elements(".lab-token")}["chat"].click()
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query 'chat'")
    open_tab(dash_duo, "Recomputed vs model")
    dash_duo.wait_for_contains_text(f"#{ID.validation_summary}", "attnviz validation PASS")
    dash_duo.wait_for_contains_text(f"#{ID.validation_map} .gtitle", "(cross)")
    open_tab(dash_duo, "Coreference")  # reads one text attending to itself: says so for cross
    dash_duo.wait_for_contains_text("#coref-headline", "choose the encoder or the decoder part")
    choose(dash_duo, f"#{ID.part}", 1)  # decoder: the coreference view works on the target
    dash_duo.wait_for_contains_text("#coref-headline", "→")
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_picking_another_model_says_the_views_wait_for_run(dash_duo):
    """A reviewer picked MiniLM and saw nothing change, the status still naming SmolLM2: the line under
    Run model says the views show the last capture's model until Run."""
    start_minilm(dash_duo)
    assert dash_duo.find_element(f"#{ID.model_hint}").text == ""
    choose(dash_duo, f"#{ID.model}", 1)  # SmolLM2
    dash_duo.wait_for_text_to_equal(
        f"#{ID.model_hint}",
        "The views show MiniLM (BERT)'s capture: press Run model to read the text with SmolLM2 (decoder).",
    )
    assert "minilm" in dash_duo.find_element(f"#{ID.status}").text  # nothing ran
    # SmolLM2's tokenizer starts a text with its first word: its BOS default, read from its config and
    # tokenizer (no weights); waited for, so the test does not end inside that read
    poll(lambda: dash_duo.find_element(f"#{ID.bos} input").is_selected(), timeout=60)
    choose(dash_duo, f"#{ID.model}", 0)
    dash_duo.wait_for_text_to_equal(f"#{ID.model_hint}", "")
    poll(lambda: not dash_duo.find_element(f"#{ID.bos} input").is_selected(), timeout=30)  # [CLS] comes first
    no_console_errors(dash_duo)
