"""A long text's background jobs in the browser (#19): the model view shows its job's progress while the
rest of the page answers, Cancel stops it and says so, Compute starts it again, the one fused pass then
serves head statistics, rollout and the validation without another job; a view job's worker killed
mid-job, and a background capture's process killed mid-capture, leave the page usable with a message."""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
import time

import psutil
import pytest
from attnviz.dashboard import background, create_app
from attnviz.dashboard.ids import AID, ID
from test_dashboard import no_console_errors, open_tab, poll, show_heatmap_in_tokens, wait_status
from test_dashboard_long import set_text

import attnviz

N = 4096  # the long_text fixture's tokens (conftest)


class Gate:
    """``summarize`` slowed down: after each layer it waits until the test lets it go on, and it notes
    which thread it runs in and how often it ran."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.reached = threading.Event()
        self.threads: list[int] = []
        self.runs = 0
        self.ended = 0  # runs that returned or raised
        self.original = background.summarize

    def __call__(self, cap, *, on_progress=None, **kwargs):
        self.runs += 1
        self.threads.append(threading.get_ident())

        def slowed(done: int, total: int) -> None:
            on_progress(done, total)  # the job's progress (it stops a cancelled job here)
            self.reached.set()
            assert self.open.wait(timeout=120)

        try:
            return self.original(cap, on_progress=slowed, **kwargs)
        finally:
            self.ended += 1


def bar_text(dash_duo) -> str:
    return dash_duo.find_element(f"#{ID.view_job_text}").text


def figure_title(dash_duo, graph_id: str) -> str:
    """A figure's title, or the message a message figure carries (its one annotation)."""
    return (
        dash_duo.driver.execute_script(
            f"const gd = document.querySelector('#{graph_id} .js-plotly-plot'); if (!gd || !gd.layout) return '';"
            "const notes = gd.layout.annotations || [];"
            "return (gd.layout.title && gd.layout.title.text) || (notes.length ? notes[0].text : '');"
        )
        or ""
    )


