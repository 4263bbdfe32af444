"""The head view's controls for long texts — top-k keys per query, the cumulative mass of each row
(exBERT's slider), a range of queries — and the head view's callback, which hands them to
``attnviz.figures.head_view``.

Long texts (more than ``figures.helpers.MAX_LABELS`` queries) open on the top 3 keys of each query; short
ones draw every line above the threshold, as before.
"""

from __future__ import annotations

import math

from dash import Dash, Input, Output, ctx, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.figures import message_figure

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import HID, ID
from .registry import View, registers

DEFAULT_TOP_K = 3  # for long texts: a query's three strongest keys
MASS_OFF = 1.0  # the mass slider's end: every key (no cumulative-mass rule)


def is_long(n: int) -> bool:
    """Whether a head view of ``n`` queries opens on the top-k rule (its labels are thinned beyond this)."""
    return n > figures.helpers.MAX_LABELS


def range_marks(n: int, most: int = 8) -> dict[int, str]:
    """About ``most`` evenly spaced marks over positions 0..n-1, the last included."""
    if n <= 1:
        return {0: "0"}
    every = max(1, math.ceil((n - 1) / (most - 1)))
    marks = {i: str(i) for i in range(0, n - 1, every)}
    marks[n - 1] = str(n - 1)
    return marks


def rules(top_k, mass, queries, n: int) -> dict:
    """The controls' values as ``figures.head_view`` arguments (off: None; the range clamped to 0..n)."""
    k = None
    if top_k not in (None, "") and not isinstance(top_k, bool):
        if not isinstance(top_k, (int, float)) or top_k < 1 or not float(top_k).is_integer():
            raise attnviz.InputError(f"Top keys per query: type a whole number ≥ 1, or leave it empty (got {top_k!r}).")
        k = int(top_k)
    m = None if mass is None or float(mass) >= MASS_OFF else float(mass)
    span = None
    if queries and len(queries) == 2 and n > 0:
        start = min(max(int(queries[0]), 0), n - 1)
        stop = min(max(int(queries[1]) + 1, start + 1), n)
        span = None if (start, stop) == (0, n) else (start, stop)
    return {"top_k": k, "mass": m, "queries": span}


def controls() -> html.Div:
    """Top-k, mass and query range, placed above the head view."""
    box = {"display": "inline-block", "marginRight": "24px", "verticalAlign": "top"}
    return html.Div(
        [
            html.Div(
                [
                    html.Label("Top keys per query "),
                    dcc.Input(
                        id=HID.top_k,
                        type="number",  # no min: the browser would send None for -3, read as "all" unsaid
                        step=1,
                        placeholder="all",
                        debounce=True,
                        style={"width": "64px"},
                    ),
                ],
                style=box,
                title="draw only each query's k strongest keys (empty: every line above the threshold)",
            ),
            html.Div(
                [
                    html.Label("Keys holding this share of each row"),
                    dcc.Slider(
                        id=HID.mass,
                        min=0.5,
                        max=MASS_OFF,
                        step=0.05,
                        value=MASS_OFF,
                        marks={0.5: "50%", 0.7: "70%", 0.9: "90%", 1.0: "all"},
                    ),
                ],
                style={**box, "width": "300px"},
                title="the smallest set of keys that together hold this much of the query's weight (exBERT)",
            ),
            html.Div(
                [
                    html.Label("Queries (positions)"),
                    dcc.RangeSlider(
                        id=HID.queries,
                        min=0,
                        max=1,
                        step=1,
                        value=[0, 1],
                        marks={0: "0", 1: "1"},
                        tooltip={"placement": "bottom"},
                    ),
                ],
                style={**box, "width": "420px"},
                title="draw only the lines leaving these query positions",
            ),
        ],
        style={"margin": "6px 0"},
    )


def layout(graph_config: dict) -> list:
    """The head view: the heads to overlay, the controls above, the graph."""
    return [
        html.Div([html.Label("Heads to overlay "), dcc.Checklist(id=ID.heads_multi, inline=True)]),
        controls(),
        html.Div("Hover a query token on the left to isolate its lines.", style={"color": "#555"}),
        dcc.Loading(dcc.Graph(id=ID.head_view, config=graph_config, clear_on_unhover=True)),
    ]


def register(app: Dash, captures: Captures) -> None:
    """The head view's callbacks."""

    @app.callback(
        Output(HID.queries, "max"),
        Output(HID.queries, "value"),
        Output(HID.queries, "marks"),
        Output(HID.top_k, "value"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.part, "value"),
    )
    @shows_errors(lambda _m: no_update)  # the run callback reports a capture that fails
    def setup(store, units, part):
        cap = captures.from_store(store)
        if cap is None or (part is not None and part not in cap.parts):
            return (no_update,) * 4
        n = len(figures.helpers.labels(cap, units == "words", part, "query"))
        top_k = (DEFAULT_TOP_K if is_long(n) else None) if ctx.triggered_id in (ID.store, None) else no_update
        return max(n - 1, 1), [0, max(n - 1, 0)], range_marks(n), top_k

    @app.callback(
        Output(ID.head_view, "figure"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.heads_multi, "value"),
        Input(ID.words, "value"),
        Input(ID.head_view, "hoverData"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(HID.top_k, "value"),
        Input(HID.mass, "value"),
        Input(HID.queries, "value"),
        Input(ID.measure, "value"),
    )
    @shows_errors(message_figure)
    def head_view(store, layer, heads, units, hover, tab, part, top_k, mass, queries, measure):
        only_on(tab, "head")
        cap = captures.from_store(store)
        if cap is None or layer is None:
            return message_figure("Run the model to see its attention.")
        words = units == "words"
        n = len(figures.helpers.labels(cap, words, part, "query"))
        query = None
        if hover and hover.get("points"):
            point = hover["points"][0]
            if point.get("x") == 0 and isinstance(point.get("customdata"), int) and point["customdata"] < n:
                query = point["customdata"]
        kwargs = rules(top_k, mass, queries, n)
        fig = figures.head_view(
            cap, layer, heads or [0], words=words, query=query, part=part, measure=measure or "weights", **kwargs
        )
        return fig


registers(
    View(
        "head",
        "Head view",
        order=20,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(page.graph_config),
    )
)
