"""Why a cell is bright: click a cell of the heatmap (or, in the Lab, choose a key for the Lab's query) and its
score is taken apart
(:func:`attnviz.qk_attribution`) into the components that wrote the query and the key — the top of each
side and the top pairs as bars (:func:`attnviz.figures.attribution_bars`), the check's error beside
them — with one button that knocks the strongest head out with the existing edits
(:func:`attnviz.edits.ablate` through :func:`attnviz.intervene`) and shows what the score and the weight
really become beside the linear prediction (every norm's scale held): the attribution is linear, the
model is not, and the page shows both."""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.figures import message_figure

from .captures import Captures
from .edit_text import model_of
from .errors import only_on, shows_errors
from .ids import ID, OID, QKID
from .panels import adds_panel
from .registry import View, registers
from .ui import MONO

#: how many components and pairs the bars show
TOP = 8
_HIDDEN = {"display": "none"}
_SHOWN = {"marginTop": "6px"}


@adds_panel("heatmap", "why")
def panel() -> html.Div:
    """Below the heatmap: the clicked cell's attribution, hidden until a cell is clicked."""
    return html.Div(
        [
            dcc.Store(id=QKID.cell),
            html.Div(
                "Click a cell: why this query looks at this key — its score taken apart into what wrote the "
                "query and the key (embeddings, earlier heads, MLPs, biases).",
                id=QKID.note,
                style={"fontFamily": MONO, "margin": "6px 0"},
            ),
            dcc.Loading(dcc.Graph(id=QKID.bars, figure=message_figure(""), style=_HIDDEN)),
            html.Button(id=QKID.knock, n_clicks=0, style=_HIDDEN),
            dcc.Loading(html.Div(id=QKID.knocked, style={"fontFamily": MONO, "margin": "6px 0"})),
        ],
        id=QKID.panel,
    )


#: the Lab's key list is offered up to this many keys (the heatmap's cells reach any key of a shorter text)
LAB_KEYS = 1024


@adds_panel("lab", "apply")
def lab_panel() -> html.Div:
    """In the Lab, below the row: choose a key, and the query's score on it is taken apart."""
    return html.Div(
        [
            html.P(
                "Why does the query look at this key? Its score q·k/√d_k is a sum: each part of the model that "
                "wrote the query (the token, each earlier head, each MLP) dotted with each part that wrote the key, "
                "every norm's scale held as the forward read it. Choose a key to see the largest parts. On SmolLM2 "
                "with a random text seen twice, the induction head L18·H6 looks at the token after the first copy "
                "because the previous-token head L16·H0 wrote that key: +28.6 of a score of 11.45 (Why a head looks "
                "there, in the docs)."
            ),
            html.Label("Why this key? ", style={"marginRight": "6px"}),
            dcc.Dropdown(id=QKID.lab_key, options=[], value=None, placeholder="choose a key", style={"width": "320px"}),
            html.Div(id=QKID.lab_note, style={"fontFamily": MONO, "margin": "6px 0"}),
            dcc.Loading(dcc.Graph(id=QKID.lab_bars, figure=message_figure(""), style=_HIDDEN)),
        ],
        style={"marginTop": "10px"},
    )


def _token(seq, index: int, words: bool) -> int:
    """The token a clicked row or column stands for: itself, or a word's last token."""
    return seq.words[index].tokens[-1] if words else index


def _note(why) -> str:
    """The cell, the model's score, Σ pairs and the check's error, in one line."""
    return (
        f"L{why.layer}·H{why.head}: {why.tokens[0]!r} @{why.query} → {why.tokens[1]!r} @{why.key}. The model's "
        f"score {why.score:+.4f}; Σ pairs {why.total:+.4f}; check: relative error {why.error:.1e} "
        f"(tolerance {why.tolerance:.0e}) — over {len(why.labels)} components on each side."
    )


