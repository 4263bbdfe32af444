"""Small helpers shared by the dashboard's views."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, html, no_update

import attnviz
from attnviz.figures.helpers import short_label
from attnviz.models import max_positions

from .ui import FONT

TABLE_STYLE = dict(  # the DataTables' look (coreference, head statistics, the atlas, probe sets)
    style_table={"overflowX": "auto", "maxHeight": "420px", "overflowY": "auto"},
    style_cell={"fontFamily": FONT, "fontSize": "13px", "padding": "2px 8px"},  # the page's CJK face first
    style_header={"fontWeight": "bold"},
)


def not_yet(hint: str = "") -> Any:
    """What a result's figure shows before its button is pressed: a line saying what the button draws
    there (or nothing), 60 px high — not an empty pair of axes, which reads as a broken chart."""
    from attnviz.figures import message_figure  # deferred: plotly's figures, as the views load them

    return message_figure(hint).update_layout(height=60, margin=dict(l=0, r=0, t=0, b=0))


def word_of(cap: attnviz.Capture | attnviz.TokenSequence, token: int) -> int:
    """The index of the word that holds ``token`` (in a capture's text, or in one token sequence)."""
    return next(i for i, w in enumerate(cap.words) if w.token_start <= token < w.token_stop)


def chip(
    label: str, component_id: dict, class_name: str, colour: str | None = None, title: str | None = None
) -> html.Button:
    """A clickable token/word, filled with ``colour`` when it is selected (classes style the rest:
    assets/attnviz.css). A label over ``LABEL_CHARS`` characters is cut with
    "…" (a 300-character word made the page 2,300 px wide) and its tooltip says it whole."""
    shown = short_label(label)
    if shown != label:
        title = label if title is None else f"{label} — {title}"
    return html.Button(
        shown,
        id=component_id,
        n_clicks=0,
        className=class_name,
        title=title,
        style={
            "margin": "2px",
            "padding": "2px 6px",
            "border": "1px solid #999",
            "borderRadius": "4px",
            "background": colour or "white",
            "color": "white" if colour else "black",
            "cursor": "pointer",
        },
    )


def text_limit(config, max_tokens: int | None, model: str) -> tuple[int | None, str]:
    """The most tokens the page accepts in one text, and who says so: the model's own limit (its table
    of positions; None when it has none), or the page's ``max_tokens`` when that is smaller."""
    own = max_positions(config)
    if max_tokens is not None and (own is None or max_tokens < own):
        return max_tokens, "this dashboard shows"
    return own, f"{model} reads"


def job_controls(run: str, cancel: str, progress: str, progress_text: str) -> dict:
    """A background callback's ``running``, ``cancel`` and ``progress`` arguments for a job started by the
    button ``run``: the button disabled, ``cancel`` and the ``progress`` bar shown while it runs, and
    ``set_progress((value, max, text))`` filling the bar and the text beside it."""
    return dict(
        running=[
            (Output(run, "disabled"), True, False),
            (Output(cancel, "style"), {"display": "inline-block", "marginLeft": "6px"}, {"display": "none"}),
            (Output(progress, "style"), {"display": "inline-block", "marginLeft": "8px"}, {"display": "none"}),
        ],
        cancel=[Input(cancel, "n_clicks")],
        progress=[Output(progress, "value"), Output(progress, "max"), Output(progress_text, "children")],
    )


def head_of(click: dict | None, cell: dict | None, from_map: bool) -> tuple:
    """(layer, head) that a click on a layer × head map (``x`` the head, ``y`` the layer) or a table
    cell (its row id ``"layer-head"``) names, or ``(no_update, no_update)`` where it names none."""
    if from_map:
        point = (click or {}).get("points", [{}])[0]
        return (int(point["y"]), int(point["x"])) if "x" in point and "y" in point else (no_update, no_update)
    if not cell or not cell.get("row_id"):
        return no_update, no_update
    layer, head = (int(x) for x in str(cell["row_id"]).split("-"))
    return layer, head
