"""A long text in words (issue #56): the model view's word thumbnails come from the one fused job (no job of
their own), equal to ``cap.attention(layer, words=True)`` pooled on every cell drawn, at 4,096 tokens in the
browser; meanwhile the page's other views answer. A background job runs at the lowest priority of its
thread and OpenMP's, and stops when its page shows another capture (``Jobs.shown``) — a corpus job the
page embeds is left alone."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from attnviz.dashboard import background, create_app
from attnviz.dashboard.ids import ID
from attnviz.dashboard.jobs import JOB_NICE, Jobs, lower_priority
from test_dashboard import no_console_errors, open_tab, poll, wait_status
from test_dashboard_jobs import Steps, finish, wait_for
from test_dashboard_long import set_text
from test_dashboard_view_jobs import Gate, bar_text, figure_title

import attnviz

N = 4096  # the long_text fixture's tokens (conftest)
LINUX = os.uname().sysname == "Linux"


def nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


# ---------------------------------------------------------------- the jobs, without a browser
@pytest.mark.skipif(not LINUX, reason="a thread's own nice is Linux's")
def test_a_job_computes_at_the_lowest_priority_and_the_server_does_not():
    jobs = Jobs(workers=1)
    seen: dict[str, int] = {}

    def work(progress):
        seen["job"] = nice_of_this_thread()
        # a thread the job starts (OpenMP's team, torch's) inherits it
        inner = threading.Thread(target=lambda: seen.setdefault("started by it", nice_of_this_thread()))
        inner.start()
        inner.join()

    before = nice_of_this_thread()
    jobs.ask(("capture", "summary"), "page", "a summary", work)
    finish(jobs, "page")
    assert seen == {"job": max(before, JOB_NICE), "started by it": max(before, JOB_NICE)}
    assert nice_of_this_thread() == before  # the server's threads keep theirs
    assert JOB_NICE == 19


def test_lower_priority_is_refused_quietly_where_a_thread_has_no_nice_of_its_own(monkeypatch):
    monkeypatch.setattr("sys.platform", "darwin")  # setpriority there would lower the whole server
    called = []
    monkeypatch.setattr(os, "setpriority", lambda *args: called.append(args))
    assert lower_priority() is False and not called


def test_a_page_that_shows_another_capture_stops_its_jobs_of_the_one_it_left():
    jobs = Jobs(workers=3)
    summary, corpus, other_page = Steps(), Steps(), Steps()
    jobs.shown("page", "A")
    jobs.ask(("A", "summary", "decoder"), "page", "the summary of A", summary)
    jobs.ask(("corpus\x00smollm2\x00True", "captures", 3), "page", "the corpus at layer 3", corpus)
    jobs.ask(("A", "rollout row", "decoder", (5,)), "page 2", "the query's rollout row", other_page)
    wait_for(lambda: summary.runs == corpus.runs == other_page.runs == 1)
    assert jobs.shown("page", "A") == []  # the same capture again: nothing changes

    left = jobs.shown("page", "B")  # the page ran another text
    assert [job.key for job in left] == [("A", "summary", "decoder")]
    summary.go(3)  # it stops at its next step: nobody watches it
    wait_for(lambda: jobs.get(("A", "summary", "decoder")) is None)
    assert summary.finished == 0 and left[0].state == "cancelled"
    # the corpus the page embeds goes on, and another page's job of A too
    assert {job.key[0] for job in jobs.of_page("page")} == {"corpus\x00smollm2\x00True"}
    assert not jobs.stopped("page")  # left, not cancelled: coming back to A asks again as a first visit
    corpus.go(4)
    other_page.go(4)
    finish(jobs, "page")
    finish(jobs, "page 2")
    assert corpus.finished == other_page.finished == 1

    again = Steps(1)
    jobs.shown("page", "A")
    jobs.ask(("A", "summary", "decoder"), "page", "the summary of A", again)
    again.go(2)
    finish(jobs, "page")
    assert again.finished == 1


def test_on_screen_tells_the_jobs_which_capture_the_page_shows():
    class Held:
        jobs = Jobs(workers=1)

    captures = Held()
    steps = Steps()
    background.on_screen(captures, {"key": "A"}, "page")
    captures.jobs.ask(("A", "summary", None), "page", "the summary", steps)
    wait_for(lambda: steps.runs == 1)
    background.on_screen(captures, {"key": "A"}, None)  # no page id: nothing
    background.on_screen(captures, {"key": "B"}, "page")
    steps.go(3)
    wait_for(lambda: captures.jobs.get(("A", "summary", None)) is None)
    assert steps.finished == 0


# ---------------------------------------------------------------- the browser, at 4,096 tokens in words
def shown_mosaic(dash_duo) -> torch.Tensor:
    """The mosaic's cells as plotly drew them (its calcdata: decoded from the figure's typed arrays)."""
    z = dash_duo.driver.execute_script(
        f"const gd = document.querySelector('#{ID.model_view} .js-plotly-plot');"
        "return gd.calcdata[0][0].z.map((row) => Array.from(row, (v) => (v === undefined || Number.isNaN(v)) ? null : v));"
    )
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in z])


@pytest.mark.browser
@pytest.mark.slow
def test_a_long_text_in_words_draws_its_model_view_from_the_one_fused_job(
    dash_duo, monkeypatch, llama_folder, long_text
):
    gate = Gate()
    monkeypatch.setattr(background, "summarize", gate)
    dash_duo.start_server(create_app({llama_folder: "tiny Llama (8k positions)"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    open_tab(dash_duo, "Heatmap")
    dash_duo.find_elements(f"#{ID.words} input")[1].click()  # words
    set_text(dash_duo, ID.text, long_text)
    dash_duo.find_element(f"#{ID.run}").click()
    wait_status(dash_duo, f"{N + 1} tokens", timeout=120)

    # the model view in words: the one fused job (no job of the word thumbnails' own)
    open_tab(dash_duo, "Model view")
    poll(lambda: "layer 1 of 2" in bar_text(dash_duo), timeout=60)
    assert "Computing the model view, head statistics, rollout and validation" in bar_text(dash_duo)
    assert "word thumbnails" not in bar_text(dash_duo)
    # while it runs, another view answers at once: the AttentionLab's row, in words
    open_tab(dash_duo, "AttentionLab")
    t0 = time.monotonic()
    dash_duo.wait_for_contains_text(f"#{ID.lab_stats}", "query", timeout=30)
    lab_s = time.monotonic() - t0
    assert lab_s < 10, lab_s
    open_tab(dash_duo, "Model view")
    gate.open.set()
    poll(lambda: figure_title(dash_duo, ID.model_view).startswith("Model view: 2 layers"), timeout=120)
    assert gate.runs == 1

    # every cell drawn is the word map's, pooled: the same model and text captured here
    model, tokenizer = attnviz.load_model(llama_folder)
    cap = attnviz.capture(model, long_text, tokenizer=tokenizer, add_bos=True)
    assert cap.n_tokens == N + 1 and len(cap.words) < N
    shown = shown_mosaic(dash_duo)
    expected = attnviz.figures.model_view(
        cap,
        words=True,
        thumbnails={
            layer: torch.nn.functional.adaptive_max_pool2d(cap.attention(layer, words=True)[None], (24, 24))[0]
            for layer in cap.layer_indices()
        },
    )
    want = torch.as_tensor(expected.data[0].z, dtype=torch.float32)
    assert shown.shape == want.shape == (2 * 25 - 1, len(cap.kept_heads()) * 25 - 1)
    torch.testing.assert_close(shown, want, atol=1e-3, rtol=0, equal_nan=True)  # the figure rounds to 3 decimals
    no_console_errors(dash_duo)
