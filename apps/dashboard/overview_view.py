"""The heatmap for texts of any length: the exact map for short texts, the head's pooled *overview*
for long ones, and a zoom that fetches the visible window at full resolution.

A long text's map is pooled (``attnviz.analysis.overview``) into at most ``OVERVIEW_SIZE`` × ``OVERVIEW_SIZE``
blocks of whole tokens, so a response stays under 2 MB whatever the length. Its axes are categories,
one per block, named by their token range ("512–519 ('the'…'cat')"): hover reads them, and a zoom
(the graph's ``relayoutData``, in category units) maps back to token positions through the shown
view's block edges, kept in a small ``dcc.Store``. A zoom of at most ``WINDOW`` tokens a side is
recomputed exactly (``attnviz.figures.window_figure``); double-click returns to the overview.
The figures are the library's (``attnviz.figures.overview_figure``, ``window_figure``).

The helpers (``shown_overview``, ``shown_window``, ``zoom_span``) are pure, tested without a browser.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.analysis import OVERVIEW_MODES as MODES
from attnviz.analysis import block_edges
from attnviz.figures import message_figure

from .background import on_screen
from .captures import Captures
from .errors import only_on, shows_errors
from .ids import ID, OID
from .panels import slot_panels
from .registry import View, registers

LONG = 512  # a grid with more rows or columns than this shows the overview
OVERVIEW_SIZE = 512  # blocks per side of the overview (its payload: ~1.8 MB at 512 × 512, whatever n)
WINDOW = 512  # a zoom spanning at most this many tokens a side is fetched exactly


# ---------------------------------------------------------------- pure helpers
def edges_of(span: list[int]) -> list[int]:
    """Block edges from a stored ``[start, stop, width]`` (equal blocks, the last one possibly shorter)."""
    start, stop, width = span
    return list(range(start, stop, width)) + [stop]


def _span(edges: list[int]) -> list[int]:
    return [edges[0], edges[-1], edges[1] - edges[0]]


def _view(rows: list[int], cols: list[int], full: bool) -> dict:
    return {"rows": _span(rows), "cols": _span(cols), "full": full}


def shown_overview(
    cap: attnviz.Capture,
    layer: int,
    head: int,
    *,
    part: str | None = None,
    mode: str = "max",
    measure: str = "weights",
) -> tuple[go.Figure, dict]:
    """The head's overview (``figures.overview_figure``, at most ``OVERVIEW_SIZE``² blocks) of its weights
    or (``measure="moved"``) of what it moves, and the view's store (its block edges)."""
    exact = "exact values" if measure == "moved" else "exact weights"
    fig = figures.overview_figure(
        cap,
        layer,
        head,
        part=part,
        mode=mode,
        size=OVERVIEW_SIZE,
        hint=f"drag a box over at most {WINDOW}×{WINDOW} tokens for the {exact}; double-click to come back",
        measure=measure,
    )
    queries, keys = cap.sequences(part)
    rows, cols = block_edges(queries.n_tokens, OVERVIEW_SIZE), block_edges(keys.n_tokens, OVERVIEW_SIZE)
    return fig, _view(rows, cols, True)


def shown_window(
    cap: attnviz.Capture,
    layer: int,
    head: int,
    rows: tuple[int, int],
    keys: tuple[int, int],
    *,
    part: str | None = None,
    measure: str = "weights",
) -> tuple[go.Figure, dict]:
    """The exact weights (or moved: ``measure="moved"``, what the head moves) of a window (``figures.window_figure``) and
    the view's store."""
    fig = figures.window_figure(
        cap, layer, head, rows, keys, part=part, hint="double-click: back to the overview", measure=measure
    )
    return fig, _view(list(range(rows[0], rows[1] + 1)), list(range(keys[0], keys[1] + 1)), False)


