"""The model view: every layer × head as a thumbnail of its map (``attnviz.figures.model_view``, which
pools long texts a chunk of rows at a time and marks a generation's new tokens); a click opens that head
in the heatmap.

The thumbnails, in tokens and in words, come from the fused summary of the capture
(``background.summary_of``: one pass over every head shared with head statistics, rollout and the
validation, its chunks pooled into words beside the tokens) — for a long text a background job, with the
job bar's progress meanwhile. A cross-attention part and the thumbnails of what each head moves (the
page's "Show: moved" — ‖α·f(x)‖, ``measure="moved"``) are pooled by a job of their own
(``model_view_thumbnails``)."""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, no_update

from attnviz import figures
from attnviz.figures import message_figure

from .background import in_background, on_screen, pending, summary_of
from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID
from .registry import View, registers


def layout(graph_config: dict) -> list:
    return [dcc.Loading(dcc.Graph(id=ID.model_view, config=graph_config))]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(ID.model_view, "figure"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(ID.measure, "value"),
        Input(ID.view_job_done, "data"),
        State(ID.page, "data"),
    )
    @shows_errors(message_figure)
    def model_view(store, units, layer, head, tab, part, measure, _done, page):
        only_on(tab, "model")
        on_screen(captures, store, page)  # the jobs of a capture the page left stop
        cap = captures.from_store(store)
        if cap is None:
            return message_figure("Run the model to see its attention.")
        selected = (layer, head) if layer is not None and head is not None else None
        words = units == "words"
        part = cap.resolve_part(part if len(cap.parts) > 1 else None)
        measure = measure or "weights"
        moved = measure == "moved"
        if part == "cross" or moved:  # not in the summary: pooled by a job of its own
            kind = "word" if words else part if part == "cross" else "token"
            label = f"the model view's {kind} thumbnails" + (", moved" if moved else "")
            thumbs = in_background(
                captures,
                store,
                page,
                ("model view", part, words) + (("moved",) if moved else ()),
                label,
                cap.n_tokens,
                lambda progress: figures.helpers.model_view_thumbnails(
                    cap,
                    words=words,
                    part=part,
                    measure=measure,
                    on_progress=lambda d, t: progress(d, t, f"layer {d} of {t}"),
                ),
            )
            if thumbs is None:
                return message_figure(pending(label))
        else:
            summary = summary_of(captures, store, page, part)
            if summary is None:
                return message_figure(pending())
            thumbs = summary.word_thumbnails if words else summary.thumbnails  # both from the one pass
        return figures.model_view(cap, words=words, selected=selected, part=part, thumbnails=thumbs, measure=measure)

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.tabs, "value"),
        Input(ID.model_view, "clickData"),
        State(ID.store, "data"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def select_head(click, store, units, part):
        point = (click or {}).get("points", [{}])[0]
        cap = captures.from_store(store)
        if "x" not in point or "y" not in point or cap is None:
            return no_update
        words = units == "words"
        cell = figures.helpers.model_view_cell(cap, point["x"], point["y"], words=words, part=part)
        return no_update if cell is None else (cell[0], cell[1], "heatmap")


registers(
    View(
        "model",
        "Model view",
        order=30,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(page.graph_config),
    )
)
