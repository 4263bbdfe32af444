"""The Compare view: the page's capture (A) beside a second text or a second model (B), at the page's
layer and head — ``attnviz.figures.compare_heads``, with A − B where the two grids have one size.

B runs through the page's own capture cache. The second text opens on the Winograd partner of the
trophy/suitcase sentence ("… too big." ↔ "… too small."); empty, it is A's text (two models, one text).
"""

from __future__ import annotations

import re

from dash import Dash, Input, Output, State, dcc, html, no_update

import attnviz
from attnviz import figures
from attnviz.figures import message_figure

from .captures import Captures
from .errors import only_on, shows_errors
from .ids import CID, ID
from .registry import View, registers

PREFIX = "Compare: "  # before the page message of a failed comparison (cleared by the next that works)
_SWAP = re.compile(r"\btoo (big|small)\b")


def partner(text: str | None) -> str | None:
    """The Winograd partner of the trophy/suitcase sentence ("too big" ↔ "too small"), else None."""
    if not isinstance(text, str):
        return None
    lower = text.lower()
    if "trophy" not in lower or "suitcase" not in lower or not _SWAP.search(text):
        return None
    return _SWAP.sub(lambda m: "too small" if m.group(1) == "big" else "too big", text)


def second_part(cap: attnviz.Capture, part: str | None) -> str | None:
    """B's part: the page's when B has it, else B's only one (or its first, for an encoder-decoder)."""
    if part in cap.parts:
        return part if len(cap.parts) > 1 else None
    return None if len(cap.parts) == 1 else cap.parts[0]


def compare_figure(
    a: attnviz.Capture,
    b: attnviz.Capture,
    layer: int,
    head: int,
    *,
    words: bool,
    part: str | None,
    measure: str = "weights",
) -> tuple:
    """(figure, message): the comparison (of the weights, or moved: ``measure="moved"``), or
    the library's message (as a figure too) when it fails."""
    try:
        part_a = part if len(a.parts) > 1 else None
        fig = figures.compare_heads(
            a,
            b,
            layer,
            head,
            words=words,
            part_a=part_a,
            part_b=second_part(b, part),
            names=("A", "B"),
            measure=measure,
        )
        return fig, ""
    except attnviz.AttnvizError as err:
        return message_figure(str(err)), str(err)


def layout(model_options: list[dict], default_model: str) -> list:
    """The Compare view's children: the second text and model, the button, the figure."""
    return [
        html.P(
            "A is the page's text and model; B is the text and model below (an empty text: A's). Both are shown "
            "at the page's layer and head, and where their grids have one size, A − B position by position.",
            style={"color": "#555"},
        ),
        dcc.Textarea(
            id=CID.text,
            value="",
            placeholder="B's text (empty: the page's text, to compare two models)",
            style={"width": "100%", "height": "50px"},
        ),
        html.Div(
            [
                html.Label("B's model ", style={"marginRight": "6px"}),
                dcc.Dropdown(
                    id=CID.model,
                    options=model_options,
                    value=default_model,
                    clearable=False,
                    style={"width": "300px", "display": "inline-block", "verticalAlign": "middle"},
                ),
                html.Button("Compare", id=CID.run, n_clicks=0, style={"marginLeft": "12px"}),
            ],
            style={"margin": "6px 0"},
        ),
        html.Div(id=CID.note, style={"color": "#555", "margin": "4px 0"}),
        dcc.Loading(dcc.Graph(id=CID.graph, config={"displaylogo": False})),
    ]


def _quote(text: str, most: int = 80) -> str:
    return f"“{text if len(text) <= most else text[:most] + '…'}”"


def register(app: Dash, captures: Captures) -> None:
    """The Compare view's callbacks: A is the page's capture, B runs through the same cache."""

    @app.callback(Output(CID.model, "value"), Input(ID.model, "value"), prevent_initial_call=True)
    def follow_model(model):
        return model or no_update

    @app.callback(
        Output(CID.text, "value"), Input(ID.store, "data"), State(CID.text, "value"), prevent_initial_call=True
    )
    @shows_errors(lambda _m: no_update)  # the views report a capture the server let go
    def fill_partner(store, current):
        cap = captures.from_store(store)  # the page's text is its capture's: the store holds only its key
        other = partner(cap.text if cap is not None else None)
        # fill an empty box, or replace a partner filled before; never a text the user typed
        if other is None or not (current is None or not current.strip() or partner(current) is not None):
            return no_update
        return other

    @app.callback(
        Output(CID.graph, "figure"),
        Output(CID.note, "children"),
        Output(ID.message, "children", allow_duplicate=True),
        Input(CID.run, "n_clicks"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.part, "value"),
        Input(ID.words, "value"),
        Input(ID.tabs, "value"),
        Input(ID.measure, "value"),
        State(CID.text, "value"),
        State(CID.model, "value"),
        State(ID.message, "children"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (message_figure(m), "", PREFIX + m))
    def compare(clicks, store, layer, head, part, units, tab, measure, text, model, message):
        only_on(tab, "compare")
        ours = isinstance(message, str) and message.startswith(PREFIX)
        clear = "" if ours else no_update
        if not clicks:
            return message_figure("Type B's text or pick B's model, then press Compare."), "", no_update
        a = captures.from_store(store)
        if a is None or layer is None or head is None:
            return message_figure("Run the model first."), "", no_update
        text_b = text.strip() if isinstance(text, str) and text.strip() else a.text
        model_b = model or store["model"]
        b = captures.get(model_b, text_b, bool(store.get("bos")))
        fig, problem = compare_figure(
            a, b, layer, head, words=units == "words", part=part, measure=measure or "weights"
        )
        note = (
            f"A: {a.model.get('name')} on {_quote(a.text)} ({a.n_tokens} tokens) · "
            f"B: {b.model.get('name')} on {_quote(b.text)} ({b.n_tokens} tokens)"
        )
        return fig, note, PREFIX + problem if problem else clear


registers(
    View(
        "compare",
        "Compare",
        order=130,
        register=lambda app, server: register(app, server.captures),
        layout=lambda page: layout(page.model_options, page.default_model),
    )
)
