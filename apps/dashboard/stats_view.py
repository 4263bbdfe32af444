"""Head statistics: per head, where its attention goes on average (after Clark et al. 2019) with
pattern detectors — for this text, or for a corpus table of ``attnviz stats`` the server was started
with; a click on a row or the map selects the head. This text's statistics come from the capture's
fused summary (``background.summary_of``): for a long text a background job, shared with the model view,
rollout and the validation.

Each statistic by weight sits beside its moved twin (``<name>_moved``: the share of what the head
moves, α·‖f(x)‖, :data:`attnviz.analysis.MOVED_STATISTICS`) in the table; the map shows the
column chosen, and under the page's "Show: moved" a weight column's moved twin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dash import Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

from attnviz.analysis import DETECTORS, MOVED_STATISTICS, STATISTICS, moved_name
from attnviz.figures import head_map, message_figure

from .background import pending, summary_of
from .captures import Captures
from .common import TABLE_STYLE, head_of
from .errors import only_on, shows_errors
from .ids import AID, ID
from .registry import View, registers

if TYPE_CHECKING:
    import pandas as pd


def layout() -> list:
    return [
        html.P(
            "Per head, averaged over every query token (after Clark et al. 2019), with pattern detectors: "
            "each number is the share of attention that goes where the column says. Beside each, its moved "
            "twin (…_moved): the share of what the head moves into the query (α·‖f(x)‖), which the map "
            "shows under Show: moved. Sort by a column; click a row or the map to select the head."
        ),
        html.Div(
            [
                html.Label("Statistics of "),
                dcc.RadioItems(
                    id=AID.stats_source,
                    value="text",
                    inline=True,
                    options=[{"label": " this text", "value": "text"}],
                    style={"display": "inline-block"},
                ),
            ],
            style={"margin": "4px 0"},
        ),
        html.Div(
            [
                html.Label("Map of "),
                dcc.Dropdown(
                    id=AID.stats_column,
                    value="previous_token",
                    clearable=False,
                    style={"width": "420px"},
                    options=[
                        {"label": f"{k} — {v}", "value": k}
                        for k, v in {**STATISTICS, **DETECTORS, **MOVED_STATISTICS}.items()
                    ],
                ),
            ]
        ),
        dcc.Loading(dcc.Graph(id=AID.stats_map)),
        html.P(
            "An empty cell is a statistic the text does not have: special (and special_moved) when it has no "
            "special token after the first ([SEP], </s>), a _moved one for a layer without value norms.",
            style={"color": "#555", "margin": "4px 0"},
        ),
        dash_table.DataTable(id=AID.stats_table, sort_action="native", page_size=20, **TABLE_STYLE),
    ]


def register(app: Dash, captures: Captures, corpus: pd.DataFrame | None = None, corpus_name: str = "") -> None:
    """``corpus``: a table of ``attnviz stats`` offered beside the text's own statistics."""

    @app.callback(
        Output(AID.stats_source, "options"),
        Output(AID.stats_source, "value"),
        Input(ID.tabs, "value"),
    )
    def stats_sources(_tab):
        options = [{"label": " this text", "value": "text"}]
        if corpus is None:
            return options, no_update
        texts, tokens = int(corpus["texts"].iloc[0]), int(corpus["tokens"].iloc[0])
        options.append({"label": f" the corpus {corpus_name} ({texts:,} texts, {tokens:,} tokens)", "value": "corpus"})
        return options, "corpus" if ctx.triggered_id is None else no_update  # the corpus first

    @app.callback(
        Output(AID.stats_table, "data"),
        Output(AID.stats_table, "columns"),
        Output(AID.stats_map, "figure"),
        Input(ID.store, "data"),
        Input(AID.stats_column, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(AID.stats_source, "value"),
        Input(ID.view_job_done, "data"),
        Input(ID.measure, "value"),
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: ([], [], message_figure(m)))
    def statistics(store, column, tab, part, source, _done, measure, page):
        only_on(tab, "stats")
        if source == "corpus" and corpus is not None:
            df = corpus.drop(columns=["texts", "tokens"])
            where = f" — corpus {corpus_name}"
        else:
            if not store:
                return [], [], message_figure("Run the model first.")
            summary = summary_of(captures, store, page, part)
            if summary is None:
                return [], [], message_figure(pending())
            df, where = summary.head_stats(), ""
        df = side_by_side(df)
        shown = map_column(column, measure or "weights")
        if shown not in df.columns:
            figure = message_figure(
                f"This table has no {shown} column: it was written by an attnviz before the moved statistics "
                "(…_moved). Run attnviz stats again, or choose a column by weight."
            )
        else:
            meaning = MOVED_STATISTICS.get(shown) or STATISTICS.get(shown) or DETECTORS.get(shown) or shown
            figure = head_map(df, shown, title=f"{shown}: {meaning}{where}")
        table = df.round(4)
        table.insert(0, "id", [f"{r.layer}-{r.head}" for r in table.itertuples(index=False)])
        return table.to_dict("records"), [{"name": c, "id": c} for c in table.columns if c != "id"], figure

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Input(AID.stats_table, "active_cell"),
        Input(AID.stats_map, "clickData"),
        prevent_initial_call=True,
    )
    def select_head(cell, click):
        return head_of(click, cell, ctx.triggered_id == AID.stats_map)


def map_column(column: str, measure: str) -> str:
    """The column the map shows: the one chosen, or under ``measure="moved"`` a weight column's moved
    twin (the entropy has none: it stays)."""
    twin = moved_name(column)
    return twin if measure == "moved" and twin in MOVED_STATISTICS else column


def side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """The table's columns with each statistic by weight followed by its moved twin (``_moved``)."""
    columns = [c for c in df.columns if not c.endswith("_moved")]
    ordered: list[str] = []
    for c in columns:
        ordered.append(c)
        if moved_name(c) in df.columns:
            ordered.append(moved_name(c))
    ordered += [c for c in df.columns if c not in ordered]
    return df[ordered]


registers(
    View(
        "stats",
        "Head statistics",
        order=80,
        register=lambda app, server: register(app, server.captures, server.table, server.table_name),
        layout=lambda page: layout(),
    )
)
