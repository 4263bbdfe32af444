"""The model view: every layer × head as a thumbnail of its map; a click opens that head in the heatmap.

Token thumbnails are pooled a chunk of query rows at a time (``attnviz.analysis.overview.thumbnails``): no
layer's n×n maps exist whole, whatever the length. (Word thumbnails still merge the full maps.)"""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, no_update

import attnviz
from attnviz import figures
from attnviz.analysis.overview import thumbnails

from .captures import Captures
from .common import message_figure
from .errors import only_on, shows_errors
from .generation_view import MODEL_VIEW_CELLS, mark_view
from .ids import ID

VIEWS = [("model", "Model view")]


class _Thumbnails:
    """A capture whose ``attention(layer, part=…)`` is every head's thumbnail instead of its n×n map.

    ``figures.model_view`` max-pools each layer's maps to the thumbnail size; pooling a thumbnail to its
    own size changes nothing, so the mosaic is the one it draws from the full maps (tested)."""

    def __init__(self, cap: attnviz.Capture, size: tuple[int, int]) -> None:
        self._cap, self._size = cap, size

    def __getattr__(self, name: str):
        return getattr(self._cap, name)

    def attention(self, layer: int, *, part: str | None = None, words: bool = False):
        return thumbnails(self._cap, layer, self._size, part=part)


def model_view_figure(cap: attnviz.Capture, *, words: bool, selected: tuple[int, int] | None, part: str | None):
    """The model view of ``cap`` with a generation's new tokens marked."""
    shown = cap
    if not words:
        size = figures.thumb_size(cap, False, MODEL_VIEW_CELLS, part)
        queries, keys = cap.sequences(part)
        if (queries.n_tokens, keys.n_tokens) != size:
            shown = _Thumbnails(cap, size)
    fig = figures.model_view(shown, words=words, selected=selected, part=part, cells=MODEL_VIEW_CELLS)
    return mark_view(fig, cap, "model", words=words, part=part)


def layout(graph_config: dict) -> list:
    return [dcc.Loading(dcc.Graph(id=ID.model_view, config=graph_config))]


def register(app: Dash, captures: Captures) -> None:
    @app.callback(
        Output(ID.model_view, "figure"),
        Input(ID.store, "data"),
        Input(ID.words, "value"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.tabs, "value"),
        Input(ID.part, "value"),
    )
    @shows_errors(message_figure)
    def model_view(store, units, layer, head, tab, part):
        only_on(tab, "model")
        cap = captures.from_store(store)
        if cap is None:
            return message_figure("Run the model to see its attention.")
        selected = (layer, head) if layer is not None and head is not None else None
        return model_view_figure(cap, words=units == "words", selected=selected, part=part)

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(ID.tabs, "value"),
        Input(ID.model_view, "clickData"),
        State(ID.store, "data"),
        State(ID.words, "value"),
        State(ID.part, "value"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def select_head(click, store, units, part):
        point = (click or {}).get("points", [{}])[0]
        cap = captures.from_store(store)
        if "x" not in point or "y" not in point or cap is None:
            return no_update
        words = units == "words"
        cell = figures.model_view_cell(cap, point["x"], point["y"], words=words, part=part, cells=MODEL_VIEW_CELLS)
        return no_update if cell is None else (cell[0], cell[1], "heatmap")
