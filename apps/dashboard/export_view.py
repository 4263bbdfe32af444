"""Exports: the figures' PNG/SVG format, and downloads of the view's figures as PNG/SVG (drawn in the page,
CJK in the page's own face: ``assets/figure_image.js``), the shown matrix (CSV), the capture file, the
view's figures as one self-contained HTML page and the whole capture's report (``figures.report``).

The page's images carry the capture's provenance as ``figures.write_image(provenance=)`` writes it: a hidden
element (``ID.provenance_json``, on every tab) holds ``cap.provenance`` as ASCII JSON, filled on every new
capture, and ``attnviz.withProvenance`` (figure_image.js) puts that text into each PNG or SVG the Figure and
camera buttons save."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pandas as pd
from dash import ClientsideFunction, Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz import figures

from .captures import Captures
from .common import word_of
from .errors import shows_errors
from .ids import CID, ID
from .registry import View, registers
from .ui import field

GRAPHS = [ID.heatmap, ID.head_view, ID.model_view, ID.lab_graph, ID.validation_map, ID.comparison, CID.graph]


def file_name(name: str) -> str:
    """A download's file name from the page's selections (which the page may send as anything): letters,
    digits and ``._-`` only, so that no separator or control character reaches the browser's save dialog."""
    stem, dot, suffix = re.sub(r"[^A-Za-z0-9._-]+", "_", name).rpartition(".")
    return f"{stem[:100]}.{suffix[:10]}" if dot else suffix[:110]


def matrix_frame(
    cap: attnviz.Capture,
    layer: int,
    head: int,
    *,
    words: bool = False,
    part: str | None = None,
    measure: str = "weights",
) -> pd.DataFrame:
    """The shown matrix as a table: one row per query, one column per key, labelled — the weights, or
    with ``measure="moved"`` what the head moves (``cap.moved``)."""
    shown = cap.moved if measure == "moved" else cap.attention
    matrix = shown(layer, head, words=words, part=part).numpy()
    return pd.DataFrame(
        matrix,
        index=pd.Index(figures.helpers.labels(cap, words, part, "query"), name="query"),
        columns=figures.helpers.labels(cap, words, part, "key"),
    )


def view_figures(
    cap: attnviz.Capture,
    tab: str,
    layer: int,
    head: int,
    *,
    words: bool,
    part: str | None,
    heads: list[int] | None = None,
    query: int | None = None,
    measure: str = "weights",
) -> list:
    """The figures of a view, for the self-contained HTML export (tables' views give the heatmap), with
    a generation's new tokens marked as in the page and the page's measure (weights or moved)."""
    if tab == "head":
        return [figures.head_view(cap, layer, heads or [head], words=words, part=part, measure=measure)]
    if tab == "model":
        return [figures.model_view(cap, words=words, selected=(layer, head), part=part, measure=measure)]
    if tab == "lab" and query is not None:
        queries, _ = cap.sequences(part)
        token = min(query, queries.n_tokens - 1)
        index = word_of(queries, token) if words else token
        return [figures.query_row(cap, layer, head, index, words=words, part=part, measure=measure)]
    if tab == "validation":
        return [
            figures.validation_map(cap.validate(), part=cap.resolve_part(part)),
            figures.validation_comparison(cap, layer, head, part=part),
        ]
    return [figures.heatmap(cap, layer, head, words=words, part=part, measure=measure)]


def layout() -> list:
    """The export format and the download buttons (at the right of the view's toolbar)."""
    return [
        dcc.Download(id=ID.download),
        dcc.Store(id=ID.figure_done),
        # the shown capture's provenance as JSON, for the images drawn in the page (figure_image.js reads it)
        html.Div(id=ID.provenance_json, hidden=True, style={"display": "none"}),
        field(
            "Export figures as",
            dcc.RadioItems(
                id=ID.export_format,
                value="png",
                inline=True,
                className="av-radio",
                options=[{"label": " PNG", "value": "png"}, {"label": " SVG", "value": "svg"}],
            ),
            "The format of the Figure button (the view's figures as images) and of the camera button in each "
            "figure's toolbar (that figure alone); both draw Chinese and Japanese in the page's own font.",
        ),
        field(
            "Download",
            html.Div(
                [
                    html.Button(
                        "Figure",
                        id=ID.figure_button,
                        n_clicks=0,
                        className="av-button",
                        title="each figure of this view as an image (PNG or SVG, as chosen), its Chinese and Japanese "
                        "labels drawn in the page's own font on any machine",
                    ),
                    html.Button(
                        "CSV",
                        id=ID.csv_button,
                        n_clicks=0,
                        className="av-button",
                        title="the shown matrix (this layer and head, the units and measure shown) as a CSV table",
                    ),
                    html.Button(
                        "Capture file",
                        id=ID.capture_button,
                        n_clicks=0,
                        className="av-button",
                        title="the whole capture (Q, K, V, every layer): open it again with attnviz app --capture",
                    ),
                    html.Button(
                        "HTML (offline)",
                        id=ID.html_button,
                        n_clicks=0,
                        className="av-button",
                        title="this view's figures as one self-contained HTML page",
                    ),
                    html.Button(
                        "Report",
                        id=ID.report_button,
                        n_clicks=0,
                        className="av-button",
                        title="the whole capture as one self-contained HTML report that opens offline: the head map, "
                        "a query's row, the head view and the thumbnails chosen in the page, the validation, the model",
                    ),
                ],
                className="av-row",
            ),
            "Download this view's figures as images (PNG/SVG, CJK drawn in the page's font), the shown matrix "
            "(CSV), the capture file, this view's figures as one offline HTML page, or the report of the whole capture "
            "(every layer and head, chosen in the downloaded page itself).",
        ),
    ]


