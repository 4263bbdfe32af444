"""The top of the page: model, text, "Run model" / "Generate", and the part, layer, head and units
every view reads — with the callbacks that run the model and fill those selectors.

A text whose capture the server holds already opens at once (the cache, and the opening head
memoised per capture and query). A short text is captured inside the request. A long one —
more than ``background_from`` tokens, or a generation of more than ``BACKGROUND_NEW_TOKENS`` new
tokens — is captured by a Dash background job in another process (the app's diskcache manager),
with a progress bar and a Cancel button while the rest of the page stays usable (``run_job``): the job
writes the capture with ``Capture.save`` into the server's capture folder and hands back the request;
the page then adopts the file into the server's cache and fills it as for a short text. What a run sets
on the page, and the status line's words, are ``run_outputs``'.
"""

from __future__ import annotations

import time

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update, set_props

import attnviz

from . import opening, run_job
from .captures import FILE_PREFIX, Captures, is_encoder_decoder, wants_bos
from .errors import shows_errors
from .ids import GID, ID
from .panels import slot_panels
from .registry import View, registers
from .run_job import HIDDEN as _HIDDEN
from .run_job import job_text
from .run_outputs import (
    ALREADY_CAPTURED,
    VIEW_OUTPUTS,
    checked_new_tokens,
    failed,
    generation_status,
    opened,
    status_line,
)
from .ui import field
from .url_state import link_opens_a_view

__all__ = [  # the run's pure helpers live in run_outputs and run_job; tests and older imports read them here
    "checked_new_tokens",
    "generation_status",
    "job_text",
    "layout",
    "message",
    "register",
    "selectors",
    "status_line",
]


# ---------------------------------------------------------------- layout
def layout(model_options: list[dict], default_model: str, default_text: str, examples: dict, *, bos: bool) -> list:
    """The side panel: model, example, text (and target), the run controls, the background job's progress
    and the status line."""
    return [
        dcc.Store(id=ID.store),
        dcc.Store(id=ID.job),
        dcc.Store(id=ID.job_done),
        dcc.Interval(id=ID.job_watch, interval=1000, disabled=True),
        field(
            "Model",
            dcc.Dropdown(id=ID.model, options=model_options, value=default_model, clearable=False),
            "The model whose attention the page shows. The page loads only the models it was started with.",
        ),
        field(
            "Example",
            dcc.Dropdown(
                id=ID.example,
                options=[{"label": v, "value": k} for k, v in examples.items()],
                placeholder="pick an example sentence…",
            ),
            "Puts an example sentence in the text box (a pronoun and what it refers to, or a long text).",
        ),
        field(
            "Text",
            dcc.Textarea(id=ID.text, value=default_text, className="av-text"),
            "The text the model reads; press Run model to capture its attention.",
        ),
        html.Div(
            id=ID.target_box,
            style={"display": "none"},
            children=[
                field(
                    "Target (decoder)",
                    dcc.Textarea(id=ID.target, value="", className="av-text av-text-short"),
                    "The decoder's text, teacher-forced. Empty: the decoder reads its start token only.",
                )
            ],
        ),
        html.Div(
            dcc.Checklist(
                id=ID.bos,
                value=["bos"] if bos else [],
                className="av-check",
                options=[{"label": " prepend BOS (decoders park their attention sink there)", "value": "bos"}],
            ),
            title="Put the model's beginning-of-sequence token before the text",
        ),
        html.Div(
            [
                html.Button(
                    "Run model",
                    id=ID.run,
                    n_clicks=0,
                    className="av-button av-primary",
                    title="Run the model on the text once and capture Q, K and V for every view",
                ),
                html.Button("Cancel", id=ID.job_cancel, n_clicks=0, style=_HIDDEN, className="av-button"),
            ],
            className="av-row",
        ),
        html.Div(id=ID.model_hint, className="av-dim", role="status"),
        *slot_panels("run", "generate"),  # "Continue the text" (generation_view)
        html.Progress(id=ID.job_progress, value="0", max="1", style=_HIDDEN),
        html.Div(id=ID.job_progress_text, className="av-dim"),
        dcc.Loading(html.Div(id=ID.status, className="av-status"), type="dot"),
    ]


