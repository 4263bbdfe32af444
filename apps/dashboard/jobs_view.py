"""The job bar: the progress of this page's background jobs for the heavy views of a long text, with
Cancel and, after a cancel or a failure, Compute.

A heavy view (model view, head statistics, rollout, validation) asks for its result through
:mod:`.background`; for a long text that starts or joins a job (:mod:`.jobs`), and the bar appears
and its poll starts. The poll reads this page's jobs every
``POLL_MS``: their progress fills the bar; when one finishes, ``view_job_done`` changes and every heavy
view draws again (the visible one finds its result in the cache, or the job's message). Cancel stops
this page's jobs (another page's view of the same capture goes on); Compute lets the views start them
again. The rest of the page stays usable all along: the jobs run beside the request threads.
"""

from __future__ import annotations

import time

from dash import Dash, Input, Output, State, dcc, html, no_update

from .background import BAR, HIDDEN, SHOWN
from .captures import Captures
from .ids import ID
from .registry import View, registers

# once a second: each poll's answer costs the browser's Dash renderer ~0.1 s of its main thread on a long
# text's page (measured at 4,096 tokens, whatever the answer holds), and in the load bench the browser
# shares the server's cores — twice a second took ~0.3 of a core from the fused pass (docs/benchmarks.md)
POLL_MS = 1000


def layout(page: str) -> list:
    """The page's id (made per page load), the bar (hidden until a job runs), its poll and its signal."""
    return [
        dcc.Store(id=ID.page, data=page),
        dcc.Store(id=ID.view_job_done),
        dcc.Interval(id=ID.view_job_poll, interval=POLL_MS, disabled=True),
        html.Div(
            id=ID.view_job,
            style=HIDDEN,
            children=[
                html.Span(id=ID.view_job_text, style={"color": "#333"}),
                html.Progress(id=ID.view_job_progress, value="0", max="1", style=SHOWN),
                html.Button("Cancel", id=ID.view_job_cancel, n_clicks=0, style=SHOWN),
                html.Button("Compute", id=ID.view_job_start, n_clicks=0, style=HIDDEN),
            ],
        ),
    ]


def register(app: Dash, captures: Captures) -> None:
    jobs = captures.jobs

    @app.callback(
        Output(ID.view_job, "style"),
        Output(ID.view_job_text, "children"),
        Output(ID.view_job_progress, "value"),
        Output(ID.view_job_progress, "max"),
        Output(ID.view_job_cancel, "style"),
        Output(ID.view_job_start, "style"),
        Output(ID.view_job_poll, "disabled"),
        Output(ID.view_job_done, "data"),
        Input(ID.view_job_poll, "n_intervals"),
        State(ID.page, "data"),
        prevent_initial_call=True,
    )
    def poll(_n, page):
        mine = jobs.of_page(str(page))
        waiting = [job for job in mine if not job.finished]
        finished = len(waiting) < len(mine)
        done = {"t": time.time()} if finished else no_update  # the views draw again
        if not waiting:
            stopped = jobs.stopped(str(page))  # cancelled or failed: what the page was told, and Compute
            style = {**BAR, "display": "block"} if stopped else HIDDEN
            return style, " ".join(stopped), "0", "1", HIDDEN, SHOWN if stopped else HIDDEN, True, done
        job = waiting[0]
        seconds = time.monotonic() - job.started
        more = f" (+{len(waiting) - 1} more)" if len(waiting) > 1 else ""
        text = (
            f"Computing {job.label} in the background: {job.text} — {seconds:.0f} s{more}. The other views stay usable."
        )
        return (
            {**BAR, "display": "block"},
            text,
            str(job.done),
            str(max(job.total, 1)),
            SHOWN,
            HIDDEN,
            False,
            done,
        )

    @app.callback(
        Output(ID.view_job, "style", allow_duplicate=True),
        Output(ID.view_job_text, "children", allow_duplicate=True),
        Output(ID.view_job_cancel, "style", allow_duplicate=True),
        Output(ID.view_job_start, "style", allow_duplicate=True),
        Output(ID.view_job_poll, "disabled", allow_duplicate=True),
        Output(ID.view_job_done, "data", allow_duplicate=True),
        Input(ID.view_job_cancel, "n_clicks"),
        State(ID.page, "data"),
        prevent_initial_call=True,
    )
    def cancel(_clicks, page):
        jobs.cancel(str(page))
        return (
            {**BAR, "display": "block"},
            " ".join(jobs.stopped(str(page))) or "Nothing was running.",
            HIDDEN,
            SHOWN,
            True,
            {"t": time.time(), "cancelled": True},
        )

    @app.callback(
        Output(ID.view_job, "style", allow_duplicate=True),
        Output(ID.view_job_done, "data", allow_duplicate=True),
        Input(ID.view_job_start, "n_clicks"),
        State(ID.page, "data"),
        prevent_initial_call=True,
    )
    def start_again(_clicks, page):
        jobs.restart(str(page))
        return HIDDEN, {"t": time.time()}  # the visible view asks again, and its job starts


registers(View("jobs", None, order=1, register=lambda app, server: register(app, server.captures)))
