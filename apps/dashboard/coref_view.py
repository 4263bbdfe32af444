"""Coreference: which word does the pronoun point to? Every head ranked by the pronoun's attention to
each candidate (with how much the head gives that candidate from the other tokens), and probe sets
— a shipped one or the researcher's own file — run as a background job with progress and Cancel.

The probe-set section keeps its data on the server (``probe_runs.ProbeRuns``): an uploaded file is
written to the server's folder and read there (its summary and every unusable probe with its reason
shown), and a result stays there too — the page holds its key. The result is shown as its summary
(intervals, held-out estimate, tests, heads beating chance after Holm), the top heads' interval bars
beside the accuracy map, and a per-probe table of what the top heads picked (✓/✗), cut into pages
on the server (``probe_table``). A click on a probe's cell opens it in the AttentionLab: its text goes
into the text box and is run as any text is, then the Lab selects the pronoun's token as the query
and that column's head (the probe's own best head in its column; the set's best elsewhere).

A long text keeps every response small (≤ 2 MB whatever its length) and hides nothing the model computed:

- the word chips come a page of ``CHIP_PAGE`` words at a time; a list above them reaches every page,
  and it opens on the pronoun's page (again whenever the pronoun changes);
- the best head's map (:func:`coref_map`) is the word map up to ``LONG`` words; past it, the exact
  token weights of the window from the first candidate to the pronoun (``figures.window_figure``),
  or, when they lie more than ``WINDOW`` tokens apart, the head's pooled overview
  (``figures.overview_figure``, ``OVERVIEW_BLOCKS`` blocks a side) — the title says which, and the
  Heatmap tab zooms anywhere in the same head at full resolution.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import ALL, Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

import attnviz
from attnviz import evaluate_probes, figures
from attnviz.analysis import propose_candidates, rank_heads
from attnviz.analysis.probes import PROBE_FORMATS, PROBE_SETS, load_probes
from attnviz.figures import coref_bars, message_figure, new_start, probe_accuracy_map, probe_intervals

from .captures import FILE_PREFIX, Captures
from .common import TABLE_STYLE, chip, job_controls, word_of
from .errors import only_on, page_message, shows_errors
from .ids import AID, ID
from .panels import slot_panels
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

VIEWS = [("coref", "Coreference")]
_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}
_HIDDEN = {"display": "none"}
_PAGE_STYLE = {"width": "420px", "margin": "6px 0"}
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

LONG = 512  # more words than this: no word map (n_words² cells; the Heatmap view's threshold too)
WINDOW = 512  # tokens a side of the exact window from the first candidate to the pronoun, at most
CONTEXT = 64  # tokens a side of that window at least (a pronoun right after its candidate keeps context)
OVERVIEW_BLOCKS = 256  # blocks a side of the pooled overview (~0.5 MB; the response carries the table too)
INTERVAL_HEADS = 15  # heads whose accuracy intervals the probe view plots
CHIP_PAGE = 400  # word chips on the page at once (one button each: thousands for a long text)


def page_options(cap: attnviz.Capture, pronoun: int | None) -> list[dict]:
    """The chips' pages: ``CHIP_PAGE`` words each, named by their word range (the pronoun's page says so)."""
    n = len(cap.words)
    options = []
    for page, start in enumerate(range(0, n, CHIP_PAGE)):
        stop = min(start + CHIP_PAGE, n)
        mine = " — the pronoun's" if pronoun is not None and start <= pronoun < stop else ""
        label = f"words {start:,}–{stop - 1:,} of {n:,} ({cap.words[start].text.strip()!r} …){mine}"
        options.append({"label": label, "value": page})
    return options


def coref_map(cap: attnviz.Capture, layer: int, head: int, pronoun: int, candidates: list[int]) -> go.Figure:
    """The best head's map in the Coreference view, bounded whatever the text's length: the word map
    up to ``LONG`` words; past it the exact token window from the first candidate to the pronoun (at
    least ``CONTEXT`` and at most ``WINDOW`` tokens a side), else the head's pooled token overview."""
    n_words = len(cap.words)
    if n_words <= LONG:
        return figures.heatmap(cap, layer, head, words=True)
    first = min(cap.words[i].token_start for i in [*candidates, pronoun])
    stop = cap.words[pronoun].token_stop
    heatmap_tab = "the Heatmap tab zooms anywhere in this head"
    if stop - first <= WINDOW:
        start = max(0, stop - max(stop - first, CONTEXT))
        hint = (
            f"{n_words:,} words, too many for a word map: the exact token weights from the first candidate "
            f"to the pronoun; {heatmap_tab}"
        )
        return figures.window_figure(cap, layer, head, (start, stop), (start, stop), hint=hint)
    hint = (
        f"{n_words:,} words, too many for a word map, and the candidates lie more than {WINDOW} tokens before "
        f"the pronoun: the pooled map; {heatmap_tab} at full resolution"
    )
    return figures.overview_figure(cap, layer, head, size=OVERVIEW_BLOCKS, hint=hint)


