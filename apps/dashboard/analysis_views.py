"""The dashboard's analysis views: Coreference (with probe sets), Head statistics, Rollout."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dash import ALL, Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

import attnviz
from attnviz import evaluate_probes, figures
from attnviz.analysis import head_stats, propose_candidates, rank_heads, rollout
from attnviz.analysis.coref import PROBE_SETS
from attnviz.analysis.plots import (
    coref_bars,
    head_map,
    probe_accuracy_map,
    rollout_figure,
)
from attnviz.analysis.stats import DETECTORS, STATISTICS

if TYPE_CHECKING:
    import pandas as pd

from .common import chip, error_text, message_figure, word_of
from .generation_view import mark_view, new_start


class AID:
    coref_mode = "coref-mode"
    coref_words = "coref-words"
    coref_selection = "coref-selection"
    coref_sinks = "coref-sinks"
    coref_headline = "coref-headline"
    coref_table = "coref-table"
    coref_bars = "coref-bars"
    coref_heatmap = "coref-heatmap"
    coref_word = "coref-word"  # pattern-matching type
    probe_set = "probe-set"
    probe_run = "probe-run"
    probe_summary = "probe-summary"
    probe_map = "probe-map"
    probe_cancel = "probe-cancel"
    probe_progress = "probe-progress"
    probe_progress_text = "probe-progress-text"
    stats_table = "stats-table"
    stats_source = "stats-source"
    stats_column = "stats-column"
    stats_map = "stats-map"
    rollout_mode = "rollout-mode"
    rollout_graph = "rollout-graph"


VIEWS = [("coref", "Coreference"), ("stats", "Head statistics"), ("rollout", "Rollout")]
_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}
_TABLE_STYLE = dict(
    style_table={"overflowX": "auto", "maxHeight": "420px", "overflowY": "auto"},
    style_cell={"fontFamily": "system-ui, sans-serif", "fontSize": "13px", "padding": "2px 8px"},
    style_header={"fontWeight": "bold"},
)


def layout(view: Callable) -> list:
    """The three views; ``view(key, children)`` wraps each in the tab-switched container."""
    return [
        view(
            "coref",
            [
                html.P(
                    "Which word does the pronoun point to? Click words to choose the pronoun and the candidate "
                    "antecedents; every head is ranked by the attention from the pronoun (averaged over its "
                    "pieces) to each candidate (summed over its pieces)."
                ),
                dcc.RadioItems(
                    id=AID.coref_mode,
                    value="candidates",
                    inline=True,
                    options=[
                        {"label": " a click sets the pronoun ", "value": "pronoun"},
                        {"label": " a click adds/removes a candidate", "value": "candidates"},
                    ],
                ),
                html.Div(id=AID.coref_words, style={"lineHeight": "2.1em", "margin": "6px 0"}),
                dcc.Checklist(
                    id=AID.coref_sinks,
                    value=["sinks"],
                    options=[
                        {
                            "label": " leave out attention sinks (the first token, [CLS]/[SEP]) and renormalise each row",
                            "value": "sinks",
                        }
                    ],
                ),
                dcc.Loading(html.Div(id=AID.coref_headline, style={"fontSize": "1.25em", "margin": "10px 0"})),
                dcc.Graph(id=AID.coref_bars),
                html.Div("Heads ranked (click a row to select the head):", style={"marginTop": "6px"}),
                dash_table.DataTable(id=AID.coref_table, sort_action="native", page_size=15, **_TABLE_STYLE),
                dcc.Graph(id=AID.coref_heatmap),
                html.H4("Probe set: every head's accuracy at picking the gold antecedent"),
                html.Div(
                    [
                        dcc.Dropdown(
                            id=AID.probe_set,
                            value="en",
                            clearable=False,
                            style={"width": "320px"},
                            options=[
                                {"label": "English: 42 Winograd-style sentences (21 pairs)", "value": "en"},
                                {"label": "中文: 25 sentences with 它/他/她", "value": "zh"},
                            ],
                        ),
                    ],
                    style=_CONTROL,
                ),
                html.Button("Run probe set", id=AID.probe_run, n_clicks=0),
                html.Button("Cancel", id=AID.probe_cancel, n_clicks=0, style={"display": "none", "marginLeft": "6px"}),
                html.Progress(
                    id=AID.probe_progress, value="0", max="1", style={"display": "none", "marginLeft": "8px"}
                ),
                html.Span(id=AID.probe_progress_text, style={"marginLeft": "6px", "color": "#555"}),
                dcc.Loading(html.Div(id=AID.probe_summary, style={"margin": "8px 0", "fontFamily": "monospace"})),
                dcc.Graph(id=AID.probe_map),
            ],
        ),
        view(
            "stats",
            [
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
                            options=[
                                {"label": f"{k} — {v}", "value": k} for k, v in {**STATISTICS, **DETECTORS}.items()
                            ],
                        ),
                    ]
                ),
                dcc.Loading(dcc.Graph(id=AID.stats_map)),
                dash_table.DataTable(id=AID.stats_table, sort_action="native", page_size=20, **_TABLE_STYLE),
            ],
        ),
        view(
            "rollout",
            [
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
            ],
        ),
    ]


def register(
    app: Dash,
    ids,
    from_store: Callable,
    corpus: pd.DataFrame | None = None,
    corpus_name: str = "",
) -> None:
    """Callbacks of the analysis views. ``ids`` is the main layout's ID class; ``from_store(store,
    part)`` gives the capture narrowed to the chosen self-attention part (encoder or decoder);
    ``corpus`` is a table of ``attnviz stats`` the head-statistics view offers beside the text's."""

    @app.callback(
        Output(AID.coref_selection, "data"),
        Input(ids.store, "data"),
        Input(ids.lab_query, "data"),
        Input(ids.part, "value"),
    )
    def default_selection(store, query, part):
        try:
            cap = from_store(store, part)
        except Exception:  # noqa: BLE001 - the run callback (or the view) reports it
            return None
        if cap is None or query is None:
            return None
        pronoun = word_of(cap, min(query, cap.n_tokens - 1))
        spans = propose_candidates(cap, pronoun)
        candidates = sorted({word_of(cap, s.tokens[0]) for s in spans})
        return {"pronoun": pronoun, "candidates": candidates}

    @app.callback(
        Output(AID.coref_words, "children"),
        Input(ids.store, "data"),
        Input(AID.coref_selection, "data"),
        Input(ids.part, "value"),
    )
    def coref_words(store, selection, part):
        try:
            cap = from_store(store, part)
        except Exception:  # noqa: BLE001
            return []
        if cap is None or not selection:
            return []
        chips = []
        first_new = new_start(cap, words=True)  # a generation's first new word (None otherwise)
        for i, w in enumerate(cap.words):
            role = "pronoun" if i == selection["pronoun"] else "candidate" if i in selection["candidates"] else ""
            colour = {"pronoun": "#d62728", "candidate": "#2ca02c"}.get(role)
            new = " generated" if first_new is not None and i >= first_new else ""
            chips.append(chip(w.text, {"type": AID.coref_word, "index": i}, f"coref-word {role}".strip() + new, colour))
        return chips

    @app.callback(
        Output(AID.coref_selection, "data", allow_duplicate=True),
        Input({"type": AID.coref_word, "index": ALL}, "n_clicks"),
        State(AID.coref_selection, "data"),
        State(AID.coref_mode, "value"),
        prevent_initial_call=True,
    )
    def click_word(clicks, selection, mode):
        trigger = ctx.triggered_id
        if not trigger or not selection or not any(c for c in clicks if c):
            return no_update
        i = trigger["index"]
        if mode == "pronoun":
            candidates = [c for c in selection["candidates"] if c != i]
            return {"pronoun": i, "candidates": candidates}
        if i == selection["pronoun"]:
            return no_update
        candidates = set(selection["candidates"]) ^ {i}
        return {"pronoun": selection["pronoun"], "candidates": sorted(candidates)}

    @app.callback(
        Output(AID.coref_headline, "children"),
        Output(AID.coref_bars, "figure"),
        Output(AID.coref_table, "data"),
        Output(AID.coref_table, "columns"),
        Output(AID.coref_heatmap, "figure"),
        Input(ids.store, "data"),
        Input(AID.coref_selection, "data"),
        Input(AID.coref_sinks, "value"),
        Input(ids.tabs, "value"),
        Input(ids.part, "value"),
    )
    def coreference(store, selection, sinks, tab, part):
        if tab != "coref":
            return (no_update,) * 5
        try:
            cap = from_store(store, part)
            if cap is None or not selection:
                return "Run the model first.", message_figure(""), [], [], message_figure("")
            if not selection["candidates"]:
                return ("Click at least one candidate word.", message_figure(""), [], [], message_figure(""))
            ranking = rank_heads(
                cap, selection["pronoun"], selection["candidates"], exclude_sinks="sinks" in (sinks or [])
            )
        except Exception as err:  # noqa: BLE001
            return error_text(err), message_figure(error_text(err)), [], [], message_figure("")
        best_per = []
        for name in ranking.names:
            top = ranking.for_candidate(name).iloc[0]
            others = top[f"{name} from others"]
            habit = "" if others != others else f", others {others:.2f}"  # NaN: no other token sees it
            best_per.append(f"{ranking.pronoun.text} → {name} {top[name]:.2f} (L{top['layer']}·H{top['head']}{habit})")
        headline = html.Div(
            [
                html.Div(" · ".join(best_per), style={"fontWeight": "bold"}),
                html.Div(str(ranking), style={"fontSize": "0.8em", "color": "#555"}),
            ]
        )
        table = ranking.table.round(4)
        table.insert(0, "id", [f"{r.layer}-{r.head}" for r in table.itertuples(index=False)])
        columns = [{"name": c, "id": c} for c in table.columns if c != "id"]
        best = ranking.best
        heat = mark_view(
            figures.heatmap(cap, int(best["layer"]), int(best["head"]), words=True), cap, "matrix", words=True
        )
        return headline, coref_bars(ranking), table.to_dict("records"), columns, heat

    @app.callback(
        Output(AID.probe_summary, "children"),
        Output(AID.probe_map, "figure"),
        Input(AID.probe_run, "n_clicks"),
        State(ids.store, "data"),
        State(AID.probe_set, "value"),
        State(AID.coref_sinks, "value"),
        State(ids.part, "value"),
        prevent_initial_call=True,
        background=True,  # one forward per probe: a job beside the server, the page stays usable
        running=[
            (Output(AID.probe_run, "disabled"), True, False),
            (Output(AID.probe_cancel, "style"), {"display": "inline-block", "marginLeft": "6px"}, {"display": "none"}),
            (
                Output(AID.probe_progress, "style"),
                {"display": "inline-block", "marginLeft": "8px"},
                {"display": "none"},
            ),
        ],
        cancel=[Input(AID.probe_cancel, "n_clicks")],
        progress=[
            Output(AID.probe_progress, "value"),
            Output(AID.probe_progress, "max"),
            Output(AID.probe_progress_text, "children"),
        ],
    )
    def run_probes(set_progress, _clicks, store, probe_set, sinks, part):
        set_progress(("0", "1", ""))
        if not store or probe_set not in PROBE_SETS:
            return "Run the model first.", message_figure("")
        model = store["model"]
        if model.startswith("file:"):
            return "Probe sets need a model; pick one in the model list.", message_figure("")
        try:
            part = part if from_store(store, part).model.get("encoder_decoder") else None  # refuses "cross"

            def progress(done: int, total: int) -> None:
                set_progress((str(done), str(total), f"probe {done + 1} of {total}"))

            result = evaluate_probes(
                model,
                probe_set,
                progress=False,
                exclude_sinks="sinks" in (sinks or []),
                part=part,
                on_progress=progress,
            )
        except Exception as err:  # noqa: BLE001
            return error_text(err), message_figure(error_text(err))
        set_progress(("1", "1", ""))
        return str(result), probe_accuracy_map(result)

    @app.callback(
        Output(AID.stats_source, "options"),
        Output(AID.stats_source, "value"),
        Input(ids.tabs, "value"),
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
        Input(ids.store, "data"),
        Input(AID.stats_column, "value"),
        Input(ids.tabs, "value"),
        Input(ids.part, "value"),
        Input(AID.stats_source, "value"),
    )
    def statistics(store, column, tab, part, source):
        if tab != "stats":
            return (no_update,) * 3
        try:
            if source == "corpus" and corpus is not None:
                df = corpus.drop(columns=["texts", "tokens"])
                figure = head_map(df, column)
                figure.update_layout(title=f"{figure.layout.title.text} — corpus {corpus_name}")
                table = df.round(4)
                table.insert(0, "id", [f"{r.layer}-{r.head}" for r in table.itertuples(index=False)])
                return table.to_dict("records"), [{"name": c, "id": c} for c in table.columns if c != "id"], figure
            cap = from_store(store, part)
            if cap is None:
                return [], [], message_figure("Run the model first.")
            df = head_stats(cap)
        except Exception as err:  # noqa: BLE001
            return [], [], message_figure(error_text(err))
        table = df.round(4)
        table.insert(0, "id", [f"{r.layer}-{r.head}" for r in table.itertuples(index=False)])
        columns = [{"name": c, "id": c} for c in table.columns if c != "id"]
        return table.to_dict("records"), columns, head_map(df, column)

    @app.callback(
        Output(ids.layer, "value", allow_duplicate=True),
        Output(ids.head, "value", allow_duplicate=True),
        Input(AID.coref_table, "active_cell"),
        Input(AID.stats_table, "active_cell"),
        Input(AID.stats_map, "clickData"),
        prevent_initial_call=True,
    )
    def select_head(coref_cell, stats_cell, map_click):
        if ctx.triggered_id == AID.stats_map:
            point = (map_click or {}).get("points", [{}])[0]
            if "x" in point and "y" in point:
                return int(point["y"]), int(point["x"])
            return no_update, no_update
        cell = coref_cell if ctx.triggered_id == AID.coref_table else stats_cell
        if not cell or not cell.get("row_id"):
            return no_update, no_update
        layer, head = (int(x) for x in str(cell["row_id"]).split("-"))
        return layer, head

    @app.callback(
        Output(AID.rollout_graph, "figure"),
        Input(ids.store, "data"),
        Input(AID.rollout_mode, "value"),
        Input(ids.lab_query, "data"),
        Input(ids.tabs, "value"),
        Input(ids.part, "value"),
    )
    def rollout_view(store, mode, query, tab, part):
        if tab != "rollout":
            return no_update
        try:
            cap = from_store(store, part)
            if cap is None:
                return message_figure("Run the model first.")
            flow = rollout(cap)
            query = None if query is None else min(query, cap.n_tokens - 1)
            fig = rollout_figure(cap, flow, query=query if mode == "query" else None)
            return mark_view(fig, cap, "bars" if mode == "query" else "matrix")
        except attnviz.AttnvizError as err:
            return message_figure(error_text(err))
