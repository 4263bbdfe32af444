"""Rollout (Abnar & Zuidema 2020): heads averaged, the residual mixed in, multiplied through the layers —
for every token, or for the AttentionLab's query."""

from __future__ import annotations

from dash import Dash, Input, Output, dcc, html

from attnviz.analysis import rollout, rollout_blocks, rollout_rows
from attnviz.figures import message_figure, rollout_figure
from attnviz.views.plots import MAX_CELLS

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import AID, ID

VIEWS = [("rollout", "Rollout")]


def layout() -> list:
    return [
        html.P(
            "Attention rollout (Abnar & Zuidema 2020): heads averaged, the residual connection mixed in "
            "as 0.5·I, multiplied through all layers. It estimates how information flows through "
            "attention alone; it is not an attribution of the prediction (MLPs and value norms are ignored)."
        ),
        dcc.RadioItems(
            id=AID.rollout_mode,
            value="matrix",
            inline=True,
            options=[
                {"label": " every token ", "value": "matrix"},
                {"label": " the AttentionLab's query token", "value": "query"},
            ],
        ),
        dcc.Loading(dcc.Graph(id=AID.rollout_graph)),
    ]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(AID.rollout_graph, "figure"),
        Input(ID.store, "data"),
        Input(AID.rollout_mode, "value"),
        Input(ID.lab_query, "data"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    @shows_errors(message_figure)
    def rollout_view(store, mode, query, tab, part):
        only_on(tab, "rollout")
        cap = captures.self_part(store, part)
        if cap is None:
            return message_figure("Run the model first.")
        n = cap.n_tokens
        query = None if query is None else min(query, n - 1)
        if n <= MAX_CELLS:
            # the final layer's rollout, once per capture and part: the mode and the lab's query pick from it
            flow = captures.derived(store, ("rollout", part), lambda: rollout(cap)[-1].clone())
        elif mode == "query" and query is not None:  # one row: layers·n² instead of layers·n³
            flow = captures.derived(store, ("rollout row", part, query), lambda: rollout_rows(cap, [query])[0])
        else:  # only the block means the heatmap shows: layers·(n/block)·n²
            block = -(-n // MAX_CELLS)
            flow = captures.derived(store, ("rollout blocks", part), lambda: rollout_blocks(cap, block))
        return rollout_figure(cap, flow, query=query if mode == "query" else None)
