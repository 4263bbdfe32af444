"""Long texts in the dashboard (#10 items 1, 2, 4): the heatmap's pooled overview and its exact zoom,
the head view's top-k / mass / query-range controls, and the Compare view; and the pure helpers behind them."""

import json
import os
import time

import pytest
import torch
from attnviz.dashboard import create_app
from attnviz.dashboard.common import text_limit
from attnviz.dashboard.compare_view import compare_figure, partner
from attnviz.dashboard.head_view import range_marks, rules
from attnviz.dashboard.ids import AID, CID, HID, ID
from attnviz.dashboard.overview_view import OVERVIEW_SIZE, edges_of, shown_overview, shown_window, zoom_span
from dash._utils import to_json
from selenium.webdriver.common.keys import Keys
from test_dashboard import no_console_errors, open_tab, poll, run_text, show_heatmap_in_tokens, wait_status

import attnviz
from attnviz import figures
from attnviz.figures.helpers import MODEL_VIEW_CELLS

N_LONG = 4096
BIG = "The trophy doesn't fit into the brown suitcase because it is too big."
SMALL = "The trophy doesn't fit into the brown suitcase because it is too small."
MB2 = 2_000_000


@pytest.fixture(scope="module")
def bert_folder(model_folder, tiny_bert_words):
    """A tiny random BERT with MiniLM's WordPiece vocabulary (64 positions): another tokenization."""
    return model_folder("tiny-bert", *tiny_bert_words)


def set_text(dash_duo, element_id: str, text: str):
    """Put a long text in a dcc.Textarea at once (typing 20,000 characters takes minutes)."""
    dash_duo.driver.execute_script(
        "const el = document.getElementById(arguments[0]);"
        "Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set.call(el, arguments[1]);"
        "el.dispatchEvent(new Event('input', {bubbles: true}));",
        element_id,
        text,
    )


def record_responses(dash_duo):
    """From now on, note each callback response's outputs and size (characters of its JSON)."""
    dash_duo.driver.execute_script(
        "window.__responses = []; const fetch0 = window.fetch;"
        "window.fetch = async (...args) => { const t0 = performance.now(); const r = await fetch0(...args);"
        "  if (String(args[0]).includes('_dash-update-component')) {"
        "    const output = JSON.parse(args[1].body).output;"
        "    r.clone().text().then(t => window.__responses.push([output, t.length,"
        "      Math.round(t0), Math.round(performance.now())])); }"
        "  return r; };"
    )


def responses(dash_duo) -> list:
    return dash_duo.driver.execute_script("return window.__responses;")


def heatmaps_sent(dash_duo) -> list[int]:
    """The sizes of the responses that carried a heatmap figure (a 204 "nothing to update" has none)."""
    return [size for out, size, *_ in responses(dash_duo) if "heatmap-graph.figure" in out and size > 1000]


def graph(dash_duo, graph_id: str, script: str):
    return dash_duo.driver.execute_script(f"const gd = document.querySelector('#{graph_id} .js-plotly-plot'); {script}")


def title(dash_duo, graph_id: str) -> str:
    return graph(dash_duo, graph_id, "return gd.layout.title.text;") or ""


def lines(dash_duo) -> int:
    """The number of lines the head view's title says it draws."""
    text = title(dash_duo, ID.head_view)
    return int(text.rsplit("(", 1)[1].split(" lines")[0].replace(",", ""))