def _strongest_head(why) -> tuple[str, float]:
    """The head whose output, taken out of both streams with every norm's scale held, moves the score
    most — and by how much (its query side + its key side − its pair with itself)."""
    best, effect = "", 0.0
    for n, label in enumerate(why.labels):
        if ".H" not in label:
            continue
        moved = float(why.matrix[n].sum() + why.matrix[:, n].sum() - why.matrix[n, n])
        if abs(moved) > abs(effect) or not best:
            best, effect = label, moved
    return best, effect


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(QKID.note, "children"),
        Output(QKID.bars, "figure"),
        Output(QKID.bars, "style"),
        Output(QKID.cell, "data"),
        Output(QKID.knock, "children"),
        Output(QKID.knock, "style"),
        Output(QKID.knocked, "children"),
        Input(ID.heatmap, "clickData"),
        State(ID.store, "data"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        State(OID.view, "data"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (m, message_figure(""), _HIDDEN, None, "", _HIDDEN, ""))
    def explain(click, store, layer, head, units, part, view):
        point = (click or {}).get("points", [{}])[0]
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None or "x" not in point or "y" not in point:
            return (no_update,) * 7
        if view is not None:
            raise attnviz.InputError(
                "The score's attribution reads a cell of an exact map: this long text's heatmap shows pooled "
                "blocks. Capture a shorter text (the heatmap then shows every cell) to take a cell apart."
            )
        part_ = cap.resolve_part(part if len(cap.parts) > 1 else None)
        queries, keys = cap.sequences(part_)
        words = units == "words"
        query, key = _token(queries, int(point["y"]), words), _token(keys, int(point["x"]), words)
        why = attnviz.qk_attribution(model_of(store), cap, layer, head, query, key, part=part_)
        note = _note(why)
        label, effect = _strongest_head(why)
        cell = {"layer": layer, "head": head, "query": query, "key": key, "part": part_, "store": store["key"]}
        cell.update(top=label, score=why.score, predicted=why.score - effect)
        button = f"Knock out {label.replace('.', '·')} (linear: score {why.score:+.3f} → {why.score - effect:+.3f})"
        style = _SHOWN if label else _HIDDEN
        return note, figures.attribution_bars(why, TOP), _SHOWN, cell, button, style, ""

    @app.callback(
        Output(QKID.lab_key, "options"),
        Output(QKID.lab_key, "value"),
        Input(ID.store, "data"),
        Input(ID.part, "value"),
        Input(ID.tabs, "value"),
    )
    @shows_errors(lambda m: ([], None))
    def lab_keys(store, part, tab):
        only_on(tab, "lab")
        cap = captures.from_store(store)
        if cap is None:
            return [], None
        _, keys = cap.sequences(cap.resolve_part(part if len(cap.parts) > 1 else None))
        if keys.n_tokens > LAB_KEYS:
            return [], None
        return [{"label": f"{j}: {token}", "value": j} for j, token in enumerate(keys.tokens)], None

    @app.callback(
        Output(QKID.lab_note, "children"),
        Output(QKID.lab_bars, "figure"),
        Output(QKID.lab_bars, "style"),
        Input(QKID.lab_key, "value"),
        Input(ID.lab_query, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        State(ID.store, "data"),
        State(ID.part, "value"),
        State(ID.tabs, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (m, message_figure(""), _HIDDEN))
    def lab_explain(key, query, layer, head, store, part, tab):
        only_on(tab, "lab")
        cap = captures.from_store(store)
        if cap is None or key is None or query is None or layer is None or head is None:
            return "", message_figure(""), _HIDDEN
        part_ = cap.resolve_part(part if len(cap.parts) > 1 else None)
        queries, _ = cap.sequences(part_)
        why = attnviz.qk_attribution(
            model_of(store), cap, layer, head, min(query, queries.n_tokens - 1), key, part=part_
        )
        return _note(why), figures.attribution_bars(why, TOP), _SHOWN

    @app.callback(
        Output(QKID.knocked, "children", allow_duplicate=True),
        Input(QKID.knock, "n_clicks"),
        State(QKID.cell, "data"),
        State(ID.store, "data"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: m)
    def knock(clicks, cell, store):
        cap = captures.from_store(store)
        if not clicks or not cell or cap is None or cell.get("store") != store.get("key"):
            return no_update
        layer, head, query, key, part = (cell[k] for k in ("layer", "head", "query", "key", "part"))
        top_layer, top_head = (int(x) for x in cell["top"][1:].split(".H"))
        out = attnviz.intervene(model_of(store), cap, attnviz.edits.ablate(layer=top_layer, head=top_head, part=part))
        after = out.capture_after
        rec = after.layer(layer, part)
        kv = after.kv_head_of(head, part)
        score = float(rec.q[head, query].double() @ rec.k[kv, key].double()) * rec.scaling
        before = float(cap.attention(layer, head, part=part, rows=[query], cols=[key])[0, 0])
        weight = float(after.attention(layer, head, part=part, rows=[query], cols=[key])[0, 0])
        return (
            f"{cell['top'].replace('.', '·')} knocked out (attnviz.edits.ablate): the score becomes {score:+.4f} in "
            f"the model (the linear prediction, every norm's scale held: {cell['predicted']:+.4f}; before: "
            f"{cell['score']:+.4f}); the weight {before:.3f} → {weight:.3f}."
        )


registers(View("qk", None, order=15, register=lambda app, server: register(app, server.captures)))
