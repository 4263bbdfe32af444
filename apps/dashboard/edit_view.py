"""Counterfactual attention in the page: the AttentionLab's switches, temperature and knocked-out keys
applied to the real model (``attnviz.intervene``), the coreference view's "test it" (knock the pronoun's
attention to a candidate out of its top heads), and a head-importance map (``attnviz.head_importance``).
"Apply to the model" and the head-importance map run as background jobs (Dash's, in another process)
with progress and Cancel: forwards of the whole text, minutes at 8,192 tokens.

The panels sit in the AttentionLab and the Coreference view through the panel registry (``panels.py``:
``lab_panel()`` in ``("lab", "apply")``, ``coref_panel()`` in ``("coref", "test")``); the callbacks are
registered here.
"""

from __future__ import annotations

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

import attnviz
from attnviz import edits, figures
from attnviz.analysis import rank_heads
from attnviz.figures import message_figure

from .captures import Captures
from .common import job_controls, not_yet, word_of
from .edit_text import (
    check_line,
    continuation_of,
    edited_row,
    lab_edits,
    model_of,
    named,
    result_lines,
    tokens_of,
)
from .errors import shows_errors
from .ids import AID, EID, ID
from .panels import adds_panel
from .registry import View, registers

_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "middle"}
_RESULT = {"margin": "6px 0", "fontSize": "1.05em"}
TOP_HEADS = 5  # the coreference test knocks the pronoun → candidate out of this many top heads by default


def _continuation_input(element_id: str, placeholder: str) -> html.Div:
    """A box for the continuation whose probability the page reports (its text as it follows the text)."""
    return html.Div(
        [
            html.Label("continuation ", htmlFor=element_id),
            dcc.Input(id=element_id, type="text", placeholder=placeholder, debounce=True, style={"width": "140px"}),
        ],
        style=_CONTROL,
    )


@adds_panel("lab", "apply")
def lab_panel() -> html.Div:
    """The AttentionLab's "apply to the model" controls and results."""
    return html.Div(
        [
            html.H4("Apply to the model: what would it predict?"),
            html.P(
                "The switches and the temperature above, and the keys you knock out (click a bar of the "
                "row), act on the real model here: the chosen heads run through attnviz's own SDPA with "
                "the change, every other head is the model's own kernel, and the page shows the next "
                "token before and after. Before editing, attnviz checks that its SDPA without a change "
                "reproduces the model's output on those layers.",
                style={"color": "#555"},
            ),
            dcc.Store(id=EID.lab_knock, data=[]),
            html.Div(
                [
                    html.Span("apply to ", style={"marginRight": "4px"}),
                    dcc.RadioItems(
                        id=EID.lab_scope,
                        value="head",
                        inline=True,
                        options=[
                            {"label": " this head ", "value": "head"},
                            {"label": " every head of this layer ", "value": "layer"},
                            {"label": " every layer", "value": "all"},
                        ],
                        style={"display": "inline-block"},
                    ),
                ],
                style=_CONTROL,
            ),
            html.Div(
                [
                    html.Span(id=EID.lab_knock_text, style={"marginRight": "6px"}),
                    html.Button("clear knockouts", id=EID.lab_knock_clear, n_clicks=0),
                ],
                style=_CONTROL,
            ),
            _continuation_input(EID.lab_continuation, "e.g. 好 (optional)"),
            html.Button("Apply to the model", id=EID.lab_apply, n_clicks=0, className="primary"),
            html.Button("Cancel", id=EID.lab_apply_cancel, n_clicks=0, style={"display": "none"}),
            html.Progress(id=EID.lab_apply_progress, value="0", max="1", style={"display": "none"}),
            html.Span(id=EID.lab_apply_progress_text, style={"marginLeft": "6px", "color": "#555"}),
            dcc.Loading(html.Div(id=EID.lab_result, style=_RESULT)),
            html.Div(
                [
                    dcc.Graph(
                        id=EID.lab_predictions,
                        figure=not_yet("Apply to the model: the next token's probabilities before and after here"),
                        style={"display": "inline-block", "width": "48%"},
                    ),
                    dcc.Graph(id=EID.lab_row, figure=not_yet(), style={"display": "inline-block", "width": "52%"}),
                ]
            ),
        ],
        style={"borderTop": "1px solid #ddd", "marginTop": "14px", "paddingTop": "6px"},
    )


