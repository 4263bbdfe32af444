"""Head statistics: per head, where its attention goes on average (after Clark et al. 2019) with
pattern detectors — for this text, or for a corpus table of ``attnviz stats`` the server was started
with; a click on a row or the map selects the head. This text's statistics come from the capture's
fused summary (``background.summary_of``): for a long text a background job, shared with the model view,
rollout and the validation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dash import Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

from attnviz.analysis.stats import DETECTORS, STATISTICS
from attnviz.figures import head_map, message_figure

from .background import pending, summary_of
from .captures import Captures
from .common import TABLE_STYLE
from .errors import only_on, shows_errors
from .ids import AID, ID

if TYPE_CHECKING:
    import pandas as pd

VIEWS = [("stats", "Head statistics")]


def layout() -> list:
    return [
        html.P(
            "Per head, averaged over every query token (after Clark et al. 2019), with pattern detectors: "
            "each number is the share of attention that goes where the column says. Sort by a column; "
            "click a row or the map to select the head."
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
                    options=[{"label": f"{k} — {v}", "value": k} for k, v in {**STATISTICS, **DETECTORS}.items()],
                ),
            ]
        ),
        dcc.Loading(dcc.Graph(id=AID.stats_map)),
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
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: ([], [], message_figure(m)))
    def statistics(store, column, tab, part, source, _done, page):
        only_on(tab, "stats")
        if source == "corpus" and corpus is not None:
            df = corpus.drop(columns=["texts", "tokens"])
            figure = head_map(df, column)
            figure.update_layout(title=f"{figure.layout.title.text} — corpus {corpus_name}")
        else:
            if not store:
                return [], [], message_figure("Run the model first.")
            summary = summary_of(captures, store, page, part)
            if summary is None:
                return [], [], message_figure(pending())
            df = summary.head_stats()
            figure = head_map(df, column)
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
        if ctx.triggered_id == AID.stats_map:
            point = (click or {}).get("points", [{}])[0]
            return (int(point["y"]), int(point["x"])) if "x" in point and "y" in point else no_update
        if not cell or not cell.get("row_id"):
            return no_update
        layer, head = (int(x) for x in str(cell["row_id"]).split("-"))
        return layer, head