def zoom_span(relayout: dict | None, view: dict | None) -> str | tuple[tuple[int, int], tuple[int, int]] | None:
    """What a relayout asks of the shown grid: ``"reset"`` (double-click), the token ranges
    ``((row0, row1), (key0, key1))`` a zoom shows (blocks partly in view count whole), or None."""
    if not relayout or not view:
        return None
    if relayout.get("xaxis.autorange") or relayout.get("yaxis.autorange"):
        return "reset"
    spans, zoomed = {}, False
    for axis, key in (("xaxis", "cols"), ("yaxis", "rows")):
        edges = edges_of(view[key])
        lo, hi = relayout.get(f"{axis}.range[0]"), relayout.get(f"{axis}.range[1]")
        if lo is None and isinstance(relayout.get(f"{axis}.range"), list):
            lo, hi = relayout[f"{axis}.range"]
        if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
            spans[key] = (edges[0], edges[-1])
            continue
        zoomed = True
        a, b = sorted((lo, hi))
        last = len(edges) - 2
        i, j = min(max(math.floor(a + 0.5), 0), last), min(max(math.floor(b + 0.5), 0), last)
        spans[key] = (edges[i], edges[j + 1])
    return (spans["rows"], spans["cols"]) if zoomed else None


def is_long(cap: attnviz.Capture, words: bool, part: str | None) -> bool:
    """Whether the map in these units has more than ``LONG`` rows or columns (then: the token overview)."""
    return (
        max(
            len(figures.helpers.labels(cap, words, part, "query")), len(figures.helpers.labels(cap, words, part, "key"))
        )
        > LONG
    )


def note_for(cap: attnviz.Capture, view: dict | None, words: bool, part: str | None, measure: str = "weights") -> str:
    """The line above the heatmap: how what is shown relates to the text (``measure``: the weights, or
    moved: what the head moves, ‖α·f(x)‖)."""
    if view is None:
        return ""
    exact = "Exact moved (‖α·f(x)‖)" if measure == "moved" else "Exact weights"
    n = len(figures.helpers.labels(cap, False, part, "query"))
    unit = (
        f" (the text has {len(figures.helpers.labels(cap, True, part, 'query')):,} words, more than the {LONG} a word "
        "map shows: the overview is in tokens)"
        if words
        else ""
    )
    if view["full"]:
        wr, wc = view["rows"][2], view["cols"][2]
        return (
            f"{n:,} tokens: each cell pools a block of {wr}×{wc} tokens{unit}. Drag a box over at most "
            f"{WINDOW}×{WINDOW} tokens to see the {exact[0].lower() + exact[1:]}; double-click to return to the overview."
        )
    (r0, r1, _), (k0, k1, _) = view["rows"], view["cols"]
    return f"{exact}: queries {r0}–{r1 - 1} × keys {k0}–{k1 - 1} of {n:,} tokens. Double-click: the overview."


# ---------------------------------------------------------------- layout and callbacks
def layout(graph) -> list:
    """The heatmap view's children around ``graph`` (the page's heatmap ``dcc.Graph``)."""
    return [
        dcc.Store(id=OID.view),
        dcc.Store(id=OID.shown),
        dcc.Store(id=OID.zoom),
        html.Div(
            [
                html.Div(
                    [
                        html.Label("Overview cells show "),
                        dcc.RadioItems(
                            id=OID.mode,
                            value="max",
                            inline=True,
                            options=[
                                {"label": " max (where any strong weight is) ", "value": "max"},
                                {"label": " mean (where the mass is)", "value": "mean"},
                            ],
                        ),
                    ],
                    id=OID.mode_box,
                    style={"display": "none"},
                ),
                html.Div(id=OID.note, style={"color": "#555"}),
            ],
            style={"margin": "6px 0"},
        ),
        graph,
        *slot_panels("heatmap", "why"),  # a clicked cell's score taken apart (qk_view)
    ]


_SHOWN = {"display": "inline-block", "marginRight": "18px"}
_HIDDEN = {"display": "none"}