@adds_panel("coref", "test")
def coref_panel() -> html.Div:
    """The Coreference view's "test it" and head-importance controls and results."""
    return html.Div(
        [
            html.H4("Test it on the model"),
            html.P(
                "A head that attends from the pronoun to a candidate need not be what the prediction rests "
                "on. Knock the pronoun's attention to the candidate out of its top-ranked heads and see "
                "whether the next token changes; or ablate every head in turn and map how much the "
                "continuation's probability needs each one.",
                style={"color": "#555"},
            ),
            html.Div(
                [
                    html.Label("candidate "),
                    dcc.Dropdown(id=EID.coref_candidate, clearable=False, style={"width": "160px"}),
                ],
                style={**_CONTROL, "display": "inline-flex", "alignItems": "center", "gap": "4px"},
            ),
            html.Div(
                [
                    html.Label("top heads ", htmlFor=EID.coref_top),
                    dcc.Input(
                        id=EID.coref_top, type="number", min=1, max=64, step=1, value=TOP_HEADS, style={"width": "60px"}
                    ),
                ],
                style=_CONTROL,
            ),
            _continuation_input(EID.coref_continuation, "e.g. 好"),
            html.Button("Test it", id=EID.coref_test, n_clicks=0),
            dcc.Loading(html.Div(id=EID.coref_result, style=_RESULT)),
            dcc.Graph(
                id=EID.coref_predictions, figure=not_yet("Test it: the next token with and without those heads here")
            ),
            html.Div(
                [
                    html.Button("Map head importance", id=EID.importance_run, n_clicks=0),
                    html.Button(
                        "Cancel", id=EID.importance_cancel, n_clicks=0, style={"display": "none", "marginLeft": "6px"}
                    ),
                    html.Progress(
                        id=EID.importance_progress, value="0", max="1", style={"display": "none", "marginLeft": "8px"}
                    ),
                    html.Span(id=EID.importance_progress_text, style={"marginLeft": "6px", "color": "#555"}),
                ],
                style={"margin": "8px 0"},
            ),
            html.Div(id=EID.importance_note, style=_RESULT),
            dcc.Graph(
                id=EID.importance_map,
                figure=not_yet(
                    "Map head importance: how much the continuation's log P drops as each head is ablated, here"
                ),
            ),
        ],
        style={"borderTop": "1px solid #ddd", "marginTop": "14px", "paddingTop": "6px"},
    )


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(EID.lab_knock, "data"),
        Input(ID.lab_graph, "clickData"),
        Input(EID.lab_knock_clear, "n_clicks"),
        Input(ID.store, "data"),
        State(EID.lab_knock, "data"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def knock(click, _clear, store, knocked, units, part):
        """A click on a bar of the lab's row knocks that key out (again: back in); a new run clears them."""
        if ctx.triggered_id != ID.lab_graph or not click or not click.get("points"):
            return []
        cap = captures.from_store(store)
        if cap is None:
            return []
        _, keys = cap.sequences(part if len(cap.parts) > 1 else None)
        index = int(click["points"][0]["x"])
        tokens = set(tokens_of(keys, index, units == "words"))
        knocked = set(knocked or [])
        return sorted(knocked - tokens if tokens <= knocked else knocked | tokens)

    @app.callback(
        Output(EID.lab_knock_text, "children"),
        Input(EID.lab_knock, "data"),
        Input(ID.words, "value"),
        State(ID.store, "data"),
        State(ID.part, "value"),
    )
    @shows_errors(lambda m: m)
    def knock_text(knocked, units, store, part):
        if not knocked:
            return "knocked out: none (click a bar of the row)"
        cap = captures.from_store(store)
        if cap is None:
            return ""
        _, keys = cap.sequences(part if len(cap.parts) > 1 else None)
        labels = keys.token_labels
        out = set(knocked)
        named = []
        for word in keys.words if units == "words" else []:  # in words a whole word is named, not its pieces
            pieces = set(range(word.token_start, word.token_stop))
            if pieces <= out:
                named.append((word.token_start, word.text))
                out -= pieces
        named += [(i, labels[i]) for i in out if i < len(labels)]
        return "knocked out: " + ", ".join(label for _, label in sorted(named))

    @app.callback(
        Output(EID.lab_result, "children"),
        Output(EID.lab_predictions, "figure"),
        Output(EID.lab_row, "figure"),
        Input(EID.lab_apply, "n_clicks"),
        State(ID.store, "data"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        State(ID.words, "value"),
        State(ID.lab_query, "data"),
        State(ID.lab_switches, "value"),
        State(ID.lab_temperature, "value"),
        State(ID.part, "value"),
        State(EID.lab_scope, "value"),
        State(EID.lab_knock, "data"),
        State(EID.lab_continuation, "value"),
        prevent_initial_call=True,
        background=True,  # forwards of the whole text (minutes at 8,192 tokens): a job beside the server
        interval=300,
        **job_controls(EID.lab_apply, EID.lab_apply_cancel, EID.lab_apply_progress, EID.lab_apply_progress_text),
    )
    @shows_errors(lambda m: (m, message_figure(m), message_figure("")))
    def apply_lab(
        set_progress, _clicks, store, layer, head, units, query, switches, log_t, part, scope, knocked, continuation
    ):
        set_progress(("0", "1", ""))
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None or query is None:
            return "Run the model, then click a token.", message_figure(""), message_figure("")
        model = model_of(store)
        part = part if len(cap.parts) > 1 else None
        words = units == "words"
        queries, _ = cap.sequences(part)
        token = min(query, queries.n_tokens - 1)
        index = word_of(queries, token) if words else token
        query_tokens = tokens_of(queries, index, words)
        chosen, notes = lab_edits(cap, layer, head, part, query_tokens, switches, log_t, scope, knocked)
        if not chosen:
            return (
                " ".join(
                    [
                        *notes,
                        "Nothing to apply: switch the causal mask or ÷√d_k off, change the temperature, or click a "
                        "bar of the row to knock that key out.",
                    ]
                ),
                message_figure(""),
                message_figure(""),
            )

        def progress(done: int, total: int) -> None:  # intervene's on_progress: the forwards it has run
            set_progress((str(done), str(total), f"forward {done} of {total}"))

        out = attnviz.intervene(model, cap, chosen, on_progress=progress)
        set_progress(("1", "1", ""))
        said = result_lines(out, continuation_of(continuation), notes)
        bars = figures.prediction_bars(out, 5, continuation_of(continuation))
        return said, bars, edited_row(out, layer, head, index, words, part)

    @app.callback(
        Output(EID.coref_candidate, "options"),
        Output(EID.coref_candidate, "value"),
        Input(AID.coref_selection, "data"),
        State(ID.store, "data"),
        State(ID.part, "value"),
    )
    @shows_errors(lambda _m: ([], None))
    def candidates(selection, store, part):
        cap = captures.self_part(store, part)
        if cap is None or not selection or not selection.get("candidates"):
            return [], None
        options = [{"label": cap.words[i].text, "value": i} for i in selection["candidates"]]
        return options, options[0]["value"]

    @app.callback(
        Output(EID.coref_result, "children"),
        Output(EID.coref_predictions, "figure"),
        Input(EID.coref_test, "n_clicks"),
        State(ID.store, "data"),
        State(AID.coref_selection, "data"),
        State(AID.coref_sinks, "value"),
        State(ID.part, "value"),
        State(EID.coref_candidate, "value"),
        State(EID.coref_top, "value"),
        State(EID.coref_continuation, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (m, message_figure(m)))
    def test_it(_clicks, store, selection, sinks, part, candidate, top, continuation):
        cap = captures.self_part(store, part)
        if cap is None or not selection or candidate is None or candidate not in selection["candidates"]:
            return "Choose the pronoun and a candidate above.", message_figure("")
        model = model_of(store)
        if not isinstance(top, (int, float)) or isinstance(top, bool) or not 1 <= top <= 64 or top != int(top):
            # the field gives None for 0, 9999 or an empty box: said, not replaced by the default
            raise attnviz.InputError("Top heads: type a whole number from 1 to 64.")
        top = int(top)
        ranking = rank_heads(cap, selection["pronoun"], selection["candidates"], exclude_sinks="sinks" in (sinks or []))
        name = cap.words[candidate].text
        heads = ranking.for_candidate(name).head(top)
        whole = captures.from_store(store)  # a decoder-only model's edits name no part ("(decoder)" read oddly)
        the_part = cap.parts[0] if len(cap.parts) == 1 and len(whole.parts) > 1 else None
        pronoun = list(cap.words[selection["pronoun"]].tokens)
        key = list(cap.words[candidate].tokens)
        pronoun_named, key_named = named(cap.source, pronoun), named(cap.source, key)
        chosen = [
            edits.knockout(layer=int(r.layer), head=int(r.head), query=pronoun_named, key=key_named, part=the_part)
            for r in heads.itertuples(index=False)
        ]
        out = attnviz.intervene(model, whole, chosen)  # the whole capture, not one part
        where = ", ".join(f"L{int(r.layer)}·H{int(r.head)}" for r in heads.itertuples(index=False))
        said = [
            html.Div(
                f"Knocked out {cap.words[selection['pronoun']].text} → {name} in its top {len(chosen)} heads ({where}).",
                style={"fontWeight": "bold"},
            )
        ]
        if out.before is not None and out.after is not None:
            b, a = out.before.top_tokens(1)[0], out.after.top_tokens(1)[0]
            verdict = "unchanged" if b.id == a.id else "changed"
            said.append(
                html.Div(f"Next token: {b.token!r} {b.probability:.2f} → {a.token!r} {a.probability:.2f} ({verdict}).")
            )
        cont = continuation_of(continuation)
        if cont is not None and out.before is not None:
            before, after = out.logprob(cont)
            said.append(html.Div(f"log P({cont!r}): {before:.2f} → {after:.2f} (Δ {after - before:+.2f})."))
        said.append(html.Div(check_line(out), style={"color": "#555", "fontSize": "0.9em"}))
        return html.Div(said), figures.prediction_bars(out, 5, cont)

    @app.callback(
        Output(EID.importance_note, "children"),
        Output(EID.importance_map, "figure"),
        Input(EID.importance_run, "n_clicks"),
        State(ID.store, "data"),
        State(ID.part, "value"),
        State(EID.coref_continuation, "value"),
        prevent_initial_call=True,
        background=True,  # every head ablated in turn: a job beside the server, the page stays usable
        **job_controls(
            EID.importance_run, EID.importance_cancel, EID.importance_progress, EID.importance_progress_text
        ),
    )
    @shows_errors(lambda m: (m, message_figure(m)))
    def importance(set_progress, _clicks, store, part, continuation):
        set_progress(("0", "1", ""))
        cont = continuation_of(continuation)
        if cont is None:
            return "Type the continuation whose probability the heads are ranked by (e.g. 好).", message_figure("")
        cap = captures.from_store(store)
        model = model_of(store)

        def progress(done: int, total: int) -> None:
            set_progress((str(done), str(total), f"{done} of {total} heads ablated"))

        table = attnviz.head_importance(model, cap, cont, progress=False, on_progress=progress)
        set_progress(("1", "1", ""))
        shown = part if "part" in table.columns and part in set(table["part"]) else None
        top = table.iloc[0]
        note = (
            f"log P({cont!r}) = {table.attrs['logprob']:.2f}; without L{int(top['layer'])}·H{int(top['head'])} it drops "
            f"by {float(top['logprob_drop']):.2f} — the head this continuation needs most. Click a cell to select the head."
        )
        return note, figures.importance_map(table, part=shown)

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Input(EID.importance_map, "clickData"),
        prevent_initial_call=True,
    )
    def select_head(click):
        if not click or not click.get("points"):
            return no_update, no_update
        point = click["points"][0]
        return int(point["y"]), int(point["x"])


registers(View("edit", None, order=136, register=lambda app, server: register(app, server.captures)))
