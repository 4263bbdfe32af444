"""The query–key space (AttentionViz, Yeh et al. 2023): one head's queries and keys embedded together
(``attnviz.analysis.qk_space``) — of this text, or of a corpus file the server was started with
(``attnviz app --corpus FILE``).

The corpus is captured with the page's model (and BOS) for the chosen layer only, once per model and
layer, and each head's embedding is computed once per method: both are background jobs past the
page's background threshold (the job bar's progress and Cancel), results in the captures' bounded
cache. A click on a point opens its token in the AttentionLab: a query becomes the Lab's query, a key
the Lab's highlighted key. A corpus text is first put in the text box and run, as the page runs any
text (the corpus was tokenized the same way, so the point's position is the token's there too)."""

from __future__ import annotations

from dash import Dash, Input, Output, State, dcc, html, no_update

import attnviz
from attnviz.analysis import QK_SPACE_METHODS as METHODS
from attnviz.analysis import qk_space
from attnviz.figures import message_figure, qk_space_figure
from attnviz.figures.helpers import SPACE_COLOURS

from .background import in_background, pending
from .captures import FILE_PREFIX, Captures
from .errors import only_on, shows_errors
from .ids import ID, SID
from .registry import View, registers

CORPUS_TEXTS = 500  # a corpus file's first texts that the view embeds
CORPUS_TOKENS = 8_192  # … and at most this many tokens of them (queries + keys: twice as many points)
MAX_POINTS = 10_000  # points a view shows (a seeded sample past it, stated): ~170 bytes each, under 2 MB
BATCH = 16  # corpus texts per forward
_CONTROL = {"display": "inline-block", "marginRight": "18px", "verticalAlign": "top"}


def layout() -> list:
    return [
        html.P(
            "One head's queries (circles) and keys (diamonds) in one space (AttentionViz, Yeh et al. 2023). "
            "With the normalisation the keys are moved onto the queries' mean and both are scaled to the "
            "same mean norm — neither changes any attention weight — so a query lies near the keys it "
            "attends to. Click a point to open its token in the AttentionLab."
        ),
        html.Div(
            [
                html.Div(
                    [
                        html.Label("Texts "),
                        dcc.RadioItems(
                            id=SID.source,
                            value="text",
                            inline=True,
                            options=[{"label": " this text", "value": "text"}],
                        ),
                    ],
                    style=_CONTROL,
                ),
                html.Div(
                    [
                        html.Label("Method"),
                        dcc.Dropdown(
                            id=SID.method,
                            value="pca",
                            clearable=False,
                            options=[{"label": m.upper() if m == "pca" else m, "value": m} for m in METHODS],
                            style={"width": "120px"},
                        ),
                    ],
                    style=_CONTROL,
                ),
                html.Div(
                    [
                        html.Label("Colour by"),
                        dcc.Dropdown(
                            id=SID.color,
                            value="kind",
                            clearable=False,
                            options=[{"label": label, "value": key} for key, label in SPACE_COLOURS.items()],
                            style={"width": "190px"},
                        ),
                    ],
                    style=_CONTROL,
                ),
                dcc.Checklist(
                    id=SID.normalise,
                    value=["normalise"],
                    options=[{"label": " normalise (AttentionViz)", "value": "normalise"}],
                    style=_CONTROL,
                ),
            ]
        ),
        html.Div(id=SID.note, style={"color": "#555", "margin": "4px 0"}),
        dcc.Loading(dcc.Graph(id=SID.graph, config={"displaylogo": False})),
        dcc.Store(id=SID.drill),
    ]


def read_corpus(path: str) -> list[str]:
    """The corpus file's first :data:`CORPUS_TEXTS` texts (``.txt``: one per line; ``.jsonl``: "text")."""
    from attnviz.analysis import read_texts  # deferred: only a server started with a corpus reads one

    texts = []
    for text in read_texts(path):
        texts.append(text)
        if len(texts) == CORPUS_TEXTS:
            break
    if not texts:
        raise attnviz.InputError(f"the corpus {path} holds no texts: give a .txt (one per line) or .jsonl file")
    return texts


def corpus_captures(model: str, texts: list[str], bos: bool, layer: int, progress) -> list[attnviz.Capture]:
    """The corpus texts captured with ``model`` at ``layer`` only, until :data:`CORPUS_TOKENS` tokens."""
    loaded, tokenizer = attnviz.load_model(model)
    caps: list[attnviz.Capture] = []
    tokens = 0
    for start in range(0, len(texts), BATCH):
        progress(start, len(texts), f"text {start} of {len(texts)}")
        batch = attnviz.capture(loaded, texts[start : start + BATCH], tokenizer, add_bos=bos, layers=[layer])
        for cap in batch if isinstance(batch, list) else [batch]:
            if tokens + cap.n_tokens > CORPUS_TOKENS:
                return caps
            caps.append(cap)
            tokens += cap.n_tokens
    return caps


