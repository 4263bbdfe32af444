"""What the heavy views of a long text share: the capture's fused summary, any other result computed
in the background, and the job bar they show while it is computed (its callbacks: ``jobs_view``).

A heavy view asks :func:`summary_of` (the model view's thumbnails, head statistics, rollout and the
validation: one pass over every head, ``attnviz.analysis.summarize``) or :func:`in_background` (a
result of its own); up to the page's background threshold the result is computed in the request,
beyond it a job computes it (``Captures.in_background``) and the view gets None — it shows
:func:`pending`'s message while the bar shows the job's progress. A view tells :func:`on_screen` which
capture its page shows as it draws: the jobs of a capture the page left stop when no page watches them.
"""

from __future__ import annotations

from dash import set_props

from attnviz.analysis import summarize

from .captures import Captures
from .ids import ID

SHOWN = {"display": "inline-block", "marginLeft": "8px"}
HIDDEN = {"display": "none"}
BAR = {"margin": "6px 0", "padding": "4px 8px", "background": "#f4f6fa", "borderRadius": "4px"}
SUMMARY_LABEL = "the model view, head statistics, rollout and validation (one pass over every head)"


def show_bar(text: str) -> None:
    """From a heavy view's callback whose result is being computed: the bar shows, the poll starts."""
    set_props(ID.view_job, {"style": {**BAR, "display": "block"}})
    set_props(ID.view_job_text, {"children": text})
    set_props(ID.view_job_cancel, {"style": SHOWN})
    set_props(ID.view_job_start, {"style": HIDDEN})
    set_props(ID.view_job_poll, {"disabled": False})


def summary_of(captures: Captures, store: dict, page: str | None, part: str | None):
    """The fused summary (``attnviz.analysis.summarize``) of the store's capture and self-attention
    ``part``: what the model view, head statistics, rollout and the validation read, computed once per
    capture and part — in the request for a short text, else by a background job (None while it runs,
    the bar showing its progress)."""
    on_screen(captures, store, page)
    view = captures.self_part(store, part)
    if view is None:
        return None

    def compute(progress):
        return summarize(view, on_progress=lambda done, total: progress(done, total, f"layer {done} of {total}"))

    return in_background(captures, store, page, ("summary", part), SUMMARY_LABEL, view.n_tokens, compute)


def on_screen(captures: Captures, store: dict | None, page: str | None) -> None:
    """The page ``page`` shows the store's capture (``Jobs.shown``): when that is another capture than
    it showed, its jobs of the one it left stop watching it (and stop, when no other page watches them)."""
    if page is not None:
        captures.jobs.shown(str(page), (store or {}).get("key"))


def in_background(captures: Captures, store: dict, page: str | None, what: tuple, label: str, n_tokens: int, compute):
    """``Captures.in_background`` for a view's callback: None while the job runs (the bar shown)."""
    value = captures.in_background(store, str(page), what, label, n_tokens, compute)
    if value is None:
        show_bar(f"Computing {label} in the background…")
    return value


def pending(label: str = SUMMARY_LABEL) -> str:
    """What a heavy view says while its job runs."""
    return f"Computing {label} in the background — progress in the bar above; the other views stay usable."