def register(app: Dash, captures: Captures) -> None:
    """The heatmap's callback."""

    # Only a zoom or a double-click reaches the server. The graph also reports resizes ({"autosize": true})
    # as relayouts; sent to the heatmap callback, such a report made Dash drop the zoom's window still
    # being computed (a callback's newer request supersedes its older one), and the overview stayed.
    app.clientside_callback(
        """(relayout) => relayout && Object.keys(relayout).some(
            (key) => key.startsWith("xaxis.range") || key.startsWith("yaxis.range") || key.endsWith(".autorange")
        ) ? relayout : window.dash_clientside.no_update""",
        Output(OID.zoom, "data"),
        Input(ID.heatmap, "relayoutData"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output(ID.heatmap, "figure"),
        Output(OID.view, "data"),
        Output(OID.note, "children"),
        Output(OID.mode_box, "style"),
        Output(OID.shown, "data"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.words, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
        Input(OID.mode, "value"),
        Input(ID.measure, "value"),
        Input(OID.zoom, "data"),
        State(OID.view, "data"),
        State(OID.shown, "data"),
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: (message_figure(m), None, "", no_update, None))
    def heatmap(store, layer, head, units, tab, part, mode, measure, relayout, view, shown, page):
        only_on(tab, "heatmap")
        on_screen(captures, store, page)  # the jobs of a capture the page left stop
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None:
            return message_figure("Run the model to see its attention."), None, "", _HIDDEN, None
        words = units == "words"
        mode = mode if mode in MODES else "max"
        measure = measure or "weights"
        trigger = ctx.triggered_id
        if trigger == OID.zoom:
            span = zoom_span(relayout, view)
            if span is None:
                return (no_update,) * 5
            if span == "reset":
                if view["full"]:
                    return (no_update,) * 5  # plotly has reset the overview itself
                fig, view = shown_overview(cap, layer, head, part=part, mode=mode, measure=measure)
                return fig, view, note_for(cap, view, words, part, measure), _SHOWN, no_update
            (r0, r1), (k0, k1) = span
            if not view["full"] or r1 - r0 > WINDOW or k1 - k0 > WINDOW:
                return (no_update,) * 5  # exact already, or too wide: plotly zooms the shown cells
            fig, view = shown_window(cap, layer, head, (r0, r1), (k0, k1), part=part, measure=measure)
            return fig, view, note_for(cap, view, words, part, measure), _SHOWN, no_update
        # what the figure on the page shows: coming back to the tab, or the same selection set again
        # (a run sets the part, whose callback sets layer and head once more), sends nothing
        key = {
            "store": store,
            "layer": layer,
            "head": head,
            "units": units,
            "part": part,
            "mode": mode,
            "measure": measure,
        }
        if shown == key:
            return (no_update,) * 5
        if not is_long(cap, words, part):
            fig = figures.heatmap(cap, layer, head, words=words, part=part, measure=measure)
            return fig, None, "", _HIDDEN, key
        queries, keys = cap.sequences(part)
        if (
            view
            and not view["full"]
            and trigger in (ID.layer, ID.head, ID.measure)
            and view["rows"][1] <= queries.n_tokens
            and view["cols"][1] <= keys.n_tokens
        ):
            # another head (or the other measure), same window: compared at full resolution
            (r0, r1, _), (k0, k1, _) = view["rows"], view["cols"]
            fig, view = shown_window(cap, layer, head, (r0, r1), (k0, k1), part=part, measure=measure)
        else:
            fig, view = shown_overview(cap, layer, head, part=part, mode=mode, measure=measure)
        return fig, view, note_for(cap, view, words, part, measure), _SHOWN, key


registers(
    View(
        "heatmap",
        "Heatmap",
        order=10,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(dcc.Loading(dcc.Graph(id=ID.heatmap, config=page.graph_config))),
        slots=("why",),
    )
)
