"""Generation in the dashboard: the "Continue the text" control and the AttentionLab's step slider that
replays a generation token by token (its figure: ``attnviz.figures.step_figure``). The generated tokens'
marks are drawn by the library's figures themselves (``mark_new=``, ``attnviz.figures.helpers.MARK``).

Its panels sit in other views' layouts through the panel registry (``panels.py``): the "Continue the
text" control beside "Run model" (``("run", "generate")``), the step slider in the AttentionLab
(``("lab", "steps")``). ``step_marks`` is pure, tested without a browser; ``generation_of`` and the page's
bound on new tokens live in ``generations.py``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from attnviz.figures import message_figure, step_figure
from attnviz.figures.helpers import MARK, NEW_COLOUR, new_start, step_summary

from .errors import only_on, shows_errors
from .generations import MAX_NEW_TOKENS, generation_of, new_tokens_input
from .ids import GID, ID
from .panels import adds_panel
from .registry import View, registers
from .ui import field

if TYPE_CHECKING:
    from .captures import Captures

DEFAULT_NEW_TOKENS = 20


# ---------------------------------------------------------------- the step slider
def step_marks(n: int, most: int = 11) -> dict[int, str]:
    """Slider marks for ``n`` steps: every step when few, else about ``most`` evenly spaced, the last included."""
    if n <= 0:
        return {}
    every = max(1, math.ceil(n / most))
    marks = {i: str(i) for i in range(0, n, every)}
    if n - 1 not in marks and n > 1:
        if (n - 1) - max(marks) <= every / 2:  # too close to the previous mark: the labels would overlap
            marks.pop(max(marks))
        marks[n - 1] = str(n - 1)
    return marks


# ---------------------------------------------------------------- layout and callbacks
@adds_panel("run", "generate")
def controls() -> html.Div:
    """The "Continue the text" control, under "Run model"."""
    return field(
        "Continue the text",
        [
            html.Div(
                [
                    new_tokens_input(GID.new_tokens, DEFAULT_NEW_TOKENS),
                    html.Span("new tokens", className="av-dim"),
                    html.Button(
                        "Generate",
                        id=GID.generate,
                        n_clicks=0,
                        className="av-button",
                        title="the model writes the continuation (greedy); every view then shows prompt + new tokens, "
                        f"the new ones marked {MARK}",
                    ),
                ],
                className="av-row",
            ),
            html.Div(id=GID.progress, style={"color": NEW_COLOUR}),
        ],
        f"The model continues the text (greedy decoding) by this many new tokens (1 to {MAX_NEW_TOKENS}); every view "
        f"then shows the prompt and the new tokens, marked {MARK}.",
    )


@adds_panel("lab", "steps")
def lab_panel() -> html.Div:
    """The AttentionLab's step slider and its two rows (shown only for a generation)."""
    return html.Div(
        id=GID.step_box,
        style={"display": "none"},
        children=[
            dcc.Store(id=GID.first_new),
            html.Label(f"Step — replay the generation: new token i becomes the query ({MARK} generated)"),
            dcc.Slider(id=GID.step, min=0, max=0, step=1, value=0, marks={0: "0"}),
            html.Div(id=GID.step_text, style={"margin": "6px 0"}),
            dcc.Graph(id=GID.step_graph, config={"displaylogo": False}),
        ],
    )


def register(app: Dash, captures: Captures) -> None:
    """Callbacks of the step slider (and the "Generating…" line while the run callback works)."""

    app.clientside_callback(
        """(clicks, n) => clicks ? `Generating ${n ?? "?"} new tokens…` : window.dash_clientside.no_update""",
        Output(GID.progress, "children", allow_duplicate=True),
        Input(GID.generate, "n_clicks"),
        State(GID.new_tokens, "value"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output(GID.step_box, "style"),
        Output(GID.step, "max"),
        Output(GID.step, "marks"),
        Output(GID.step, "value", allow_duplicate=True),
        Output(GID.first_new, "data"),
        Input(ID.store, "data"),
        Input(ID.part, "value"),
        State(GID.step, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda _m: ({"display": "none"}, no_update, no_update, no_update, None))  # the run callback says why
    def setup_steps(store, part, value):
        gen = generation_of(captures.from_store(store))
        first = None if gen is None else new_start(gen.capture, part, False, "query")
        if gen is None or first is None:
            return {"display": "none"}, no_update, no_update, no_update, None
        n = len(gen)
        fresh = ctx.triggered_id == ID.store or value is None or value >= n
        shown = {"display": "block", "margin": "8px 0"}
        return shown, max(n - 1, 0), step_marks(n), 0 if fresh else no_update, first

    @app.callback(
        Output(GID.step_text, "children"),
        Output(GID.step_graph, "figure"),
        Input(GID.step, "value"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    @shows_errors(lambda m: (m, message_figure(m)))
    def show_step(index, store, layer, head, tab, part):
        only_on(tab, "lab")
        gen = generation_of(captures.from_store(store))
        if gen is None or index is None or layer is None or head is None:
            return "", message_figure("")
        if new_start(gen.capture, part, False, "query") is None:
            return no_update
        step = gen.step(min(int(index), len(gen) - 1))
        return step_summary(gen, step, layer, head), step_figure(gen, step, layer, head)


registers(View("generation", None, order=45, register=lambda app, server: register(app, server.captures)))
