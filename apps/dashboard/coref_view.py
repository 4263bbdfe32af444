"""Coreference: which word does the pronoun point to? Every head ranked by the pronoun's attention to
each candidate (with how much the head gives that candidate from the other tokens). Probe sets — every
head scored on many texts — are a panel of this tab (``probe_view``, in the slot ``("coref", "probes")``).

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

import plotly.graph_objects as go
from dash import ALL, Dash, Input, Output, State, ctx, dash_table, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.analysis import propose_candidates, rank_heads
from attnviz.figures import coref_bars, message_figure
from attnviz.figures.helpers import new_start

from .captures import Captures
from .common import TABLE_STYLE, chip, word_of
from .errors import only_on, shows_errors
from .ids import AID, ID
from .panels import slot_panels
from .registry import View, registers

_HIDDEN = {"display": "none"}
_PAGE_STYLE = {"width": "420px", "margin": "6px 0"}
LONG = 512  # more words than this: no word map (n_words² cells; the Heatmap view's threshold too)
WINDOW = 512  # tokens a side of the exact window from the first candidate to the pronoun, at most
CONTEXT = 64  # tokens a side of that window at least (a pronoun right after its candidate keeps context)
OVERVIEW_BLOCKS = 256  # blocks a side of the pooled overview (~0.5 MB; the response carries the table too)
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
        *slot_panels("coref", "probes"),  # probe sets: every head scored on many texts (probe_view)
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


registers(
    View(
        "coref",
        "Coreference",
        order=70,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(),
        slots=("test", "probes"),
    )
)
