"""Generation in the dashboard: "Generate" from the page, new tokens marked in every view, the
AttentionLab's step slider, saved generations opened with --capture; and the pure helpers behind them."""

import os
import time
from pathlib import Path

import pytest
from attnviz.dashboard import create_app
from attnviz.dashboard.export_view import view_figures
from attnviz.dashboard.generation_view import step_marks
from attnviz.dashboard.generations import generation_of
from attnviz.dashboard.ids import GID, ID
from attnviz.dashboard.lab_view import token_roles
from attnviz.dashboard.run_view import checked_new_tokens, generation_status
from selenium.webdriver.common.keys import Keys
from test_dashboard import (
    MODELS,
    choose,
    no_console_errors,
    open_tab,
    poll,
    run_text,
    show_heatmap_in_tokens,
    start_minilm,
    wait_status,
)

import attnviz
from attnviz import figures
from attnviz.figures import step_figure
from attnviz.figures.helpers import MARK, marked, new_start, step_summary

PROMPT = "The cat sat on the mat because"


@pytest.fixture(scope="module")
def tiny_llama(smol_tokenizer):
    """A tiny random Llama (64 positions) that reads SmolLM2's vocabulary: it generates in milliseconds."""
    return attnviz.testing.tiny_model(
        "llama", vocab_size=len(smol_tokenizer), max_position_embeddings=64
    ), smol_tokenizer


@pytest.fixture(scope="module")
def llama_folder(model_folder, tiny_llama):
    """The tiny Llama saved as a model folder: the page loads it like any hub name."""
    return model_folder("tiny-llama", *tiny_llama)


@pytest.fixture(scope="module")
def gen(tiny_llama):
    model, tokenizer = tiny_llama
    return attnviz.generate(model, PROMPT, tokenizer, max_new_tokens=6)


def ticks(dash_duo, graph: str, axis: str = "x") -> list[str]:
    return [t.text for t in dash_duo.find_elements(f"#{graph} .{axis}tick text")]


def figure_shapes(dash_duo, graph: str) -> int:
    return dash_duo.driver.execute_script(
        f"return (document.querySelector('#{graph} .js-plotly-plot').layout.shapes || []).length;"
    )


