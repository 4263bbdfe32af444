"""The page: the shared controls in a side panel, then one tab per view — each view's layout comes from its
own module (which also holds its callbacks); the page only places them. A view that adds a panel to
another registers it (``panels.py``); every view module is imported here, so each panel is registered
before ``build_layout`` builds a host's layout.

``ID`` (every shared component id) lives in :mod:`.ids`; it is re-exported here for older imports."""

from __future__ import annotations

import dash_mantine_components as dmc
from dash import dcc, html

from . import (
    atlas_view,
    compare_view,
    coref_view,
    cost_view,
    edit_view,
    export_view,
    generation_view,
    head_view,
    image_view,
    jobs_view,
    lab_view,
    model_view,
    overview_view,
    probe_view,
    rollout_view,
    run_view,
    space_view,
    stats_view,
    validation_view,
)
from .ids import ID, view_id
from .ui import card, toolbar
from .ui import page as page_shell

PANEL_VIEWS = (edit_view, generation_view, probe_view)  # views with no tab of their own: their panels sit in others'

VIEWS = [
    *overview_view.VIEWS,
    *head_view.VIEWS,
    *model_view.VIEWS,
    *lab_view.VIEWS,
    *validation_view.VIEWS,
    *cost_view.VIEWS,
    *coref_view.VIEWS,
    *stats_view.VIEWS,
    *atlas_view.VIEWS,
    *rollout_view.VIEWS,
    *space_view.VIEWS,
    *image_view.VIEWS,
    *compare_view.VIEWS,
]

LONG_EXAMPLE = (
    " ".join(
        [
            "Attention lets every token look at every other token in one step.",
            "Each position asks a question with its query vector, every position answers with its key,",
            "and the answers are mixed by the values, weighted by how well query and key agree.",
            "The weights of one row always sum to one, which is why a head that stares at the first token",
            "is not ignoring the sentence but parking its attention somewhere harmless.",
            "Decoders add a causal mask so that no token can see the future, and the upper triangle of",
            "every map stays empty. Dividing the scores by the square root of the key size keeps the",
            "softmax from collapsing into a single spike when the vectors are long.",
        ]
    )
    + " "
    + " ".join(
        f"In paragraph {i}, the cat chased the mouse because it was hungry, and the mouse hid in the box"
        " because it was small."
        for i in range(1, 13)
    )
)

EXAMPLES = {
    "我家的小猫很可爱，它很好动。": "我家的小猫很可爱，它很好动。 (它 → 小猫)",
    "The cat sat on the mat because it was tired.": "The cat sat on the mat because it was tired. (it → cat)",
    "The trophy doesn't fit in the suitcase because it is too big.": "Winograd: … because it is too big. (it → trophy)",
    "The trophy doesn't fit in the suitcase because it is too small.": "Winograd: … because it is too small. (it → suitcase)",
    "小明把书借给了小红，因为她想读。": "小明把书借给了小红，因为她想读。 (她 → 小红)",
    LONG_EXAMPLE: "A long text (~500 tokens)",
}

GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png"}}


def _view(key: str, children: list) -> html.Div:
    return html.Div(id=view_id(key), children=children, style={"display": "none"}, className="av-view")


def build_layout(
    model_options: list[dict], default_model: str, default_text: str, *, bos: bool = False, page: str = ""
) -> dmc.MantineProvider:
    """The page; ``page``: this page load's id (whose background jobs are whose).

    A side panel holds what makes a capture (model, text, Run model, Continue the text); the main
    column holds the message, the view tabs, the toolbar of what every view reads (part, layer, head,
    units, measure) with the exports, and the view itself."""
    config = GRAPH_CONFIG
    views = {
        "heatmap": overview_view.layout(dcc.Loading(dcc.Graph(id=ID.heatmap, config=config))),
        "head": head_view.layout(config),
        "model": model_view.layout(config),
        "lab": lab_view.layout(config),
        "validation": validation_view.layout(config),
        "cost": cost_view.layout(),
        "coref": coref_view.layout(),
        "stats": stats_view.layout(),
        "atlas": atlas_view.layout(),
        "rollout": rollout_view.layout(),
        "space": space_view.layout(),
        "image": image_view.layout(),
        "compare": compare_view.layout(model_options, default_model),
    }
    side = html.Aside(
        [
            html.Header(
                [
                    html.H1("attnviz", className="av-title"),
                    html.Div("see what attention does", className="av-subtitle"),
                ]
            ),
            card("Input", run_view.layout(model_options, default_model, default_text, EXAMPLES, bos=bos)),
            html.P(
                "Q, K and V are captured from the unmodified model; every map is recomputed with "
                "softmax(QKᵀ/√d_k + M)·V and checked against the model's own numbers.",
                className="av-note",
            ),
        ],
        className="av-side",
    )
    main = html.Main(
        [
            dcc.Store(id=ID.lab_query),
            dcc.Store(id=ID.lab_key),
            run_view.message(),
            *jobs_view.layout(page),
            dcc.Tabs(
                id=ID.tabs,
                value="heatmap",
                className="av-tabs",
                parent_className="av-tabs-parent",
                children=[dcc.Tab(label=label, value=key) for key, label in VIEWS],
            ),
            html.Div(
                [toolbar(run_view.selectors()), toolbar(export_view.layout(), "av-exports")],
                className="av-viewbar",
            ),
            *[_view(key, views[key]) for key, _ in VIEWS],
        ],
        className="av-main",
    )
    return page_shell([html.Div([side, main], className="av-shell")])


__all__ = ["EXAMPLES", "ID", "LONG_EXAMPLE", "VIEWS", "build_layout"]