def register(app: Dash, captures: Captures) -> None:
    # drawn in the browser: plotly's SVG with the page's CJK face inlined (figure_image.js), then downloaded
    app.clientside_callback(
        ClientsideFunction("attnviz", "downloadFigures"),
        Output(ID.figure_done, "data"),
        Output(ID.message, "children", allow_duplicate=True),
        Input(ID.figure_button, "n_clicks"),
        State(ID.export_format, "value"),
        State(ID.tabs, "value"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        prevent_initial_call=True,
    )

    @app.callback(Output(ID.provenance_json, "children"), Input(ID.store, "data"))
    @shows_errors(lambda _m: "")  # a capture gone is said by the views; its images then carry none
    def provenance_json(store):
        """``cap.provenance`` as ``figures.write_image`` writes it (ASCII JSON, json.dumps' separators), or ""."""
        cap = captures.from_store(store)
        return json.dumps(cap.provenance, ensure_ascii=True) if cap is not None and cap.provenance else ""

    @app.callback(*[Output(g, "config") for g in GRAPHS], Input(ID.export_format, "value"))
    def export_format(fmt):
        return [
            {"displaylogo": False, "toImageButtonOptions": {"format": fmt, "filename": f"attnviz-{g}"}} for g in GRAPHS
        ]

    @app.callback(
        Output(ID.download, "data"),
        Output(ID.message, "children", allow_duplicate=True),
        Input(ID.csv_button, "n_clicks"),
        Input(ID.capture_button, "n_clicks"),
        Input(ID.html_button, "n_clicks"),
        Input(ID.report_button, "n_clicks"),
        State(ID.store, "data"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        State(ID.tabs, "value"),
        State(ID.heads_multi, "value"),
        State(ID.lab_query, "data"),
        State(ID.measure, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (no_update, m))
    def download(_csv, _file, _html, _report, store, layer, head, units, part, tab, heads, query, measure):
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None:
            return no_update, "Run the model first."
        part = part if len(cap.parts) > 1 else None
        words = units == "words"
        if ctx.triggered_id == ID.capture_button:
            with tempfile.TemporaryDirectory() as tmp:
                path = cap.save(Path(tmp) / "capture.attnviz")
                return dcc.send_bytes(path.read_bytes(), "capture.attnviz"), ""
        if ctx.triggered_id == ID.report_button:
            shown = layer in cap.layer_indices(
                cap.parts[0]
            )  # the page's head opens the report, and stays past its budget
            page = figures.report(
                cap,
                layer=layer if shown else None,
                head=head if shown else None,
                heads=[(layer, head)] if shown else None,
            )
            return dcc.send_string(page, "attnviz-report.html"), ""
        if ctx.triggered_id == ID.html_button:
            figs = view_figures(
                cap, tab, layer, head, words=words, part=part, heads=heads, query=query, measure=measure or "weights"
            )
            name = file_name(f"attnviz-{tab}-{part + '-' if part else ''}L{layer}-H{head}.html")
            page = figures.html_page(
                figs, title=f"attnviz — {cap.model.get('name')}: {cap.text[:80]}", provenance=cap.provenance
            )
            return dcc.send_string(page, name), ""
        moved = measure == "moved"
        df = matrix_frame(cap, layer, head, words=words, part=part, measure="moved" if moved else "weights")
        name = file_name(
            f"{'moved' if moved else 'attention'}-{part + '-' if part else ''}L{layer}-H{head}-{units}.csv"
        )
        return dcc.send_data_frame(df.to_csv, name), ""


registers(View("export", None, order=135, register=lambda app, server: register(app, server.captures)))