def set_new_tokens(dash_duo, n: int | str):
    box = dash_duo.find_element(f"#{GID.new_tokens}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(str(n))


def generate(dash_duo, prompt: str, n: int | str):
    box = dash_duo.find_element(f"#{ID.text}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    box.send_keys(prompt)
    set_new_tokens(dash_duo, n)
    dash_duo.find_element(f"#{GID.generate}").click()


def chips(dash_duo) -> list:
    return dash_duo.find_elements(".lab-token")


def move_slider(dash_duo, presses: int):
    """Move the step slider by keyboard (its thumb is a focusable role=slider)."""
    thumb = dash_duo.find_element(f"#{GID.step} [role=slider]")
    key = Keys.ARROW_RIGHT if presses > 0 else Keys.ARROW_LEFT
    for _ in range(abs(presses)):
        thumb.send_keys(key)


# ---------------------------------------------------------------- in the browser
@pytest.mark.browser
def test_generate_from_the_page_marks_new_tokens_and_the_step_slider_replays_them(dash_duo, llama_folder, gen):
    dash_duo.start_server(create_app({llama_folder: "tiny Llama", **MODELS}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    assert not dash_duo.find_element(f"#{GID.step_box}").is_displayed()
    bos = dash_duo.find_element(f"#{ID.bos} input")
    assert bos.is_selected()  # a decoder without a BOS of its own gets one by default
    bos.click()  # off: the generation below is the fixture's, which has none
    generate(dash_duo, PROMPT, 6)
    wait_status(dash_duo, f"generated 6 new tokens: “{gen.text}” — 7 prompt + 6 new")
    assert dash_duo.find_element(f"#{ID.message}").text == ""
    assert dash_duo.find_element(f"#{GID.progress}").text == ""  # "Generating 6 new tokens…" is gone
    # the heatmap: the six new tokens' labels marked, a dotted line at the prompt's end on each axis
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"{MARK} generated")
    labels = gen.capture.token_labels
    assert ticks(dash_duo, ID.heatmap) == labels[:7] + [MARK + t for t in labels[7:]]
    assert ticks(dash_duo, ID.heatmap, "y") == labels[:7] + [MARK + t for t in labels[7:]]
    assert figure_shapes(dash_duo, ID.heatmap) == 2
    # the lab opens on step 0: the first new token is the query, the tokens after it are faded
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_element(f"#{GID.step_box}")
    poll(lambda: dash_duo.find_element(f"#{GID.step_box}").is_displayed())
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", f"Step 0: the model wrote {MARK}{labels[7]!r} (position 7)")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", f"query {labels[7]!r} (#7)")
    classes = [c.get_attribute("class") for c in chips(dash_duo)]
    assert ["generated" in c for c in classes] == [False] * 7 + [True] * 6
    assert ["later" in c for c in classes] == [False] * 8 + [True] * 5
    assert chips(dash_duo)[8].value_of_css_property("font-style") == "italic"
    dash_duo.wait_for_contains_text(f"#{GID.step_graph} .gtitle", "Step 0 of 0…5")
    # move the slider two steps: new token 2 is the query, its row and the chooser's row are drawn
    move_slider(dash_duo, 2)
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", f"Step 2: the model wrote {MARK}{labels[9]!r} (position 9)")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", f"query {labels[9]!r} (#9)")
    poll(lambda: ["later" in c.get_attribute("class") for c in chips(dash_duo)] == [False] * 10 + [True] * 3)
    subtitles = [a.text for a in dash_duo.find_elements(f"#{GID.step_graph} .annotation-text")]
    assert f"choosing {labels[9]!r}: the row of {labels[8]!r} (#8), whose output predicted it" in subtitles
    assert ticks(dash_duo, ID.lab_graph)[7:] == [MARK + t for t in labels[7:]]  # the lab's row: keys marked too
    # clicking a later token's chip makes it the query and moves the slider to its step
    chips(dash_duo)[12].click()
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", f"Step 5: the model wrote {MARK}{labels[12]!r}")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", f"query {labels[12]!r} (#12)")
    poll(lambda: not any("later" in c.get_attribute("class") for c in chips(dash_duo)))
    # the other views mark the same tokens
    open_tab(dash_duo, "Head view")
    dash_duo.wait_for_contains_text(f"#{ID.head_view} .gtitle", f"{MARK} generated")
    assert figure_shapes(dash_duo, ID.head_view) == 2
    open_tab(dash_duo, "Model view")
    dash_duo.wait_for_contains_text(f"#{ID.model_view} .gtitle", f"{MARK} generated")
    assert figure_shapes(dash_duo, ID.model_view) == 1 + 2 + 4  # the selected head, 2 layers, 4 heads
    open_tab(dash_duo, "Recomputed vs model")
    dash_duo.wait_for_contains_text(f"#{ID.validation_summary}", "attnviz validation PASS")
    dash_duo.wait_for_contains_text(f"#{ID.comparison} .gtitle", f"{MARK} generated")
    open_tab(dash_duo, "Shapes & cost")
    dash_duo.wait_for_contains_text(f"#{ID.cost}", f"n = 13 tokens (7 prompt + 6 generated {MARK})")
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_an_encoder_or_bad_input_is_a_message_and_the_page_keeps_working(dash_duo, llama_folder):
    dash_duo.start_server(create_app({**MODELS, llama_folder: "tiny Llama"}, default_model="minilm"))
    wait_status(dash_duo, "minilm")
    show_heatmap_in_tokens(dash_duo)
    generate(dash_duo, PROMPT, 5)
    dash_duo.wait_for_contains_text(f"#{ID.message}", "cannot generate text", timeout=60)
    assert "MiniLM reads a text but writes none" in dash_duo.find_element(f"#{ID.message}").text
    assert dash_duo.find_element(f"#{GID.generate}").is_enabled()
    run_text(dash_duo, PROMPT, expect="minilm: 9 tokens")  # Run model still works
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query")
    assert not dash_duo.find_element(f"#{GID.step_box}").is_displayed()  # one forward: no steps
    assert not any("generated" in c.get_attribute("class") for c in chips(dash_duo))
    choose(dash_duo, f"#{ID.model}", 2)  # the tiny Llama: 64 positions
    generate(dash_duo, PROMPT, 100)
    poll(lambda: dash_duo.find_element(f"#{ID.bos} input").is_selected())  # the decoder's BOS default
    dash_duo.wait_for_contains_text(f"#{ID.message}", "8 prompt positions + max_new_tokens=100 exceed the 64")
    assert "ask for at most 56 new tokens" in dash_duo.find_element(f"#{ID.message}").text
    generate(dash_duo, PROMPT, 2.5)
    dash_duo.wait_for_contains_text(f"#{ID.message}", "Type a whole number from 1 to 512")
    dash_duo.find_element(f"#{ID.bos} input").click()  # the BOS switch holds for generation too: off
    generate(dash_duo, PROMPT, 3)
    wait_status(dash_duo, "generated 3 new tokens")
    assert "7 prompt + 3 new" in dash_duo.find_element(f"#{ID.status}").text
    dash_duo.wait_for_text_to_equal(f"#{ID.message}", "")
    poll(lambda: dash_duo.find_element(f"#{GID.step_box}").is_displayed())
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "Step 0: the model wrote ▸")
    assert "(position 7)" in dash_duo.find_element(f"#{GID.step_text}").text  # no BOS: 7 prompt tokens
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_a_saved_generation_opens_with_marks_and_the_step_slider(dash_duo, tmp_path, gen):
    path = gen.save(tmp_path / "cat.attnviz")
    dash_duo.start_server(create_app(MODELS, capture_file=str(path)))
    wait_status(dash_duo, f"generated 6 new tokens: “{gen.text}”")
    show_heatmap_in_tokens(dash_duo)
    assert "capture file: cat.attnviz" in dash_duo.find_element(f"#{ID.model}").text
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", f"{MARK} generated")
    assert ticks(dash_duo, ID.heatmap)[-1] == MARK + gen.capture.token_labels[-1]
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "Step 0")
    move_slider(dash_duo, 5)
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "Step 5")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "(#12)")
    generate(dash_duo, PROMPT, 3)  # a file holds no model: a message, the generation stays
    dash_duo.wait_for_contains_text(f"#{ID.message}", "pick a model in the list to generate")
    assert "generated 6 new tokens" in dash_duo.find_element(f"#{ID.status}").text
    no_console_errors(dash_duo)


