"""A long text's capture as a Dash background job (another process, the app's diskcache manager), with a
progress bar and a Cancel button while the rest of the page stays usable: the job captures the request the
Run left in the server's capture folder (``Captures.save_for_server``, its progress attnviz's
``on_progress``), and the page then opens the capture as a short text's (``run_outputs.opened``); a job whose
process dies is a message."""

from __future__ import annotations

from dash import Dash, Input, Output, State, no_update

import attnviz

from .captures import Captures
from .errors import shows_errors
from .ids import GID, ID
from .run_outputs import VIEW_OUTPUTS, failed, opened

SHOWN = {"display": "inline-block"}
HIDDEN = {"display": "none"}


def job_text(done: int, layers: int, new_tokens: int | None) -> str:
    """The background job's progress line, from the attention calls recorded so far (``layers``: one forward's)."""
    if not layers:
        return "starting…"
    if new_tokens:
        return f"new token {min(done // layers + 1, new_tokens)} of {new_tokens}"
    if done >= layers:
        return f"layer {layers} of {layers} — checking and saving the capture…"
    return f"layer {done + 1} of {layers}"


def register(app: Dash, captures: Captures) -> None:
    """The background capture's callbacks: the job, its watch, and the page's opening of what it left."""

    @app.callback(
        *[Output(i, prop, allow_duplicate=True) for i, prop in VIEW_OUTPUTS],
        Input(ID.job_done, "data"),
        prevent_initial_call=True,
    )
    @shows_errors(failed)
    def finish_job(done):
        """A background job left the capture in the server's folder: open it as run_model does."""
        if not done or done.get("error"):
            return failed((done or {}).get("error", ""))
        store = {k: v for k, v in done.items() if k not in ("job", "run", "cancels")}
        return opened(captures, store, captures.from_store(store))

    @app.callback(
        Output(ID.job_watch, "disabled"),
        Output(ID.message, "children", allow_duplicate=True),
        Input(ID.job_watch, "n_intervals"),
        State(ID.job, "data"),
        State(ID.job_cancel, "n_clicks"),
        prevent_initial_call=True,
    )
    def watch_job(_n, watched, cancels):
        """While a background capture runs: if its process ends without a capture, and not by Cancel
        (killed, out of memory), the page says so; what it left on disk goes."""
        if not watched:
            return True, no_update
        try:  # the page may send anything: a key this server did not start a job for is a message
            state = captures.job_state(watched.get("key") if isinstance(watched, dict) else None)
        except attnviz.AttnvizError as err:
            return True, str(err)
        if state in ("running", "starting"):
            return False, no_update
        if state == "done":
            return True, no_update
        captures.clean_job(watched["key"])
        if (cancels or 0) > watched["cancels"]:
            return True, no_update  # Cancel: the page shows the last capture, as it said it would
        return True, (
            "The background capture stopped before it finished: its process ended (killed, or out of memory?). "
            "The page still shows the last capture; press Run model to try again."
        )

    def job_failed(message: str) -> dict:
        return {"error": message}

    @app.callback(
        Output(ID.job_done, "data"),
        Input(ID.job, "data"),
        prevent_initial_call=True,
        background=True,  # thousands of tokens take tens of seconds: a job beside the server
        interval=300,
        running=[
            (Output(ID.run, "disabled"), True, False),
            (Output(GID.generate, "disabled"), True, False),
            (Output(ID.job_cancel, "style"), SHOWN, HIDDEN),
            (Output(ID.job_progress, "style"), SHOWN, HIDDEN),
            (Output(ID.job_progress_text, "style"), {"display": "block"}, HIDDEN),
        ],
        cancel=[Input(ID.job_cancel, "n_clicks")],
        progress=[
            Output(ID.job_progress, "value"),
            Output(ID.job_progress, "max"),
            Output(ID.job_progress_text, "children"),
        ],
    )
    @shows_errors(job_failed)
    def capture_job(set_progress, request):
        if not request:
            return no_update
        new_tokens = request.get("generate")
        shown = [""]

        def progress(done: int, total: int) -> None:  # attnviz's on_progress: attention calls recorded so far
            # a generation's total counts the prompt's forward and one per new token
            layers = total // (new_tokens + 1) if new_tokens else total
            text = job_text(done, layers, new_tokens)
            if text != shown[0]:  # one write per layer (per new token for a generation)
                shown[0] = text
                set_progress((str(min(done, total)), str(total), f"Capturing in the background: {text}"))

        set_progress(("0", "1", "Capturing in the background: starting…"))
        captures.save_for_server(request["key"], request["run"], progress)
        return request
