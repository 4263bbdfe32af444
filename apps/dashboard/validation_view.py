"""Recomputed vs model: how far attnviz's recomputation is from the model's own numbers, per layer ×
head (a click selects the head), and the chosen head's two maps side by side."""

from __future__ import annotations

from dash import Dash, Input, Output, dcc, html, no_update

from attnviz import figures
from attnviz.figures import message_figure

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID

VIEWS = [("validation", "Recomputed vs model")]


def layout(graph_config: dict) -> list:
    return [
        html.Div(id=ID.validation_summary, style={"margin": "8px 0", "fontFamily": "monospace"}),
        dcc.Loading(dcc.Graph(id=ID.validation_map, config=graph_config)),
        dcc.Graph(id=ID.comparison, config=graph_config),
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
    )
    @shows_errors(lambda m: (m, message_figure(m), message_figure("")))
    def validation(store, layer, head, tab, part):
        only_on(tab, "validation")
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None:
            return "", message_figure("Run the model first."), message_figure("")
        report = cap.validate()
        part_ = cap.resolve_part(part if len(cap.parts) > 1 else None)
        quantity = "weights" if any(r["quantity"] == "weights" for r in report.rows) else "output"
        return (
            str(report),
            figures.validation_map(report, quantity, part_),
            figures.comparison(cap, layer, head, part=part_),
        )

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