def open_long_text(dash_duo, monkeypatch, llama_folder: str, long_text: str) -> Gate:
    """Serve the tiny 8k Llama with ``summarize`` gated, and run the long text (a background capture)."""
    gate = Gate()
    monkeypatch.setattr(background, "summarize", gate)
    dash_duo.start_server(create_app({llama_folder: "tiny Llama (8k positions)"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    set_text(dash_duo, ID.text, long_text)
    dash_duo.find_element(f"#{ID.run}").click()
    wait_status(dash_duo, f"{N + 1} tokens", timeout=120)
    return gate


@pytest.mark.browser
def test_a_long_texts_model_view_is_a_job_with_progress_cancel_and_compute(
    dash_duo, monkeypatch, llama_folder, long_text
):
    gate = open_long_text(dash_duo, monkeypatch, llama_folder, long_text)

    # the model view: the job starts, the bar shows its progress, the view says it is computing
    open_tab(dash_duo, "Model view")
    poll(lambda: "layer 1 of 2" in bar_text(dash_duo), timeout=60)
    assert "Computing the model view, head statistics, rollout and validation" in bar_text(dash_duo)
    assert dash_duo.find_element(f"#{ID.view_job_cancel}").is_displayed()
    assert "in the background" in figure_title(dash_duo, ID.model_view)
    # the page answers meanwhile
    open_tab(dash_duo, "Shapes & cost")
    dash_duo.wait_for_contains_text(f"#{ID.cost}", "Shapes (one layer)", timeout=30)
    open_tab(dash_duo, "Model view")

    # Cancel: the bar and the view say so; the job stops at its next layer
    dash_duo.find_element(f"#{ID.view_job_cancel}").click()
    poll(lambda: bar_text(dash_duo).startswith("Cancelled: the model view"), timeout=30)
    assert dash_duo.find_element(f"#{ID.view_job_start}").is_displayed()
    poll(lambda: figure_title(dash_duo, ID.model_view).startswith("Cancelled"), timeout=30)
    gate.open.set()
    poll(lambda: gate.ended == 1, timeout=60)  # it stopped at its next layer
    # another heavy view does not start it behind the user's back
    open_tab(dash_duo, "Head statistics")
    poll(lambda: figure_title(dash_duo, AID.stats_map).startswith("Cancelled"), timeout=30)
    assert gate.runs == 1

    # Compute: the job runs again and the view draws the mosaic
    gate.open.clear()
    open_tab(dash_duo, "Model view")
    dash_duo.find_element(f"#{ID.view_job_start}").click()
    poll(lambda: gate.runs == 2 and "layer 1 of 2" in bar_text(dash_duo), timeout=60)
    gate.open.set()
    poll(lambda: figure_title(dash_duo, ID.model_view).startswith("Model view: 2 layers"), timeout=60)
    poll(lambda: not dash_duo.find_element(f"#{ID.view_job}").is_displayed(), timeout=10)

    # the same pass serves head statistics, rollout and the validation: no other job
    open_tab(dash_duo, "Head statistics")
    poll(lambda: figure_title(dash_duo, AID.stats_map) and "Cancelled" not in figure_title(dash_duo, AID.stats_map))
    open_tab(dash_duo, "Rollout")
    dash_duo.wait_for_contains_text(f"#{AID.rollout_graph} .gtitle", "a block of 9×9 tokens", timeout=60)
    open_tab(dash_duo, "Recomputed vs model")
    dash_duo.wait_for_contains_text(f"#{ID.validation_summary}", "PASS", timeout=60)
    assert gate.runs == 2
    assert not dash_duo.find_element(f"#{ID.message}").text
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_a_worker_killed_mid_job_leaves_the_page_usable_with_a_message(dash_duo, monkeypatch, llama_folder, long_text):
    gate = open_long_text(dash_duo, monkeypatch, llama_folder, long_text)
    open_tab(dash_duo, "Rollout")
    assert gate.reached.wait(timeout=60)
    # kill the worker thread where it waits (an exception raised in it from outside)
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(gate.threads[0]), ctypes.py_object(SystemExit))
    gate.open.set()
    # 60 s: the page's poll and redraw, on two cores that the rest of the suite keeps busy
    poll(
        lambda: "stopped before it finished (its thread was ended)" in figure_title(dash_duo, AID.rollout_graph),
        timeout=60,
    )
    poll(lambda: "Press Compute" in bar_text(dash_duo), timeout=30)
    open_tab(dash_duo, "Shapes & cost")  # the page is usable
    dash_duo.wait_for_contains_text(f"#{ID.cost}", "Shapes (one layer)", timeout=30)
    open_tab(dash_duo, "Rollout")
    dash_duo.find_element(f"#{ID.view_job_start}").click()
    dash_duo.wait_for_contains_text(f"#{AID.rollout_graph} .gtitle", "a block of 9×9 tokens", timeout=60)
    assert gate.runs == 2
    no_console_errors(dash_duo)


@pytest.mark.browser
def test_a_background_capture_whose_process_is_killed_is_a_message_and_leaves_no_files(
    dash_duo, monkeypatch, tmp_path, llama_folder, long_text
):
    """The capture job is a forked process (Dash's background callback): SIGKILL it mid-capture, as the
    kernel's OOM killer would — the page says so, keeps the last capture, and the job's files go."""
    # this test's own temporary folder: the other pytest worker's pages make capture folders at the same time
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = os.getpid()
    original = attnviz.capture

    def capture(model, *args, **kwargs):  # in the job (a fork of this process): the first layer hangs
        if os.getpid() != server:
            attnviz.load_model(model)[0].model.layers[0].register_forward_hook(lambda *_: time.sleep(300))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(attnviz, "capture", capture)
    dash_duo.start_server(create_app({llama_folder: "tiny Llama (8k positions)"}, default_model=llama_folder))
    wait_status(dash_duo, "tokens")
    show_heatmap_in_tokens(dash_duo)
    opening = dash_duo.find_element(f"#{ID.status}").text
    [folder] = tmp_path.glob("attnviz-captures-*")
    set_text(dash_duo, ID.text, long_text)
    dash_duo.find_element(f"#{ID.run}").click()
    dash_duo.wait_for_contains_text(f"#{ID.job_progress_text}", "Capturing in the background: layer", 60)
    [pid_file] = folder.glob("*.job.pid")
    job = psutil.Process(int(pid_file.read_text()))
    assert job.ppid() == server
    job.kill()
    dash_duo.wait_for_contains_text(f"#{ID.message}", "The background capture stopped before it finished", 30)
    poll(lambda: dash_duo.find_element(f"#{ID.run}").is_enabled(), timeout=30)
    assert dash_duo.find_element(f"#{ID.status}").text == opening  # the last capture is still shown
    assert sorted(p.name for p in folder.iterdir()) == []  # no request, pid or half-written file left
    open_tab(dash_duo, "Shapes & cost")  # the page is usable
    dash_duo.wait_for_contains_text(f"#{ID.cost}", "Shapes (one layer)", timeout=30)
    no_console_errors(dash_duo)