def register(app: Dash, captures: Captures, corpus: list[str] | None = None, corpus_name: str = "") -> None:
    """``corpus``: the texts of ``attnviz app --corpus FILE``, offered beside this text."""

    @app.callback(Output(SID.source, "options"), Input(ID.tabs, "value"))
    def sources(_tab):
        options = [{"label": " this text", "value": "text"}]
        if corpus:
            options.append({"label": f" the corpus {corpus_name} (its first {len(corpus):,} texts)", "value": "corpus"})
        return options

    @app.callback(
        Output(SID.graph, "figure"),
        Output(SID.note, "children"),
        Input(ID.store, "data"),
        Input(ID.layer, "value"),
        Input(ID.head, "value"),
        Input(ID.part, "value"),
        Input(SID.source, "value"),
        Input(SID.method, "value"),
        Input(SID.color, "value"),
        Input(SID.normalise, "value"),
        Input(ID.tabs, "value"),
        Input(ID.view_job_done, "data"),
        State(ID.page, "data"),
    )
    @shows_errors(lambda m: (message_figure(m), ""))
    def space(store, layer, head, part, source, method, color, normalise, tab, _done, page):
        only_on(tab, "space")
        cap = captures.from_store(store)
        if cap is None or layer is None or head is None:
            return message_figure("Run the model first."), ""
        part = part if len(cap.parts) > 1 else None
        norm = "normalise" in (normalise or [])
        what = ("qk space", source, part, int(layer), int(head), method, norm)
        label = f"the query–key space of L{layer}·H{head} ({method})"
        if source == "corpus" and corpus:
            if store["model"].startswith(FILE_PREFIX):
                raise attnviz.InputError("a capture file holds no model: pick a model in the list to embed the corpus")
            bos = bool(store.get("bos"))
            owner = {"key": f"corpus\x00{store['model']}\x00{bos}"}  # the corpus's results, whatever the page's text
            n_corpus = CORPUS_TOKENS

            def captured(progress):
                return corpus_captures(store["model"], corpus, bos, int(layer), progress)

            caps = in_background(
                captures, owner, page, ("captures", int(layer)), f"the corpus at layer {layer}", n_corpus, captured
            )
            if caps is None:
                return message_figure(pending(f"the corpus at layer {layer}")), ""
            n_points = 2 * sum(c.n_tokens for c in caps)
        else:
            owner, caps, n_points = store, [cap], 2 * cap.n_tokens

        def embed(_progress):
            return qk_space(
                caps, int(layer), int(head), part=part, method=method, normalise=norm, max_points=MAX_POINTS
            )

        df = in_background(captures, owner, page, what, label, n_points, embed)
        if df is None:
            return message_figure(pending(label)), ""
        texts = "this text" if owner is store else f"{len(caps):,} texts of the corpus {corpus_name}"
        return qk_space_figure(df, color=color or "kind"), f"{texts}: {df.attrs['description']}"

    @app.callback(
        Output(ID.lab_query, "data", allow_duplicate=True),
        Output(ID.lab_key, "data", allow_duplicate=True),
        Output(ID.tabs, "value", allow_duplicate=True),
        Output(ID.text, "value", allow_duplicate=True),
        Output(ID.run, "n_clicks", allow_duplicate=True),
        Output(SID.drill, "data"),
        Input(SID.graph, "clickData"),
        State(SID.source, "value"),
        State(ID.store, "data"),
        State(ID.lab_query, "data"),
        State(ID.run, "n_clicks"),
        State(ID.layer, "value"),
        State(ID.head, "value"),
        prevent_initial_call=True,
    )
    @shows_errors()
    def open_point(click, source, store, query, clicks, layer, head):
        """A click on a point: this text's token opens in the Lab at once; a corpus text is run first
        (:func:`show_point` moves the Lab once the page holds its capture)."""
        point = (click or {}).get("points", [{}])[0]
        if "customdata" not in point or not store:
            return (no_update,) * 6
        text, position, kind = int(point["customdata"][0]), int(point["customdata"][1]), str(point["customdata"][2])
        if source == "corpus" and corpus:
            if not 0 <= text < len(corpus):
                raise attnviz.InputError(f"text {text} is not in the corpus; choose a point again")
            drill = {
                "key": captures.key(store["model"], corpus[text], bool(store.get("bos"))),
                "position": position,
                "kind": kind,
                "layer": layer,
                "head": head,
            }
            return no_update, no_update, no_update, corpus[text], (clicks or 0) + 1, drill
        return (*lab_place(kind, position, query, store["key"]), "lab", no_update, no_update, None)

    @app.callback(
        Output(ID.lab_query, "data", allow_duplicate=True),
        Output(ID.lab_key, "data", allow_duplicate=True),
        Output(ID.tabs, "value", allow_duplicate=True),
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Output(SID.drill, "data", allow_duplicate=True),
        Input(ID.store, "data"),
        State(SID.drill, "data"),
        State(ID.lab_query, "data"),
        prevent_initial_call=True,
    )
    def show_point(store, drill, query):
        """The corpus text's capture is the page's now: the Lab opens on the point's token. Another
        capture (the user ran another text meanwhile) drops the drill-down. The head is the one the
        point was embedded for (the run chose its own opening head for the new text)."""
        if not drill:
            return (no_update,) * 6
        if not store or store.get("key") != drill.get("key"):
            return (no_update,) * 5 + (None,)
        place = lab_place(drill["kind"], int(drill["position"]), query, store["key"])
        return (*place, "lab", drill["layer"], drill["head"], None)


def lab_place(kind: str, position: int, query: int | None, key: str) -> tuple:
    """(the Lab's query, its highlighted key) for a clicked point of the capture ``key``: a query becomes
    the Lab's query (no key highlighted); a key is highlighted (``{"key": key, "position": …}``: the Lab
    marks it on that capture only), the Lab's query kept — or, with none, the key's own row."""
    if kind == "query":
        return position, None
    return (query if query is not None else position), {"key": key, "position": position}


registers(
    View(
        "space",
        "Q·K space",
        order=110,
        register=lambda app, server: register(app, server.captures, server.texts, server.corpus_name),
        layout=lambda page: layout(),
    )
)