def message() -> html.Div:
    """What went wrong (bad input, a file that did not open): above the views, red, hidden when empty."""
    return html.Div(id=ID.message, role="alert", className="av-message")


def selectors() -> list:
    """Part (encoder-decoders), layer, head and units: what every view reads."""
    return [
        field(
            "Part",
            dcc.Dropdown(id=ID.part, clearable=False, style={"width": "230px"}),
            "Which attention of an encoder-decoder: encoder (source × source), decoder (target × target, "
            "causal) or cross (target × source)",
            id=ID.part_box,
            style={"display": "none"},
        ),
        field(
            "Layer",
            dcc.Dropdown(id=ID.layer, clearable=False, style={"width": "96px"}),
            "The layer every view shows (0-based). Clicking a head in the Model view also picks it.",
        ),
        field(
            "Head",
            dcc.Dropdown(id=ID.head, clearable=False, style={"width": "96px"}),
            "The attention head every view shows (0-based).",
        ),
        field(
            "Units",
            dcc.RadioItems(
                id=ID.words,
                value=opening.UNITS,
                inline=True,
                className="av-radio",
                options=[{"label": " tokens", "value": "tokens"}, {"label": " words", "value": "words"}],
            ),
            "tokens: the model's own pieces. words: attention to a word is summed over its pieces, "
            "attention from a word averaged over them.",
        ),
        field(
            "Show",
            dcc.RadioItems(
                id=ID.measure,
                value="weights",
                inline=True,
                className="av-radio",
                options=[
                    {"label": " weights", "value": "weights"},
                    {"label": " moved", "value": "moved"},
                ],
            ),
            "weights: where each query looks (α). moved: what the head moves, ‖α·f(x)‖ — how much of its "
            "output comes from each key, with f(x) = W_O·v (Kobayashi et al. 2020): a high weight on a key whose "
            "value the head barely projects moves little.",
        ),
    ]


