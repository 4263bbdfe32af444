"""The dashboard's layout: component ids, example texts, and the page."""

from __future__ import annotations

from dash import dcc, html

from . import analysis_views, compare_view, generation_view, head_view, overview_view


class ID:
    """Component ids, in one place (tests use them too)."""

    model = "model-select"
    text = "text-input"
    example = "example-select"
    run = "run-button"
    bos = "bos-switch"
    message = "message"
    status = "status"
    store = "capture-store"
    part = "part-select"
    part_box = "part-box"
    target = "target-input"
    target_box = "target-box"
    layer = "layer-select"
    head = "head-select"
    words = "word-level"
    tabs = "view-tabs"
    export_format = "export-format"
    csv_button = "csv-button"
    capture_button = "capture-file-button"
    html_button = "html-file-button"
    download = "download"
    heatmap = "heatmap-graph"
    heads_multi = "head-view-heads"
    head_view = "head-view-graph"
    model_view = "model-view-graph"
    lab_tokens = "lab-tokens"
    lab_query = "lab-query"
    lab_switches = "lab-switches"
    lab_temperature = "lab-temperature"
    lab_graph = "lab-graph"
    lab_stats = "lab-stats"
    validation_summary = "validation-summary"
    validation_map = "validation-map"
    comparison = "comparison-graph"
    cost = "cost-tables"
    lab_token = "lab-token"  # pattern-matching type: {"type": lab_token, "index": i}


VIEWS = [
    ("heatmap", "Heatmap"),
    ("head", "Head view"),
    ("model", "Model view"),
    ("lab", "AttentionLab"),
    ("validation", "Recomputed vs model"),
    ("cost", "Shapes & cost"),
    *analysis_views.VIEWS,
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

_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}


def _view(key: str, children: list) -> html.Div:
    return html.Div(id=f"view-{key}", children=children, style={"display": "none"})