# ---------------------------------------------------------------- in the browser
@pytest.mark.browser
def test_long_text_overview_is_under_2mb_and_a_zoom_shows_exact_weights(dash_duo, llama_folder, long_llama, long_text):
    dash_duo.start_server(create_app({llama_folder: "tiny Llama (8k positions)"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    if dash_duo.driver.execute_script(f"return document.querySelector('#{ID.bos} input').checked;"):
        dash_duo.find_element(f"#{ID.bos} input").click()  # no BOS: exactly N_LONG tokens, blocks of 8
    n = N_LONG
    record_responses(dash_duo)
    set_text(dash_duo, ID.text, long_text)
    t0 = time.time()
    dash_duo.find_element(f"#{ID.run}").click()
    wait_status(dash_duo, f"{n} tokens", timeout=120)
    t1 = time.time()
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"overview of {n:,} × {n:,} tokens", timeout=240)
    print(f"\nrun → status {t1 - t0:.1f} s, → overview shown {time.time() - t0:.1f} s")
    assert dash_duo.find_element(f"#{ID.message}").text == ""
    poll(lambda: any("heatmap-graph.figure" in out for out, *_ in responses(dash_duo)))
    sizes = {out[:60]: (size, start, end) for out, size, start, end in responses(dash_duo)}
    heat = [size for out, size, *_ in responses(dash_duo) if "heatmap-graph.figure" in out]
    print("\nresponse sizes at n =", n, json.dumps(sizes, indent=1))
    assert heat and max(heat) <= MB2, heat
    # the overview: 512 blocks of 8 tokens a side, each named by its token range
    cats = graph(dash_duo, ID.heatmap, "return [gd.data[0].x.length, gd.data[0].y.length, gd.data[0].y[1]];")
    assert cats[:2] == [OVERVIEW_SIZE, OVERVIEW_SIZE] and cats[2].startswith("8–15 ("), cats
    assert dash_duo.find_element("#overview-mode-box").is_displayed()
    # one overview per run: setting the part again (its callback sets the layer and head selectors) sends
    # nothing more; zoom (as a drag does) once every callback of the run has answered: rows 2048–2303 and
    # keys 1024–1279, i.e. blocks 256–287 and 128–159
    poll(lambda: dash_duo.redux_state_rqs == [], timeout=60)
    assert len(heatmaps_sent(dash_duo)) == 1, heatmaps_sent(dash_duo)
    layer, head = (int(x) for x in title(dash_duo, ID.heatmap).split(" — ")[0].lstrip("L").split("·H"))
    graph(
        dash_duo,
        ID.heatmap,
        "Plotly.relayout(gd, {'xaxis.range[0]': 127.6, 'xaxis.range[1]': 159.4,"
        " 'yaxis.range[0]': 287.4, 'yaxis.range[1]': 255.6});",
    )
    t0 = time.time()
    dash_duo.wait_for_contains_text(
        f"#{ID.heatmap} .gtitle", "exact weights of queries 2048–2303 × keys 1024–1279", timeout=30
    )
    print(f"zoom → exact window shown {time.time() - t0:.1f} s")
    shown = graph(dash_duo, ID.heatmap, "return Array.from(gd._fullData[0].z, row => Array.from(row));")
    shown = torch.tensor([[float("nan") if v is None else v for v in row] for row in shown])
    model, tokenizer = long_llama
    cap = attnviz.capture(model, long_text, tokenizer)
    expected = cap.attention(layer, head)[2048:2304, 1024:1280]
    allowed = cap.allowed(layer)[2048:2304, 1024:1280]
    assert shown.shape == (256, 256)
    assert torch.isnan(shown[~allowed]).all() and not torch.isnan(shown[allowed]).any()
    torch.testing.assert_close(shown[allowed], expected[allowed], atol=1e-6, rtol=1e-4)
    # double-click: back to the overview
    graph(dash_duo, ID.heatmap, "Plotly.relayout(gd, {'xaxis.autorange': true, 'yaxis.autorange': true});")
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "overview of", timeout=30)
    # another tab and back: the figure on the page is what the selection shows, nothing is sent again
    poll(lambda: dash_duo.redux_state_rqs == [], timeout=60)
    sent = len(heatmaps_sent(dash_duo))
    open_tab(dash_duo, "Shapes & cost")
    open_tab(dash_duo, "Heatmap")
    poll(lambda: dash_duo.redux_state_rqs == [], timeout=60)
    assert len(heatmaps_sent(dash_duo)) == sent
    assert "overview of" in title(dash_duo, ID.heatmap)
    # rollout: only the block means the heatmap shows are computed (layers·512·n², not layers·n³)
    open_tab(dash_duo, "Rollout")
    dash_duo.wait_for_contains_text(f"#{AID.rollout_graph} .gtitle", "a block of 8×8 tokens", timeout=120)
    z = graph(dash_duo, AID.rollout_graph, "const z = gd._fullData[0].z; return [z.length, z[0].length];")
    assert z == [OVERVIEW_SIZE, OVERVIEW_SIZE]
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_a_long_text_is_captured_in_the_background_with_progress_cancel_and_the_cache(
    dash_duo, monkeypatch, llama_folder, long_text
):
    """Over 1,024 tokens the capture is a background job: progress and Cancel, the page usable meanwhile;
    the finished capture reaches the server's cache, and running the same text again reuses it."""
    from attnviz.dashboard import captures as captures_module

    slow, server = [True], os.getpid()
    original = attnviz.capture

    def capture(model, *args, **kwargs):  # the job is a forked copy of this process: it runs this too
        if slow[0] and os.getpid() != server:  # in the job, the first layer takes a minute after its progress
            attnviz.load_model(model)[0].model.layers[0].register_forward_hook(lambda *_: time.sleep(60))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(attnviz, "capture", capture)
    asked, picks = [], []
    long_job = captures_module.Captures.long_job
    monkeypatch.setattr(captures_module.Captures, "long_job", lambda *a: asked.append(1) or long_job(*a))
    pick = captures_module.default_head
    monkeypatch.setattr(captures_module, "default_head", lambda *a: picks.append((a[0].n_tokens, a[1])) or pick(*a))
    dash_duo.start_server(create_app({llama_folder: "tiny Llama (8k positions)"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    opening = dash_duo.find_element(f"#{ID.status}").text
    set_text(dash_duo, ID.text, long_text)
    dash_duo.find_element(f"#{ID.run}").click()
    dash_duo.wait_for_contains_text(f"#{ID.job_progress_text}", "Capturing in the background: layer 2 of 2", 60)
    assert dash_duo.find_element(f"#{ID.job_progress}").is_displayed()
    assert not dash_duo.find_element(f"#{ID.run}").is_enabled()
    open_tab(dash_duo, "Shapes & cost")  # the page stays usable: the last capture's views answer
    dash_duo.wait_for_contains_text(f"#{ID.cost}", "Shapes (one layer)", timeout=30)
    dash_duo.find_element(f"#{ID.job_cancel}").click()
    dash_duo.wait_for_style_to_equal(f"#{ID.job_cancel}", "display", "none", timeout=30)
    assert not dash_duo.find_element(f"#{ID.job_progress}").is_displayed()
    assert dash_duo.find_element(f"#{ID.run}").is_enabled()
    assert dash_duo.find_element(f"#{ID.status}").text == opening and not dash_duo.find_element(f"#{ID.message}").text
    slow[0] = False
    dash_duo.find_element(f"#{ID.run}").click()
    wait_status(dash_duo, f"{N_LONG + 1} tokens", timeout=120)  # and the BOS
    # asked whether to go to a job: the opening text, the cancelled run, this one; heads picked: the opening
    # text's and this one's
    assert len(asked) == 3 and len(picks) == 2, picks
    record_responses(dash_duo)
    dash_duo.find_element(f"#{ID.run}").click()  # the same text again: the server's cache, no job, no re-pick
    poll(lambda: any(f"{ID.status}.children" in out for out, *_ in responses(dash_duo)), timeout=30)
    assert f"{N_LONG + 1} tokens" in dash_duo.find_element(f"#{ID.status}").text
    assert len(asked) == 3 and len(picks) == 2
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_head_view_top_k_mass_and_query_range_change_the_lines(dash_duo, llama_folder, long_llama):
    text = "The cat sat on the mat because it was tired, and the dog slept under the table all day long."
    dash_duo.start_server(create_app({llama_folder: "tiny Llama"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, text, expect="tokens")
    bos = dash_duo.driver.execute_script(f"return document.querySelector('#{ID.bos} input').checked;")
    model, tokenizer = long_llama
    cap = attnviz.capture(model, text, tokenizer, add_bos=bos)
    open_tab(dash_duo, "Head view")
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "lines)")
    layer = int(title(dash_duo, ID.head_view).split(" head view")[0].lstrip("L"))
    head = dash_duo.driver.execute_script(
        f"return Array.from(document.querySelectorAll('#{ID.heads_multi} input')).findIndex(i => i.checked);"
    )
    w = cap.attention(layer, head)

    def expected(**rule) -> int:
        return int(figures.helpers.strongest(w, threshold=0.02, **rule).sum())

    assert "top" not in title(dash_duo, ID.head_view)  # a short text: every line above the threshold
    assert lines(dash_duo) == expected()
    box = dash_duo.find_element(f"#{HID.top_k}")
    box.send_keys("1", Keys.ENTER)
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "top 1 per query")
    assert lines(dash_duo) == expected(top_k=1) < expected()
    box.send_keys(Keys.BACKSPACE, "2", Keys.ENTER)
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "top 2 per query")
    assert lines(dash_duo) == expected(top_k=2)
    box.send_keys(Keys.BACKSPACE, "-3", Keys.ENTER)  # was ignored unsaid (the box's min made it "all")
    dash_duo.wait_for_contains_text(f"#{ID.head_view}", "Top keys per query: type a whole number ≥ 1")
    box.send_keys(Keys.BACKSPACE, Keys.BACKSPACE, "2", Keys.ENTER)
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "top 2 per query")
    thumb = dash_duo.find_element(f"#{HID.mass} [role=slider]")
    for _ in range(10):  # 100% → 50%, by keyboard
        thumb.send_keys(Keys.ARROW_LEFT)
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", "50% of each row")
    poll(lambda: lines(dash_duo) == expected(top_k=2, mass=0.5))
    start = dash_duo.find_elements(f"#{HID.queries} [role=slider]")[0]
    for _ in range(5):  # the query range starts at position 5
        start.send_keys(Keys.ARROW_RIGHT)
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", f"queries 5–{cap.n_tokens - 1}")
    w = w[5:]
    assert lines(dash_duo) == expected(top_k=2, mass=0.5)
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_compare_winograd_pair_then_a_model_of_another_tokenization(dash_duo, llama_folder, bert_folder):
    dash_duo.start_server(
        create_app({llama_folder: "tiny Llama", bert_folder: "tiny BERT"}, default_model=llama_folder)
    )
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    run_text(dash_duo, BIG, expect="tokens")
    open_tab(dash_duo, "Compare")
    poll(lambda: dash_duo.find_element(f"#{CID.text}").get_attribute("value") == SMALL)  # the Winograd partner
    dash_duo.find_element(f"#{CID.run}").click()
    dash_duo.wait_for_contains_text(f"#{CID.graph} .gtitle", "max |A − B|", timeout=30)
    first = title(dash_duo, CID.graph)
    assert "1 token differs (big/small)" in first and first.startswith("L"), first
    assert graph(dash_duo, CID.graph, "return gd.data.length;") == 3  # A, B and A − B
    assert "tiny-llama-8k" in dash_duo.find_element(f"#{CID.note}").text
    # kept in step with the page's head
    head = int(first.split("·H")[1].split(",")[0])
    other = (head + 1) % 4
    dash_duo.select_dcc_dropdown(f"#{ID.head}", value=f"H{other}")
    dash_duo.wait_for_contains_text(f"#{CID.graph} .gtitle", f"·H{other}, tokens")
    # B on the other model, same text: WordPiece and byte-level BPE cut it differently
    box = dash_duo.find_element(f"#{CID.text}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)  # empty: A's text
    dash_duo.select_dcc_dropdown(f"#{CID.model}", value="tiny BERT")
    dash_duo.find_element(f"#{CID.run}").click()
    dash_duo.wait_for_contains_text(f"#{CID.graph} .gtitle", "no difference map: the tokens differ", timeout=30)
    assert graph(dash_duo, CID.graph, "return gd.data.length;") == 2
    assert dash_duo.find_element(f"#{ID.message}").text == ""
    # beyond B's own limit (64 positions): the page's message area says so, no traceback
    box.send_keys("word " * 80)
    dash_duo.find_element(f"#{CID.run}").click()
    dash_duo.wait_for_contains_text(f"#{ID.message}", "Compare: The text has 82 tokens;", timeout=30)
    assert "reads at most 64. Shorten the text" in dash_duo.find_element(f"#{ID.message}").text
    assert dash_duo.find_element(f"#{ID.message}").get_attribute("role") == "alert"
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    dash_duo.find_element(f"#{CID.run}").click()  # a comparison that works clears its message
    dash_duo.wait_for_text_to_equal(f"#{ID.message}", "", timeout=30)
    no_console_errors(dash_duo)


# ---------------------------------------------------------------- server side, no browser
def test_overview_and_window_payloads_and_exact_cells(long_llama, long_text):
    model, tokenizer = long_llama
    cap = attnviz.capture(model, long_text, tokenizer)
    for mode in ("max", "mean"):
        fig, view = shown_overview(cap, 1, 2, mode=mode)
        assert len(to_json(fig)) <= MB2
        assert view == {"rows": [0, N_LONG, 8], "cols": [0, N_LONG, 8], "full": True}
        assert fig.data[0].z.shape == (OVERVIEW_SIZE, OVERVIEW_SIZE)
    full = cap.attention(1, 2)
    z = figures.overview_figure(cap, 1, 2, mode="max").data[0].z  # block (1, 0): queries 8–15 × keys 0–7
    assert z[1, 0] == pytest.approx(float(full[8:16, :8].max())) and z[0, 1] != z[0, 1]  # (0, 1) masked: NaN
    fig, view = shown_window(cap, 1, 2, (N_LONG - 512, N_LONG), (0, 512))
    assert len(to_json(fig)) <= MB2 and view == {"rows": [N_LONG - 512, N_LONG, 1], "cols": [0, 512, 1], "full": False}
    torch.testing.assert_close(torch.from_numpy(fig.data[0].z), full[-512:, :512])  # nothing masked there


def test_the_model_view_pools_row_chunks_into_the_same_mosaic(long_llama):
    model, tokenizer = long_llama
    cap = attnviz.capture(model, " ".join(["The cat sat on the mat because it was tired."] * 12), tokenizer)
    assert cap.n_tokens > MODEL_VIEW_CELLS  # pooled thumbnails
    page = figures.model_view(cap, selected=(1, 2))  # thumbnails pooled a chunk of query rows at a time
    t = MODEL_VIEW_CELLS
    layers, heads = cap.layer_indices(), cap.info()["n_heads"]
    assert page.data[0].z.shape == (len(layers) * (t + 1) - 1, heads * (t + 1) - 1)
    for r, layer in enumerate(layers):
        full = torch.nn.functional.adaptive_max_pool2d(cap.attention(layer).cpu()[None], (t, t))[0]  # the n×n maps
        for head in range(heads):
            cell = page.data[0].z[r * (t + 1) : r * (t + 1) + t, head * (t + 1) : head * (t + 1) + t]
            assert (cell == full[head].numpy().round(3)).all()
    gaps = page.data[0].z[t :: t + 1]
    assert (gaps != gaps).all()  # NaN: the rows between layers
    assert page.layout.title.text.startswith(f"Model view: {len(layers)} layers × {heads} heads")


def test_zoom_span_maps_categories_to_tokens():
    view = {"rows": [0, 4096, 8], "cols": [0, 4096, 8], "full": True}
    assert edges_of(view["rows"])[:3] == [0, 8, 16] and edges_of([100, 110, 4]) == [100, 104, 108, 110]
    zoom = {"xaxis.range[0]": 127.6, "xaxis.range[1]": 159.4, "yaxis.range[0]": 287.4, "yaxis.range[1]": 255.6}
    assert zoom_span(zoom, view) == ((2048, 2304), (1024, 1280))
    assert zoom_span({"xaxis.range": [-3, 0.2]}, view) == ((0, 4096), (0, 8))  # x only: all the rows
    assert zoom_span({"xaxis.autorange": True, "yaxis.autorange": True}, view) == "reset"
    assert zoom_span({"autosize": True}, view) is None and zoom_span({"xaxis.range[0]": 1}, None) is None
    window = {"rows": [2048, 2304, 1], "cols": [1024, 1280, 1], "full": False}
    assert zoom_span({"xaxis.range[0]": 9.6, "xaxis.range[1]": 20.4}, window) == ((2048, 2304), (1034, 1045))


def test_head_view_rules_and_marks():
    assert rules(None, 1.0, [0, 9], 10) == {"top_k": None, "mass": None, "queries": None}
    assert rules(3, 0.7, [2, 4], 10) == {"top_k": 3, "mass": 0.7, "queries": (2, 5)}
    assert rules("", 0.5, [0, 99], 10)["queries"] is None  # clamped to the text: all of it
    with pytest.raises(attnviz.InputError, match="whole number ≥ 1"):
        rules(0, 1.0, None, 10)
    assert range_marks(4096)[4095] == "4095" and len(range_marks(4096)) <= 9 and range_marks(1) == {0: "0"}


def test_compare_helpers_partner_and_a_head_b_lacks(tiny_bert_words):
    assert partner(BIG) == SMALL and partner(SMALL) == BIG
    assert partner("The trophy doesn't fit in the suitcase because it is too small.").endswith("too big.")
    assert partner("It is too big.") is None and partner(None) is None
    model, tokenizer = tiny_bert_words
    a = attnviz.capture(model, BIG, tokenizer)
    two_heads = attnviz.testing.tiny_model(
        "bert", attn_implementation="eager", vocab_size=tokenizer.vocab_size, num_attention_heads=2
    )
    b = attnviz.capture(two_heads, SMALL, tokenizer)
    fig, message = compare_figure(a, b, 1, 3, words=False, part=None)
    assert (
        message
        == "B has layers [0, 1] and heads 0..1; L1·H3 is not one of them: choose a layer and head both captures have"
    )
    assert message in fig.layout.annotations[0].text
    fig, message = compare_figure(a, b, 1, 1, words=True, part=None)
    assert message == "" and len(fig.data) == 3 and "1 word differs (big/small)" in fig.layout.title.text


def test_the_limit_is_the_models_own(long_llama, tiny_bert_words):
    model, _ = long_llama
    assert text_limit(model.config, None, "llama") == (8192, "llama reads")
    assert text_limit(model.config, 40, "llama") == (40, "this dashboard shows")
    assert text_limit(tiny_bert_words[0].config, 1000, "bert") == (64, "bert reads")