# ---------------------------------------------------------------- callbacks
def register(app: Dash, captures: Captures, *, startup_error: str = "") -> None:
    """The run callbacks. ``startup_error`` is shown when the page opens (a capture or statistics file
    that did not open); texts of more than ``captures.background_from`` tokens are captured in a
    background job."""
    models = captures.models

    # The message line is about the last thing done: opening another tab is something else, so it goes (a
    # reviewer read "How many new tokens? …" above a coreference test that had run well). A view that
    # fails on the new tab says so again.
    app.clientside_callback(
        "(_tab) => ''",
        Output(ID.message, "children", allow_duplicate=True),
        Input(ID.tabs, "value"),
        prevent_initial_call=True,
    )

    # Picking another model changes nothing until Run model: the line under the button says so.
    app.clientside_callback(
        """(model, store, options) => {
            if (!store || !store.model || store.model === model) { return ""; }
            const label = (value) => (options.find((o) => o.value === value) || {label: value}).label;
            const shown = store.model.startsWith("FILE") ? "a capture file" : label(store.model) + "'s capture";
            return "The views show " + shown + ": press Run model to read the text with " + label(model) + ".";
        }""".replace("FILE", FILE_PREFIX),
        Output(ID.model_hint, "children"),
        Input(ID.model, "value"),
        Input(ID.store, "data"),
        State(ID.model, "options"),
    )

    @app.callback(Output(ID.target_box, "style"), Input(ID.model, "value"))
    @shows_errors(lambda _m: {"display": "none"})
    def show_target(model):
        return {"display": "block"} if model in models and is_encoder_decoder(model) else {"display": "none"}

    @app.callback(Output(ID.bos, "value"), Input(ID.model, "value"), prevent_initial_call=True)
    @shows_errors()
    def default_bos(model):
        return ["bos"] if model in models and wants_bos(model) else []

    @app.callback(Output(ID.text, "value"), Input(ID.example, "value"), prevent_initial_call=True)
    def use_example(example):
        return example if example else no_update

    @app.callback(
        *[Output(i, prop) for i, prop in VIEW_OUTPUTS],
        Output(GID.progress, "children"),
        Output(ID.job, "data"),
        Input(ID.run, "n_clicks"),
        Input(GID.generate, "n_clicks"),
        State(ID.text, "value"),
        State(ID.model, "value"),
        State(ID.bos, "value"),
        State(ID.target, "value"),
        State(GID.new_tokens, "value"),
        State(ID.job_cancel, "n_clicks"),
        running=[(Output(ID.run, "disabled"), True, False), (Output(GID.generate, "disabled"), True, False)],
    )
    @shows_errors(lambda m: (*failed(m), "", no_update))
    def run_model(_clicks, _generate_clicks, text, model, bos_switch, target, new_tokens, cancels):
        if startup_error and not ctx.triggered_id:
            return (*failed(startup_error), "", no_update)
        if not ctx.triggered_id and link_opens_a_view():  # the address names a view: url_state opens it
            return (*failed(""), "", no_update)
        generate = ctx.triggered_id == GID.generate
        if not isinstance(text, str) or not text.strip():
            raise attnviz.EmptyTextError("The text is empty: type a sentence or pick an example.")
        bos = "bos" in (bos_switch or [])
        target = target.strip() if isinstance(target, str) and target.strip() else None
        new_tokens, target = (checked_new_tokens(new_tokens), None) if generate else (None, target)
        captures.check_model(model)
        target = target if target is not None and is_encoder_decoder(model) else None  # one key per capture
        key = captures.key(model, text, bos, target, new_tokens)
        store = {"key": key, "model": model, "bos": bos}  # the page names its capture; the text stays here
        if new_tokens:
            store["generate"] = new_tokens
        cap = captures.cached(key)
        if cap is None:
            request = captures.request(model, text, bos, target, new_tokens)  # the one tokenization
            if captures.long_job(request, captures.background_from):
                run = captures.leave_request(request)
                # a fresh request, even for a cancelled job's text; the Cancel clicks so far (watch_job)
                job = {**store, "job": time.time(), "run": run, "cancels": cancels or 0}
                set_props(ID.job_watch, {"disabled": False})  # watch_job: a job that dies is a message
                return (*failed(""), "", job)
            cap = captures.run(request)
        elif ctx.triggered_id is not None:  # pressed for a text the server holds: say why nothing seemed to run
            return (*opened(captures, store, cap, message=ALREADY_CAPTURED), "", no_update)
        return (*opened(captures, store, cap), "", no_update)

    run_job.register(app, captures)  # a long text's capture: a background job

    @app.callback(
        Output(ID.layer, "options", allow_duplicate=True),
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "options", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.heads_multi, "options", allow_duplicate=True),
        Output(ID.heads_multi, "value", allow_duplicate=True),
        Input(ID.part, "value"),
        State(ID.store, "data"),
        State(ID.layer, "options"),
        State(ID.layer, "value"),
        State(ID.head, "options"),
        State(ID.head, "value"),
        State(ID.heads_multi, "options"),
        State(ID.heads_multi, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda _m: no_update)  # the run callback reports a capture that fails
    def choose_part(part, store, *shown):
        cap = captures.from_store(store)
        if cap is None or part not in cap.parts:
            return no_update
        _, layer, _, head, _, heads = shown
        layers, kept = cap.layer_indices(part), cap.kept_heads(part)  # only the heads kept, by the model's numbers
        head = head if head in kept else kept[0]
        chosen = (
            [{"label": f"L{i}", "value": i} for i in layers],
            layer if layer in layers else layers[0],
            [{"label": f"H{h}", "value": h} for h in kept],
            head,
            [{"label": f"H{h} ", "value": h} for h in kept],
            [h for h in (heads or [head]) if h in kept] or [head],
        )
        # only what changes: a run sets the part together with its selectors, and setting them again
        # would make every view that reads them draw twice
        return tuple(no_update if new == old else new for new, old in zip(chosen, shown, strict=True))


registers(
    View(
        "run",
        None,
        order=0,
        register=lambda app, server: register(app, server.captures, startup_error=server.startup_error),
        slots=("generate",),
    )
)