@pytest.mark.browser
@pytest.mark.slow
def test_smollm2_continues_the_cat_sentence_and_replays_it(dash_duo):
    """The real SmolLM2 from the page; ATTNVIZ_DOCS_SCREENSHOTS=1 also writes docs/generation-step-slider.png."""
    dash_duo.driver.set_window_size(1400, 1560)
    start_minilm(dash_duo)
    choose(dash_duo, f"#{ID.model}", 1)  # smollm2
    # the page's default for SmolLM2: a BOS before the prompt (its description is read from the GGUF file's kept
    # copy now, in a fraction of a second: the test had clicked Generate before the box was checked, without one)
    poll(lambda: dash_duo.find_element(f"#{ID.bos} input").is_selected(), timeout=60)
    generate(dash_duo, PROMPT, 20)
    dash_duo.wait_for_text_to_equal(f"#{GID.progress}", "Generating 20 new tokens…")  # while SmolLM2 loads and writes
    assert not dash_duo.find_element(f"#{GID.generate}").is_enabled()
    wait_status(dash_duo, "smollm2: generated 20 new tokens: “ she was a cat.", timeout=180)
    assert dash_duo.find_element(f"#{GID.progress}").text == ""
    choose(dash_duo, f"#{ID.layer}", 15)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L15·")
    choose(dash_duo, f"#{ID.head}", 3)
    dash_duo.wait_for_contains_text(f"#{ID.heatmap} .gtitle", "L15·H3")
    open_tab(dash_duo, "AttentionLab")
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "Step 0: the model wrote ▸'she'")
    move_slider(dash_duo, 3)  # ' cat': chosen after 'because she was a'
    dash_duo.wait_for_contains_text(f"#{GID.step_text}", "Step 3: the model wrote ▸'cat' (position 11)")  # BOS + 7
    dash_duo.wait_for_contains_text(f"#{GID.step_graph} .gtitle", "Step 3 of 0…19")
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query 'cat' (#11)")
    if os.environ.get("ATTNVIZ_DOCS_SCREENSHOTS"):
        dash_duo.driver.execute_script("window.scrollTo(0, 0);")  # the status line's continuation, then the lab
        time.sleep(1)
        dash_duo.driver.save_screenshot(str(Path(__file__).parents[1] / "docs" / "generation-step-slider.png"))
    no_console_errors(dash_duo)


# ---------------------------------------------------------------- server side, no browser
def test_new_tokens_start_after_the_prompt_on_each_generated_axis(gen, tiny_llama, tiny_bert_words):
    cap = gen.capture
    assert generation_of(cap) is not None and len(generation_of(cap)) == 6
    assert new_start(cap) == new_start(cap, axis="key") == 7
    first_word = new_start(cap, words=True)
    assert cap.words[first_word - 1].token_stop <= 7 < cap.words[first_word].token_stop
    model, tokenizer = tiny_llama
    one_forward = attnviz.capture(model, PROMPT, tokenizer)
    assert generation_of(one_forward) is None and new_start(one_forward) is None
    # an encoder-decoder: the decoder's tokens are generated (after its start token), the source is not
    bart_model = attnviz.testing.tiny_model(
        "bart", vocab_size=tiny_bert_words[1].vocab_size, decoder_start_token_id=102
    )
    bart = attnviz.generate(bart_model, "The cat sat.", tiny_bert_words[1], max_new_tokens=3).capture
    found = {p: (new_start(bart, p, axis="query"), new_start(bart, p, axis="key")) for p in bart.parts}
    assert found == {"encoder": (None, None), "decoder": (1, 1), "cross": (1, None)}
    assert new_start(bart.select("encoder")) is None and new_start(bart.select("decoder")) == 1
    assert new_start(bart) is None  # several parts and none named: nothing to mark
    assert "” — the decoder's start token + 3 new ▸" in generation_status(generation_of(bart))


def test_figures_mark_the_new_tokens_and_leave_a_forward_alone(gen, tiny_llama):
    cap = gen.capture
    labels = cap.token_labels
    heat = figures.heatmap(cap, 1, 2)
    assert [MARK in t for t in heat.layout.xaxis.ticktext] == [False] * 7 + [True] * 6
    assert list(heat.layout.yaxis.ticktext) == list(heat.layout.xaxis.ticktext)
    assert [(s.x0, s.y0) for s in heat.layout.shapes] == [(6.5, 0), (0, 6.5)]
    assert heat.layout.title.text.endswith(f"— {MARK} generated")
    bars = figures.query_row(cap, 1, 2, 9)
    assert [MARK in t for t in bars.layout.xaxis.ticktext] == [False] * 7 + [True] * 6 and len(bars.layout.shapes) == 1
    head = figures.head_view(cap, 1, [0, 1])
    assert [MARK in t for t in head.data[-1].text] == [False] * 7 + [True] * 6 and len(head.layout.shapes) == 2
    assert list(head.data[-1].hovertext) == labels[:7] + [MARK + t for t in labels[7:]]
    with pytest.MonkeyPatch.context() as mp:  # a long text: every other token labelled, blanks stay blank
        mp.setattr("attnviz.views.head_view.MAX_LABELS", 7)
        sparse = figures.head_view(cap, 1, [0])
    assert list(sparse.data[-1].text) == [t if i % 2 == 0 else "" for i, t in enumerate(labels[:7])] + [
        marked(t) if i % 2 == 0 else "" for i, t in enumerate(labels[7:], 7)
    ]
    mosaic = figures.model_view(cap, cells=24)
    assert sorted(s.y0 for s in mosaic.layout.shapes if s.y0 == s.y1) == [6.5, 20.5]  # 13 rows + 1 gap per layer
    assert sorted(s.x0 for s in mosaic.layout.shapes if s.x0 == s.x1) == [6.5, 20.5, 34.5, 48.5]
    pooled = figures.model_view(cap, cells=4)  # pooled thumbnails (4 cells for 13 tokens): 7/13 of the way down
    assert min(s.y0 for s in pooled.layout.shapes if s.y0 == s.y1) == pytest.approx(7 * 4 / 13 - 0.5)
    comparison = figures.validation_comparison(cap, 1, 2)
    assert [s.yref for s in comparison.layout.shapes] == ["y", "y2", "y3"]  # outputs: only rows are positions
    words = figures.heatmap(cap, 1, 2, words=True)
    first_word = new_start(cap, words=True)
    assert [MARK in t for t in words.layout.xaxis.ticktext] == [i >= first_word for i in range(len(cap.words))]
    model, tokenizer = tiny_llama
    one_forward = attnviz.capture(model, PROMPT, tokenizer)
    plain = figures.heatmap(one_forward, 1, 2)
    assert not plain.layout.shapes and MARK not in plain.layout.title.text
    assert not any(MARK in t for t in plain.layout.xaxis.ticktext)
    exported = view_figures(cap, "lab", 1, 2, words=False, part=None, query=9)
    assert MARK in exported[0].layout.title.text and labels[9] in exported[0].layout.title.text


def test_rollout_and_the_overview_mark_the_new_tokens_where_they_fall(gen):
    cap = gen.capture
    flow = attnviz.analysis.rollout(cap)
    matrix = figures.rollout_figure(cap, flow)
    assert [MARK in t for t in matrix.layout.xaxis.ticktext] == [False] * 7 + [True] * 6
    assert [(s.x0, s.y0) for s in matrix.layout.shapes] == [(6.5, 0), (0, 6.5)]
    assert f"— {MARK} generated" in matrix.layout.title.text
    row = figures.rollout_figure(cap, flow, query=9)
    assert [MARK in t for t in row.layout.xaxis.ticktext] == [False] * 7 + [True] * 6 and len(row.layout.shapes) == 1
    blocks = figures.rollout_figure(cap, attnviz.analysis.rollout_blocks(cap, 4))  # 4 tokens a cell: 7 → 1.25
    assert [s.x0 for s in blocks.layout.shapes if s.x0 == s.x1] == [7 / 4 - 0.5]
    assert [MARK in t for t in blocks.layout.xaxis.ticktext] == [False, False, True, True]  # cells from 0, 4, 8, 12
    pooled = figures.overview_figure(cap, 1, 2, size=4)  # blocks of 4 tokens: token 7 is ¾ into the second
    assert [s.x0 for s in pooled.layout.shapes if s.x0 == s.x1] == [1 + 3 / 4 - 0.5]
    assert f"{MARK} generated from token 7" in pooled.layout.title.text
    exact = figures.window_figure(cap, 1, 2, (4, 13), (0, 13))
    assert [(s.x0, s.y0) for s in exact.layout.shapes] == [(6.5, 0), (0, 2.5)]  # rows from 4: token 7 is row 3


def test_mark_new_false_draws_a_generation_unmarked(gen):
    cap = gen.capture
    flow = attnviz.analysis.rollout(cap)
    drawn = {
        "heatmap": lambda **kw: figures.heatmap(cap, 1, 2, **kw),
        "words": lambda **kw: figures.heatmap(cap, 1, 2, words=True, **kw),
        "query_row": lambda **kw: figures.query_row(cap, 1, 2, 9, **kw),
        "head_view": lambda **kw: figures.head_view(cap, 1, [0, 1], **kw),
        "model_view": lambda **kw: figures.model_view(cap, **kw),
        "comparison": lambda **kw: figures.validation_comparison(cap, 1, 2, **kw),
        "rollout": lambda **kw: figures.rollout_figure(cap, flow, **kw),
        "rollout row": lambda **kw: figures.rollout_figure(cap, flow, query=9, **kw),
        "overview": lambda **kw: figures.overview_figure(cap, 1, 2, size=4, **kw),
        "window": lambda **kw: figures.window_figure(cap, 1, 2, (4, 13), (0, 13), **kw),
    }

    def marks(fig) -> tuple:
        texts = [*(fig.layout.xaxis.ticktext or ()), *(fig.layout.yaxis.ticktext or ())]
        texts += [t for trace in fig.data if getattr(trace, "text", None) is not None for t in trace.text]
        lines = [s for s in fig.layout.shapes if s.type == "line"]
        return MARK in fig.layout.title.text, any(MARK in t for t in texts), len(lines)

    for name, draw in drawn.items():
        assert marks(draw())[0] and marks(draw())[2] > 0, name
        assert marks(draw(mark_new=False)) == (False, False, 0), name


def test_step_figure_draws_the_generation_s_own_rows(gen):
    step = gen.step(2)
    fig = step_figure(gen, step, 1, 3)
    chosen_head, chosen_mean, own_head, own_mean = fig.data
    assert chosen_head.y.tolist() == pytest.approx(step.chosen_by[1, 3].tolist(), abs=1e-5)
    assert chosen_mean.y.tolist() == pytest.approx(step.chosen_by[1].mean(0).tolist(), abs=1e-5)
    assert own_head.y.tolist() == pytest.approx(step.weights[1, 3].tolist(), abs=1e-5)
    assert own_mean.y.tolist() == pytest.approx(step.weights[1].mean(0).tolist(), abs=1e-5)
    assert len(own_head.x) == step.position + 1 == 10
    assert own_head.y[-1] > 0 and chosen_head.y[-1] == 0  # the chooser cannot see the token it chose
    # the recorded rows are the capture's own attention rows
    assert own_head.y.tolist() == pytest.approx(gen.capture.attention(1, 3)[9, :10].tolist(), abs=1e-5)
    assert chosen_head.y.tolist() == pytest.approx(gen.capture.attention(1, 3)[8, :10].tolist(), abs=1e-5)
    labels = gen.capture.token_labels
    assert "Step 2 of 0…5" in fig.layout.title.text and repr(labels[9]) in fig.layout.title.text
    summary = step_summary(gen, step, 1, 3)
    top = labels[int(step.chosen_by[1, 3].argmax())]
    assert summary.startswith(f"Step 2: the model wrote {MARK}{labels[9]!r} (position 9). Choosing it, {labels[8]!r}")
    assert f"looked most at {top!r} {float(step.chosen_by[1, 3].max()):.2f} at L1·H3" in summary
    with pytest.raises(attnviz.InputError, match="head 9 is out of range: heads 0..3"):
        step_figure(gen, step, 1, 9)
    with pytest.raises(attnviz.InputError, match=r"layer 5 was not captured; captured layers: \[0, 1\]"):
        step_summary(gen, step, 5, 0)


def test_step_marks_are_thinned_and_end_on_the_last_step():
    assert step_marks(1) == {0: "0"}
    assert list(step_marks(6)) == [0, 1, 2, 3, 4, 5]
    assert list(step_marks(20)) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 19]
    assert list(step_marks(512)) == list(range(0, 512, 47)) + [511]
    assert all(len(step_marks(n)) <= 12 for n in range(1, 600))


