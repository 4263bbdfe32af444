"""Recomputed vs model: how far attnviz's recomputation is from the model's own numbers, per layer ×
head (a click selects the head), and the chosen head's two maps side by side.

The report is the capture's fused summary's (``background.summary_of``: every query row of the part,
checked in the same pass over every head as the model view, head statistics and rollout) — for a long
text a background job; the chosen head's comparison does not wait for it. A cross-attention part is
checked with every part (``Capture.validate``), as a job past the page's background threshold."""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, html, no_update

from attnviz import figures
from attnviz.figures import message_figure

from .background import SUMMARY_LABEL, in_background, pending, summary_of
from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID
from .panels import slot_panels
from .registry import View, registers
from .ui import MONO


def layout(graph_config: dict) -> list:
    return [
        html.Div(id=ID.validation_summary, style={"margin": "8px 0", "fontFamily": MONO}),
        dcc.Loading(dcc.Graph(id=ID.validation_map, config=graph_config)),
        dcc.Graph(id=ID.comparison, config=graph_config),
        *slot_panels("validation", "provenance"),  # where the capture came from (provenance_view)
    ]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(ID.validation_summary, "children"),
        Output(ID.validation_map, "figure"),
        Output(ID.comparison, "figure"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(ID.view_job_done, "data"),
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: (m, message_figure(m), message_figure("")))
    def validation(store, layer, head, tab, part, _done, page):
        only_on(tab, "validation")
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None:
            return "", message_figure("Run the model first."), message_figure("")
        part_ = cap.resolve_part(part if len(cap.parts) > 1 else None)
        comparison = figures.validation_comparison(cap, layer, head, part=part_)  # one head: never waits for the job
        if part_ == "cross":
            label = "the validation of every part"
            report = in_background(
                captures, store, page, ("validation",), label, cap.n_tokens, lambda _progress: cap.validate()
            )
        else:
            label = SUMMARY_LABEL
            summary = summary_of(captures, store, page, part_)
            report = None if summary is None else summary.validation
        if report is None:
            return pending(label), message_figure(pending(label)), comparison
        quantity = "weights" if any(r["quantity"] == "weights" for r in report.rows) else "output"
        return str(report), figures.validation_map(report, quantity, part_), comparison

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Input(ID.validation_map, "clickData"),
        prevent_initial_call=True,
    )
    def select_head(click):
        point = (click or {}).get("points", [{}])[0]
        if "x" not in point or "y" not in point:
            return no_update
        return int(point["y"]), int(point["x"])


registers(
    View(
        "validation",
        "Recomputed vs model",
        order=50,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(page.graph_config),
        slots=("provenance",),
    )
)