def layout() -> list:
    return [
        dcc.Store(id=AID.coref_selection),
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
        dcc.Store(id=AID.coref_word_page_of),
        dcc.Dropdown(id=AID.coref_word_page, clearable=False, searchable=False, style=_HIDDEN),
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
        dash_table.DataTable(id=AID.coref_table, sort_action="native", page_size=15, **TABLE_STYLE),
        dcc.Graph(id=AID.coref_heatmap),
        *slot_panels("coref", "test"),  # test it on the model, and the head-importance map (edit_view)
        html.H4("Probe set: every head's accuracy at picking the gold antecedent"),
        html.Div(
            [dcc.Dropdown(id=AID.probe_set, value="en", clearable=False, style={"width": "320px"}, options=SHIPPED)],
            style=_CONTROL,
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
            html.Div(
                id=AID.probe_summary, style={"margin": "8px 0", "fontFamily": "monospace", "whiteSpace": "pre-wrap"}
            )
        ),
        dcc.Store(id=AID.probe_result),
        dcc.Store(id=AID.probe_drill),
        html.Div(
            [
                html.Div(dcc.Graph(id=AID.probe_intervals), style=_HALF),
                html.Div(dcc.Graph(id=AID.probe_map), style=_HALF),
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


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(AID.coref_selection, "data"),
        Input(ID.store, "data"),
        Input(ID.lab_query, "data"),
        Input(ID.part, "value"),
    )
    @shows_errors(lambda _m: None)  # the run callback (or the view) reports a capture that fails
    def default_selection(store, query, part):
        cap = captures.self_part(store, part)
        if cap is None or query is None:
            return None
        pronoun = word_of(cap, min(query, cap.n_tokens - 1))
        spans = propose_candidates(cap, pronoun)
        candidates = sorted({word_of(cap, s.tokens[0]) for s in spans})
        return {"pronoun": pronoun, "candidates": candidates}

    @app.callback(
        Output(AID.coref_word_page, "options"),
        Output(AID.coref_word_page, "value"),
        Output(AID.coref_word_page, "style"),
        Output(AID.coref_word_page_of, "data"),
        Input(ID.store, "data"),
        Input(AID.coref_selection, "data"),
        Input(ID.part, "value"),
        Input(ID.tabs, "value"),
        State(AID.coref_word_page, "value"),
        State(AID.coref_word_page_of, "data"),
    )
    @shows_errors(lambda _m: ([], None, _HIDDEN, None))
    def word_pages(store, selection, part, tab, page, page_of):
        only_on(tab, "coref")
        cap = captures.self_part(store, part)
        if cap is None or not selection:
            return [], None, _HIDDEN, None
        pronoun = selection["pronoun"]
        if len(cap.words) <= CHIP_PAGE:
            return [], 0, _HIDDEN, pronoun
        pages = -(-len(cap.words) // CHIP_PAGE)
        if page_of != pronoun or not isinstance(page, int) or not 0 <= page < pages:
            page = pronoun // CHIP_PAGE  # a new pronoun (or text): its page; a candidate's click keeps the page
        return page_options(cap, pronoun), page, _PAGE_STYLE, pronoun

    @app.callback(
        Output(AID.coref_words, "children"),
        Input(ID.store, "data"),
        Input(AID.coref_selection, "data"),
        Input(ID.part, "value"),
        Input(ID.tabs, "value"),
        Input(AID.coref_word_page, "value"),
    )
    @shows_errors(lambda _m: [])
    def coref_words(store, selection, part, tab, page):
        only_on(tab, "coref")  # chips are built only where they are seen, a page at a time
        cap = captures.self_part(store, part)
        if cap is None or not selection:
            return []
        if not isinstance(page, int) or page * CHIP_PAGE >= len(cap.words):
            page = selection["pronoun"] // CHIP_PAGE
        start = page * CHIP_PAGE
        chips = []
        first_new = new_start(cap, words=True)  # a generation's first new word (None otherwise)
        for i, w in enumerate(cap.words[start : start + CHIP_PAGE], start):
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
        Input(ID.store, "data"),
        Input(AID.coref_selection, "data"),
        Input(AID.coref_sinks, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    @shows_errors(lambda m: (m, message_figure(m), [], [], message_figure("")))
    def coreference(store, selection, sinks, tab, part):
        only_on(tab, "coref")
        cap = captures.self_part(store, part)
        if cap is None or not selection:
            return "Run the model first.", message_figure(""), [], [], message_figure("")
        if not selection["candidates"]:
            return ("Click at least one candidate word.", message_figure(""), [], [], message_figure(""))
        ranking = rank_heads(cap, selection["pronoun"], selection["candidates"], exclude_sinks="sinks" in (sinks or []))
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
        heat = coref_map(cap, int(best["layer"]), int(best["head"]), selection["pronoun"], selection["candidates"])
        return headline, coref_bars(ranking), table.to_dict("records"), columns, heat

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
            model, probes, progress=False, exclude_sinks="sinks" in (sinks or []), part=part, on_progress=progress
        )
        set_progress(("1", "1", ""))
        kept = {"key": runs.keep(result), "model": model, "part": part, "n": len(result.per_probe)}
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
        captures.check_model(scored)
        target = text if part == "decoder" else None
        drill = {
            "key": captures.key(scored, text, True, target),
            "part": part,
            "start": start,
            "end": end,
            "layer": layer,
            "head": head,
        }
        return (
            text,
            no_update if part is None else target or "",  # the encoder of an encoder-decoder reads no target
            ["bos"],
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

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Input(AID.coref_table, "active_cell"),
        prevent_initial_call=True,
    )
    def select_head(cell):
        if not cell or not cell.get("row_id"):
            return no_update
        layer, head = (int(x) for x in str(cell["row_id"]).split("-"))
        return layer, head


def _error(message: str) -> html.Div:
    return html.Div(message, role="alert", style={"color": "#b00020"})
