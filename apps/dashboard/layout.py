"""The page: the shared controls in a side panel, then one tab per view — each view's layout comes from its
own module (which also holds its callbacks and registers the view once, ``registry.py``); the page only
places them, in the registry's order. A view that adds a panel to another registers it (``panels.py``);
the registry imports every view module when this module is imported, so each panel is registered before
``build_layout`` builds a host's layout.

``ID`` (every shared component id) lives in :mod:`.ids`; it is re-exported here for older imports."""

from __future__ import annotations

import dash_mantine_components as dmc
from dash import dcc, html

from . import export_view, jobs_view, opening, run_view  # the page's frame: the side panel, the job bar, the exports
from .ids import ID, view_id
from .registry import Page, tabs
from .ui import card, toolbar
from .ui import page as page_shell
from .url_state import location

#: every tab of the page as (id, label), in order: the views registered themselves (registry.py)
VIEWS = [(view.id, view.label) for view in tabs()]

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
    views = tabs()
    shown = Page(model_options, default_model, default_text, bos=bos, page=page, graph_config=GRAPH_CONFIG)
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
            location(),  # the view in the address: url_state
            dcc.Store(id=ID.lab_query),
            dcc.Store(id=ID.lab_key),
            run_view.message(),
            *jobs_view.layout(page),
            dcc.Tabs(
                id=ID.tabs,
                value=opening.TAB,  # the README's first picture: the Lab, 它 → 小猫
                className="av-tabs",
                parent_className="av-tabs-parent",
                children=[dcc.Tab(label=view.label, value=view.id) for view in views],
            ),
            html.Div(
                [toolbar(run_view.selectors()), toolbar(export_view.layout(), "av-exports")],
                className="av-viewbar",
            ),
            *[_view(view.id, view.layout(shown)) for view in views if view.layout is not None],
        ],
        className="av-main",
    )
    return page_shell([html.Div([side, main], className="av-shell")])


__all__ = ["EXAMPLES", "ID", "LONG_EXAMPLE", "VIEWS", "build_layout"]
