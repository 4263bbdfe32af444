"""Shapes & cost: this text's shapes, FLOPs and the memory an n×n map would take."""

from __future__ import annotations

import pandas as pd
from dash import Dash, Input, Output, dcc, html

from attnviz.analysis import cost_tables
from attnviz.figures.helpers import MARK, new_start

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID
from .registry import View, registers


def table(df: pd.DataFrame, title: str) -> html.Div:
    return html.Div(
        [
            html.H4(title),
            html.Table(
                [html.Tr([html.Th(c) for c in df.columns])]
                + [html.Tr([html.Td(str(v)) for v in row]) for row in df.itertuples(index=False)],
                className="cost-table",
            ),
        ],
        style={"marginBottom": "14px"},
    )


def layout() -> list:
    return [dcc.Loading(html.Div(id=ID.cost))]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(ID.cost, "children"), Input(ID.store, "data"), Input(ID.tabs, "value"), Input(ID.part, "value")
    )
    @shows_errors(lambda m: m)
    def cost(store, tab, part):
        only_on(tab, "cost")
        cap = captures.self_part(store, part)
        if cap is None:
            return "Run the model first."
        tables = cost_tables(cap)
        n = cap.n_tokens
        first_new = new_start(cap)
        return html.Div(
            [
                html.P(
                    f"{cap.model.get('name')} on this text: n = {n} tokens"
                    + (f" ({first_new} prompt + {n - first_new} generated {MARK})" if first_new is not None else "")
                    + f", d_model = {cap.model.get('d_model')}, "
                    f"{cap.n_heads} heads of d_k = {cap.d_head}, {cap.n_layers} layers. attnviz keeps Q, K, V "
                    f"(O(n·d)) and recomputes A (O(n²)) one head at a time."
                ),
                table(tables["shapes"], "Shapes (one layer)"),
                table(tables["flops"], "FLOPs (multiply-add = 2)"),
                table(tables["memory"], "Memory to store A (float32) — the n² wall"),
            ]
        )


registers(
    View(
        "cost",
        "Shapes & cost",
        order=60,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(),
    )
)