def build_layout(model_options: list[dict], default_model: str, default_text: str, *, bos: bool = False) -> html.Div:
    graph_config = {"displaylogo": False, "toImageButtonOptions": {"format": "png"}}
    return html.Div(
        style={"fontFamily": "system-ui, sans-serif", "margin": "12px 20px"},
        children=[
            dcc.Store(id=ID.store),
            dcc.Store(id=ID.lab_query),
            dcc.Store(id=analysis_views.AID.coref_selection),
            dcc.Download(id=ID.download),
            html.H2("attnviz — see what attention does", style={"marginBottom": "4px"}),
            html.Div(
                "Q, K and V are captured from the unmodified model; every map is recomputed with "
                "softmax(QKᵀ/√d_k + M)·V and checked against the model's own numbers.",
                style={"color": "#555", "marginBottom": "10px"},
            ),
            html.Div(
                [
                    html.Div(
                        [
                            html.Label("Model"),
                            dcc.Dropdown(
                                id=ID.model,
                                options=model_options,
                                value=default_model,
                                clearable=False,
                                style={"width": "300px"},
                            ),
                        ],
                        style=_CONTROL,
                    ),
                    html.Div(
                        [
                            html.Label("Example"),
                            dcc.Dropdown(
                                id=ID.example,
                                options=[{"label": v, "value": k} for k, v in EXAMPLES.items()],
                                placeholder="pick an example sentence…",
                                style={"width": "420px"},
                            ),
                        ],
                        style=_CONTROL,
                    ),
                ]
            ),
            dcc.Textarea(id=ID.text, value=default_text, style={"width": "100%", "height": "60px", "marginTop": "6px"}),
            html.Div(
                id=ID.target_box,
                style={"display": "none"},
                children=[
                    html.Label(
                        "Target — the decoder's text, teacher-forced (empty: the decoder reads its start token only)"
                    ),
                    dcc.Textarea(id=ID.target, value="", style={"width": "100%", "height": "40px"}),
                ],
            ),
            html.Div(
                [
                    html.Button("Run model", id=ID.run, n_clicks=0, style={"marginRight": "12px"}),
                    *generation_view.controls(),
                    dcc.Checklist(
                        id=ID.bos,
                        value=["bos"] if bos else [],
                        inline=True,
                        style={"display": "inline-block", "marginRight": "12px"},
                        options=[{"label": " prepend BOS (decoders park their attention sink there)", "value": "bos"}],
                    ),
                    dcc.Loading(
                        html.Span(id=ID.status, style={"color": "#555"}), type="dot", style={"display": "inline-block"}
                    ),
                ],
                style={"margin": "6px 0"},
            ),
            html.Div(
                id=ID.message, role="alert", style={"color": "#b00020", "whiteSpace": "pre-wrap", "margin": "4px 0"}
            ),
            html.Div(
                [
                    html.Div(
                        [html.Label("Part"), dcc.Dropdown(id=ID.part, clearable=False, style={"width": "230px"})],
                        id=ID.part_box,
                        style={**_CONTROL, "display": "none"},
                        title="encoder: source × source; decoder: target × target (causal); cross: target × source",
                    ),
                    html.Div(
                        [
                            html.Label("Layer (0-based)"),
                            dcc.Dropdown(id=ID.layer, clearable=False, style={"width": "110px"}),
                        ],
                        style=_CONTROL,
                    ),
                    html.Div(
                        [
                            html.Label("Head (0-based)"),
                            dcc.Dropdown(id=ID.head, clearable=False, style={"width": "110px"}),
                        ],
                        style=_CONTROL,
                    ),
                    html.Div(
                        [
                            html.Label("Units"),
                            dcc.RadioItems(
                                id=ID.words,
                                value="tokens",
                                inline=True,
                                options=[
                                    {"label": " tokens ", "value": "tokens"},
                                    {"label": " words", "value": "words"},
                                ],
                            ),
                        ],
                        style=_CONTROL,
                        title="words: attention to a word is summed over its pieces, from a word averaged",
                    ),
                    html.Div(
                        [
                            html.Label("Export figures as"),
                            dcc.RadioItems(
                                id=ID.export_format,
                                value="png",
                                inline=True,
                                options=[{"label": " PNG ", "value": "png"}, {"label": " SVG", "value": "svg"}],
                            ),
                        ],
                        style=_CONTROL,
                    ),
                    html.Div(
                        [
                            html.Button("CSV of the shown matrix", id=ID.csv_button, n_clicks=0),
                            html.Button("Capture file", id=ID.capture_button, n_clicks=0, style={"marginLeft": "6px"}),
                            html.Button(
                                "HTML file (offline)",
                                id=ID.html_button,
                                n_clicks=0,
                                style={"marginLeft": "6px"},
                                title="this view's figures as one self-contained HTML page",
                            ),
                        ],
                        style={**_CONTROL, "paddingTop": "18px"},
                    ),
                ],
                style={"margin": "8px 0"},
            ),
            dcc.Tabs(id=ID.tabs, value="heatmap", children=[dcc.Tab(label=label, value=key) for key, label in VIEWS]),
            _view("heatmap", overview_view.layout(dcc.Loading(dcc.Graph(id=ID.heatmap, config=graph_config)))),
            _view(
                "head",
                [
                    html.Div([html.Label("Heads to overlay "), dcc.Checklist(id=ID.heads_multi, inline=True)]),
                    head_view.controls(),
                    html.Div("Hover a query token on the left to isolate its lines.", style={"color": "#555"}),
                    dcc.Loading(dcc.Graph(id=ID.head_view, config=graph_config, clear_on_unhover=True)),
                ],
            ),
            _view("model", [dcc.Loading(dcc.Graph(id=ID.model_view, config=graph_config))]),
            _view(
                "lab",
                [
                    html.P(
                        "Click a token to make it the query, and see its row of weights. Switch the causal mask "
                        "and the ÷√d_k scaling, or change the temperature: the row is recomputed with attnviz's "
                        "own SDPA from this model's real Q and K."
                    ),
                    generation_view.lab_panel(),
                    html.Div(id=ID.lab_tokens, style={"lineHeight": "2.1em", "margin": "6px 0"}),
                    html.Div(
                        [
                            dcc.Checklist(
                                id=ID.lab_switches,
                                inline=True,
                                value=["causal", "scale"],
                                options=[
                                    {"label": " causal mask (see only the left) ", "value": "causal"},
                                    {"label": " ÷√d_k scaling", "value": "scale"},
                                ],
                                style=_CONTROL,
                            ),
                            html.Div(
                                [
                                    html.Label("temperature (log scale)"),
                                    dcc.Slider(
                                        id=ID.lab_temperature,
                                        min=-1,
                                        max=1,
                                        step=0.05,
                                        value=0,
                                        marks={-1: "0.1", -0.5: "0.32", 0: "1", 0.5: "3.2", 1: "10"},
                                    ),
                                ],
                                style={**_CONTROL, "width": "360px"},
                            ),
                        ]
                    ),
                    html.Div(id=ID.lab_stats, style={"fontSize": "1.1em", "margin": "6px 0"}),
                    dcc.Graph(id=ID.lab_graph, config=graph_config),
                ],
            ),
            _view(
                "validation",
                [
                    html.Div(id=ID.validation_summary, style={"margin": "8px 0", "fontFamily": "monospace"}),
                    dcc.Loading(dcc.Graph(id=ID.validation_map, config=graph_config)),
                    dcc.Graph(id=ID.comparison, config=graph_config),
                ],
            ),
            _view("cost", [dcc.Loading(html.Div(id=ID.cost))]),
            *analysis_views.layout(_view),
            _view("compare", compare_view.layout(model_options, default_model)),
        ],
    )
