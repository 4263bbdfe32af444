"""Probe sets on the Coreference tab: every head scored on a shipped set or the researcher's own file,
run as a background job with progress and Cancel — a panel of the Coreference view (its slot
``("coref", "probes")``), with its own callbacks.

The panel keeps its data on the server (``probe_runs.ProbeRuns``): an uploaded file is written to the
server's folder and read there (its summary and every unusable probe with its reason shown), and a
result stays there too — the page holds its key. The result is shown as its summary (intervals,
held-out estimate, tests, heads beating chance after Holm), the top heads' interval bars beside the
accuracy map, and a per-probe table of what the top heads picked (✓/✗), cut into pages on the server
(``probe_table``). A click on a probe's cell opens it in the AttentionLab: its text goes into the text
box and is run as any text is, then the Lab selects the pronoun's token as the query and that
column's head (the probe's own best head in its column; the set's best elsewhere).
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

import attnviz
from attnviz import evaluate_probes
from attnviz.analysis import PROBE_FORMATS, PROBE_SETS, load_probes
from attnviz.figures import message_figure, probe_accuracy_map, probe_intervals

from .captures import FILE_PREFIX, Captures
from .common import TABLE_STYLE, job_controls, not_yet
from .errors import page_message, shows_errors
from .ids import AID, ID
from .panels import adds_panel
from .probe_runs import MAX_UPLOAD_BYTES, ProbeRuns
from .probe_table import (
    PAGE,
    RIGHT,
    SHOW,
    TOP,
    WRONG,
    chosen_head,
    lab_text,
    load_rows,
    page_count,
    pronoun_range,
    pronoun_token,
    shown_rows,
    skipped_lines,
    table_columns,
    table_page,
    table_styles,
)
from .registry import View, registers
from .ui import MONO

_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}
_HIDDEN = {"display": "none"}
_HALF = {"display": "inline-block", "width": "50%", "verticalAlign": "top", "minWidth": "420px"}
_UPLOAD_STYLE = {
    "border": "1px dashed #999",
    "borderRadius": "4px",
    "padding": "6px 12px",
    "cursor": "pointer",
    "color": "#333",
}
SHIPPED = [
    {"label": "English: 42 Winograd-style sentences (21 pairs)", "value": "en"},
    {"label": "中文: 25 sentences with 它/他/她", "value": "zh"},
]
UPLOADED = "upload"  # the probe-set list's value for the page's own uploaded file
FORMATS = ["auto", *PROBE_FORMATS]  # load_probes(format=…); "auto": told from the file

INTERVAL_HEADS = 15  # heads whose accuracy intervals the panel plots


@adds_panel("coref", "probes")
def probe_panel() -> html.Div:
    """The probe-set panel: a set to run (shipped or uploaded), its result, and the per-probe table."""
    return html.Div(
        [
            html.H4("Probe set: every head's accuracy at picking the gold antecedent"),
            html.Div(
                [
                    dcc.Dropdown(
                        id=AID.probe_set, value="en", clearable=False, style={"width": "320px"}, options=SHIPPED
                    )
                ],
                style=_CONTROL,
                title="the probe set to score every head on: a shipped one, or the file you bring below",
            ),
            html.Button("Run probe set", id=AID.probe_run, n_clicks=0),
            html.Button("Cancel", id=AID.probe_cancel, n_clicks=0, style={"display": "none", "marginLeft": "6px"}),
            html.Progress(id=AID.probe_progress, value="0", max="1", style={"display": "none", "marginLeft": "8px"}),
            html.Span(id=AID.probe_progress_text, style={"marginLeft": "6px", "color": "#555"}),
            html.Div(
                [
                    html.Div(
                        dcc.Upload(
                            id=AID.probe_upload,
                            children=html.Div(
                                [
                                    "or bring your own: drop a probe file here, or ",
                                    html.A("choose one"),
                                    f" (up to {MAX_UPLOAD_BYTES >> 20} MB)",
                                ]
                            ),
                            max_size=MAX_UPLOAD_BYTES,
                            multiple=False,
                            style=_UPLOAD_STYLE,
                        ),
                        style=_CONTROL,
                        title="JSONL, CSV, TSV or Parquet: attnviz's own probes, or a public set's columns (choose its format)",
                    ),
                    html.Div(
                        [
                            html.Label("format ", style={"marginRight": "4px"}),
                            dcc.Dropdown(
                                id=AID.probe_format,
                                value="auto",
                                clearable=False,
                                options=[{"label": f, "value": f} for f in FORMATS],
                                style={"width": "170px", "display": "inline-block", "verticalAlign": "middle"},
                            ),
                        ],
                        style=_CONTROL,
                    ),
                ],
                style={"margin": "6px 0"},
            ),
            dcc.Store(id=AID.probe_source),
            dcc.Loading(html.Div(id=AID.probe_loaded, style={"margin": "4px 0", "whiteSpace": "pre-wrap"})),
            html.Div(
                [
                    html.Div("Probes that cannot be used (each with its reason):", style={"color": "#555"}),
                    dash_table.DataTable(id=AID.probe_problems, page_size=10, **TABLE_STYLE),
                ],
                id=AID.probe_problems_box,
                style=_HIDDEN,
            ),
            dcc.Loading(
                html.Div(id=AID.probe_summary, style={"margin": "8px 0", "fontFamily": MONO, "whiteSpace": "pre-wrap"})
            ),
            dcc.Store(id=AID.probe_result),
            dcc.Store(id=AID.probe_drill),
            html.Div(
                [
                    html.Div(
                        dcc.Graph(id=AID.probe_intervals, figure=not_yet("Run probe set: each head's accuracy here")),
                        style=_HALF,
                    ),
                    html.Div(dcc.Graph(id=AID.probe_map, figure=not_yet()), style=_HALF),
                ]
            ),
            html.Div(
                [
                    html.Label("list ", style={"marginRight": "4px"}),
                    dcc.Dropdown(
                        id=AID.probe_show,
                        value="all",
                        clearable=False,
                        searchable=False,
                        options=[{"label": label, "value": key} for key, label in SHOW.items()],
                        style={"width": "320px", "display": "inline-block", "verticalAlign": "middle"},
                    ),
                ],
                style={"margin": "6px 0"},
            ),
            html.Div(id=AID.probe_note, style={"margin": "6px 0", "color": "#555"}),
            dash_table.DataTable(
                id=AID.probe_table,
                page_action="custom",  # the server cuts the pages: a set of thousands of probes sends one at a time
                page_current=0,
                page_size=PAGE,
                page_count=1,
                css=[{"selector": "td.dash-cell", "rule": "cursor: pointer;"}],
                style_data={"whiteSpace": "normal", "height": "auto"},
                style_cell_conditional=[{"if": {"column_id": "text"}, "textAlign": "left", "minWidth": "260px"}],
                **TABLE_STYLE,
            ),
        ]
    )


def register(app: Dash, captures: Captures) -> None:
    runs = ProbeRuns(captures.folder / "probes")  # uploads and results, on the server (the page holds keys)

    def read_probes(probe_set: str, source: dict | None, fmt: str | None) -> Any:
        """The probes ``probe_set`` names: a shipped set, or (``UPLOADED``) the page's uploaded file read in
        ``fmt``."""
        if probe_set == UPLOADED:
            path = runs.upload_path((source or {}).get("file"))
            try:
                return load_probes(path, format=None if fmt in (None, "auto") else str(fmt))
            except attnviz.AttnvizError as err:  # said with the file's name: the server's folder stays unsaid
                raise attnviz.InputError(str(err).replace(str(path), path.name)) from err
        if probe_set not in PROBE_SETS:
            raise attnviz.InputError(f"{str(probe_set)[:40]!r} is not a probe set here; choose one in the list")
        return load_probes(probe_set)

    @app.callback(
        Output(AID.probe_source, "data"),
        Output(AID.probe_upload, "contents"),
        Output(AID.probe_loaded, "children"),
        Output(AID.probe_problems, "data"),
        Output(AID.probe_problems, "columns"),
        Output(AID.probe_problems_box, "style"),
        Output(AID.probe_set, "options"),
        Output(AID.probe_set, "value"),
        Input(AID.probe_upload, "contents"),
        Input(AID.probe_format, "value"),
        State(AID.probe_upload, "filename"),
        State(AID.probe_source, "data"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (no_update, None, _error(m), [], [], _HIDDEN, no_update, no_update))
    def upload_probes(contents, fmt, filename, source):
        """An uploaded file goes to the server's folder (its contents leave the page: the Upload is
        cleared) and is read at once, in the chosen format; a new format reads the same file again."""
        if ctx.triggered_id == AID.probe_upload:
            if contents is None:  # the Upload cleared by this callback
                return (no_update,) * 8
            source = {"file": runs.save_upload(filename, contents), "name": str(filename)[:200]}
        elif not source:
            return (no_update,) * 8  # a format chosen before any upload: it applies to the next one
        options = [*SHIPPED, {"label": f"uploaded: {source['name']}", "value": UPLOADED}]
        try:
            loaded = read_probes(UPLOADED, source, fmt)
        except Exception as err:  # noqa: BLE001 - the file stays on the server: another format may read it
            return source, None, _error(page_message(err)), [], [], _HIDDEN, options, no_update
        summary, problems, total = load_rows(loaded)
        columns = [{"name": c, "id": c} for c in (problems[0] if problems else {})]
        shown = "" if total <= len(problems) else f" (the first {len(problems):,} of {total:,} listed)"
        loaded_line = html.Div(f"{summary}{shown}", className="probe-loaded")
        label = f"uploaded: {source['name']} ({len(loaded):,} probes)"
        options[-1] = {"label": label, "value": UPLOADED}
        box = {"display": "block", "margin": "4px 0"} if problems else _HIDDEN
        return source, None, loaded_line, problems, columns, box, options, UPLOADED

    @app.callback(
        Output(AID.probe_summary, "children"),
        Output(AID.probe_map, "figure"),
        Output(AID.probe_intervals, "figure"),
        Output(AID.probe_result, "data"),
        Input(AID.probe_run, "n_clicks"),
        State(ID.store, "data"),
        State(AID.probe_set, "value"),
        State(AID.probe_source, "data"),
        State(AID.probe_format, "value"),
        State(AID.coref_sinks, "value"),
        State(ID.part, "value"),
        prevent_initial_call=True,
        background=True,  # the probes' forwards: a job beside the server, the page stays usable
        **job_controls(AID.probe_run, AID.probe_cancel, AID.probe_progress, AID.probe_progress_text),
    )
    @shows_errors(lambda m: (m, message_figure(m), message_figure(""), None))
    def run_probes(set_progress, _clicks, store, probe_set, source, fmt, sinks, part):
        """Score every head on the chosen set; the result stays on the server (``runs``), the page gets its
        summary, its two figures and its key."""
        set_progress(("0", "1", ""))
        if not store:
            return "Run the model first.", message_figure(""), message_figure(""), None
        model = store["model"]
        if model.startswith(FILE_PREFIX):
            return "Probe sets need a model; pick one in the model list.", message_figure(""), message_figure(""), None
        part = part if captures.self_part(store, part).model.get("encoder_decoder") else None  # refuses "cross"
        probes = read_probes(probe_set, source, fmt)

        def progress(done: int, total: int) -> None:
            set_progress((str(done), str(total), f"probe {done + 1} of {total}"))

        result = evaluate_probes(
            model,
            probes,
            add_bos=bool(store.get("bos")),  # the side panel's box, as every capture of the page (kept with the result)
            progress=False,
            exclude_sinks="sinks" in (sinks or []),
            part=part,
            on_progress=progress,
        )
        set_progress(("1", "1", ""))
        bos = bool(store.get("bos"))
        kept = {"key": runs.keep(result), "model": model, "part": part, "n": len(result.per_probe), "bos": bos}
        summary: Any = str(result)
        if result.skipped:  # the probes it could not score, and why (the summary counts them)
            skipped = skipped_lines(result)
            title = f"{len(result.skipped):,} probe{'s' * (len(result.skipped) != 1)} skipped when scoring: why"
            summary = [summary, html.Details([html.Summary(title), html.Ul([html.Li(line) for line in skipped])])]
        return summary, probe_accuracy_map(result), probe_intervals(result, top=INTERVAL_HEADS), kept

    @app.callback(
        Output(AID.probe_table, "data"),
        Output(AID.probe_table, "columns"),
        Output(AID.probe_table, "page_count"),
        Output(AID.probe_table, "page_current"),
        Output(AID.probe_table, "style_data_conditional"),
        Output(AID.probe_table, "active_cell"),
        Output(AID.probe_note, "children"),
        Input(AID.probe_result, "data"),
        Input(AID.probe_table, "page_current"),
        Input(AID.probe_show, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: ([], [], 1, 0, [], None, _error(m)))
    def probe_table(kept, page, show):
        """One page of the per-probe table over the probes ``show`` lists, cut on the server (a new result,
        or a new choice of probes, opens on the first page)."""
        if not kept:
            return [], [], 1, 0, [], None, ""
        result = runs.result(kept.get("key"))
        rows = shown_rows(result, show)
        page = 0 if ctx.triggered_id in (AID.probe_result, AID.probe_show) else page
        pages = page_count(result, rows)
        page = min(max(int(page or 0), 0), pages - 1)
        listed = (
            f"{len(rows):,} probes"
            if len(rows) == len(result.per_probe)
            else f"{len(rows):,} of {len(result.per_probe):,} probes"
        )
        note = (
            f"{listed}, {PAGE} a page: what each of the {TOP} best heads picked "
            f"({RIGHT} the gold antecedent, {WRONG} another candidate). Click a cell to open the probe's text in "
            "the AttentionLab with its pronoun as the query, at that column's head (else at the set's best head)."
        )
        return (
            table_page(result, page, rows=rows),
            table_columns(result),
            pages,
            page,
            table_styles(result),
            None,
            note,
        )

    @app.callback(
        Output(ID.text, "value", allow_duplicate=True),
        Output(ID.target, "value", allow_duplicate=True),
        Output(ID.bos, "value", allow_duplicate=True),
        Output(ID.model, "value", allow_duplicate=True),
        Output(ID.run, "n_clicks", allow_duplicate=True),
        Output(AID.probe_drill, "data"),
        Input(AID.probe_table, "active_cell"),
        State(AID.probe_result, "data"),
        State(ID.model, "value"),
        State(ID.run, "n_clicks"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def open_probe(cell, kept, model, clicks):
        """A click on a probe's row: its text goes into the page's text box and is run as the page runs any
        text (Run model, on the model that scored the set, with the BOS the set was scored with; an
        encoder-decoder's decoder reads it as the target, as the evaluator gave it); its pronoun and the
        chosen head wait in the drill store for that capture (:func:`show_probe`)."""
        if not cell or not kept or cell.get("row_id") is None:
            return (no_update,) * 6
        result = runs.result(kept.get("key"))
        row = int(cell["row_id"])
        if not 0 <= row < len(result.per_probe):
            raise attnviz.InputError(f"probe row {row} is not in this result; run the probe set again")
        layer, head = chosen_head(result, row, cell.get("column_id"))
        text, start, end = lab_text(str(result.per_probe.iloc[row]["text"]), *pronoun_range(result, row))
        scored, part = kept["model"], kept.get("part")
        bos = bool(kept.get("bos", True))  # the BOS it was scored with (a result kept before it was noted: one)
        captures.check_model(scored)
        target = text if part == "decoder" else None
        drill = {
            "key": captures.key(scored, text, bos, target),
            "part": part,
            "start": start,
            "end": end,
            "layer": layer,
            "head": head,
        }
        return (
            text,
            no_update if part is None else target or "",  # the encoder of an encoder-decoder reads no target
            ["bos"] if bos else [],
            no_update if scored == model else scored,
            (clicks or 0) + 1,
            drill,
        )

    @app.callback(
        Output(ID.lab_query, "data", allow_duplicate=True),
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.part, "value", allow_duplicate=True),
        Output(ID.tabs, "value", allow_duplicate=True),
        Output(AID.probe_drill, "data", allow_duplicate=True),
        Input(ID.store, "data"),
        State(AID.probe_drill, "data"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def show_probe(store, drill):
        """The probe's capture is the page's now: the Lab opens on its pronoun's token (in the part the set
        was scored on) at the chosen head. Any other capture (the user ran another text meanwhile) drops the
        drill-down."""
        if not drill:
            return (no_update,) * 6
        if not store or store.get("key") != drill.get("key"):
            return (no_update,) * 5 + (None,)
        cap = captures.from_store(store)
        part = drill.get("part")
        queries = cap.sequences(part)[0] if part is not None and len(cap.parts) > 1 else cap
        token = pronoun_token(queries, int(drill["start"]), int(drill["end"]))
        shown_part = no_update if part is None else part
        return token, int(drill["layer"]), int(drill["head"]), shown_part, "lab", None


def _error(message: str) -> html.Div:
    return html.Div(message, role="alert", style={"color": "#b00020"})


registers(View("probes", None, order=75, register=lambda app, server: register(app, server.captures)))
