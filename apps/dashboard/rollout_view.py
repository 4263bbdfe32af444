"""Rollout (Abnar & Zuidema 2020): heads averaged, the residual mixed in, multiplied through the layers —
for every token, or for the AttentionLab's query.

Every token's rollout (block means past ``MAX_CELLS`` tokens) comes from the capture's fused summary
(``background.summary_of``); the query's row of a long text is a pass of its own (``rollout_rows``).
Past the page's background threshold both are background jobs with the job bar's progress."""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, html

from attnviz.analysis import ROLLOUT_CELLS as MAX_CELLS
from attnviz.analysis import rollout_rows
from attnviz.figures import message_figure, rollout_figure

from .background import in_background, on_screen, pending, summary_of
from .captures import Captures
from .common import word_of
from .errors import only_on, shows_errors
from .ids import AID, ID
from .registry import View, registers
from .ui import field


def layout() -> list:
    return [
        html.P(
            "Attention rollout (Abnar & Zuidema 2020): heads averaged, the residual connection mixed in "
            "as 0.5·I, multiplied through all layers. It estimates how information flows through "
            "attention alone; it is not an attribution of the prediction (MLPs and value norms are ignored)."
        ),
        field(
            "Rollout of",
            dcc.RadioItems(
                id=AID.rollout_mode,
                value="matrix",
                inline=True,
                className="av-radio",
                options=[
                    {"label": " every token", "value": "matrix"},
                    {"label": " the AttentionLab's query token", "value": "query"},
                ],
            ),
            "every token: the whole rolled-out matrix, query × key. The AttentionLab's query token: its row "
            "only, as bars (click a token in the AttentionLab to choose it).",
            style={"marginBottom": "8px"},
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
        Input(ID.view_job_done, "data"),
        Input(ID.words, "value"),
        State(ID.page, "data"),
    )
    @shows_errors(message_figure)
    def rollout_view(store, mode, query, tab, part, _done, units, page):
        only_on(tab, "rollout")
        on_screen(captures, store, page)  # the jobs of a capture the page left stop
        cap = captures.self_part(store, part)
        if cap is None:
            return message_figure("Run the model first.")
        n = cap.n_tokens
        words = units == "words"
        query = None if query is None else min(query, n - 1)
        word = None if query is None else word_of(cap, query)  # the Lab's query token's word
        if n > MAX_CELLS and mode == "query" and query is not None:  # one row: layers·n² instead of layers·n³
            # in words, the word's own row: its pieces' rows averaged (as the figure averages a word's rows)
            rows = range(cap.words[word].token_start, cap.words[word].token_stop) if words else [query]
            label = "the query's rollout row"
            flow = in_background(
                captures,
                store,
                page,
                ("rollout row", part, tuple(rows)),
                label,
                n,
                lambda progress: rollout_rows(
                    cap, list(rows), on_progress=lambda d, t: progress(d, t, f"layer {d} of {t}")
                ).mean(0),
            )
            if flow is None:
                return message_figure(pending(label))
        else:  # every token (n ≤ MAX_CELLS: the mode and the lab's query pick from it), or block means past it
            summary = summary_of(captures, store, page, part)
            if summary is None:
                return message_figure(pending())
            if summary.rollout is None:
                return message_figure(summary.rollout_error)
            flow = summary.rollout
        shown = (word if words else query) if mode == "query" else None
        return rollout_figure(cap, flow, query=shown, words=words)


registers(
    View(
        "rollout",
        "Rollout",
        order=100,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(),
    )
)