def test_chip_roles_new_token_count_and_status():
    assert token_roles(3, 4, None, None) == []
    assert token_roles(3, 4, 7, 9) == []
    assert token_roles(6, 8, 7, 9) == ["generated"]  # a word across the prompt's end holds a new token
    assert token_roles(10, 11, 7, 9) == ["generated", "later"]
    assert checked_new_tokens(20) == 20 and checked_new_tokens(3.0) == 3
    for bad in (None, "5", 2.5, True):
        with pytest.raises(attnviz.InputError, match="Type a whole number from 1 to 512"):
            checked_new_tokens(bad)
    for bad in (0, -3, 513):
        with pytest.raises(attnviz.InputError, match="the page generates from 1 to 512"):
            checked_new_tokens(bad)


def test_generation_status_quotes_the_continuation(gen):
    status = generation_status(gen)
    assert status == f"generated 6 new tokens: “{gen.text}” — 7 prompt + 6 new {MARK} in every view; "
    info = gen.info
    long = attnviz.Capture.of(gen.sequence, gen.capture.records, {**gen.capture.model})
    long.model["generation"] = {**info, "text": "x" * 400, "stopped": "eos"}
    assert "stopped at the end-of-text token: “" + "x" * 300 + "…”" in generation_status(attnviz.Generation.of(long))
    assert gen.info is info
