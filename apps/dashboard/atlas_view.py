"""The head atlas (``attnviz.analysis.head_atlas``): each head of the page's model named by the roles it
meets under published criteria, over the server's corpus (``attnviz app --corpus FILE``) or, without one,
the shipped English probe sentences — a background job (a fork of the server, as probe sets run) with
progress and Cancel. A click on a cell of the map or a row of the table selects that head in every other
view."""

from __future__ import annotations

from importlib import resources

from dash import Dash, Input, Output, State, ctx, dash_table, dcc, html

import attnviz
from attnviz.analysis import ROLES
from attnviz.figures import atlas_map as atlas_figure
from attnviz.figures import message_figure

from .captures import FILE_PREFIX, Captures, starts_with_special
from .common import TABLE_STYLE, head_of, job_controls
from .errors import shows_errors
from .ids import ID, TID
from .registry import View, registers

SHIPPED = "the shipped English probe sentences (attnviz/probes/en.jsonl, 42 texts)"
_HIDDEN = {"display": "none"}


def shipped_corpus() -> str:
    """The path of the shipped English probe set, read as a corpus of its sentences."""
    return str(resources.files("attnviz") / "probes" / "en.jsonl")


def layout() -> list:
    return [
        html.P(
            "Each head of the page's model named by what it does over a corpus, with the criteria the papers "
            "give (Clark et al. 2019, Voita et al. 2019, Olsson et al. 2022, Gu et al. 2024; each column of the "
            "table names its role's threshold, and the guide says where a paper gives none). Induction is read on "
            "repeated random token sequences the atlas generates (seed 0). Click a cell or a row to select that head."
        ),
        html.Div(id=TID.corpus, style={"color": "#555", "margin": "4px 0"}),
        html.Div(
            [
                dcc.Checklist(
                    id=TID.coreference,
                    value=[],
                    options=[{"label": " and coreference on the shipped English probe set", "value": "en"}],
                    style={"display": "inline-block", "marginRight": "12px"},
                ),
                html.Button("Build the atlas", id=TID.run, n_clicks=0),
                html.Button("Cancel", id=TID.cancel, n_clicks=0, style=_HIDDEN),
                html.Progress(id=TID.progress, value="0", max="1", style=_HIDDEN),
                html.Span(id=TID.progress_text, style={"marginLeft": "6px", "color": "#555"}),
            ],
            style={"margin": "6px 0"},
        ),
        html.Div(id=TID.note, style={"margin": "4px 0"}),
        dcc.Loading(dcc.Graph(id=TID.graph, figure=message_figure("Press Build the atlas."))),
        dash_table.DataTable(id=TID.table, sort_action="native", page_size=20, **TABLE_STYLE),
    ]


def table_of(atlas) -> tuple[list[dict], list[dict]]:
    """The table the page shows: each head's roles, positional offset and every role's score."""
    columns = ["layer", "head", "roles", "positional_offset", *[r for r in ROLES if r in atlas.columns]]
    shown = atlas[columns].round(3)
    for name in (r for r in ROLES if r in atlas.columns and r != "coreference"):  # its score tests a p-value
        # the decimals that keep each score on its side of the threshold (0.7996 under ≥ 0.8 showed as 0.8)
        shown[name] = [float("nan") if v != v else float(ROLES[name].text(v)) for v in atlas[name].tolist()]
    shown.insert(0, "id", [f"{r.layer}-{r.head}" for r in shown.itertuples(index=False)])
    named = {r: f"{r} ({'p ' if r == 'coreference' else ''}{ROLES[r].side} {ROLES[r].threshold:g})" for r in ROLES}
    return shown.to_dict("records"), [{"name": named.get(c, c), "id": c} for c in columns]


def bos_applies(model: str) -> bool:
    """Whether the side panel's *prepend BOS* box changes what ``model`` reads: its tokenizer starts a
    text with no special token of its own (SmolLM2; MiniLM's [CLS] is one, and no BOS goes before it)."""
    from attnviz.models import describe_model  # the config and tokenizer only, no weights

    _, tokenizer = describe_model(model)
    return not starts_with_special(tokenizer)


def register(app: Dash, captures: Captures, corpus: list[str] | None = None, corpus_name: str = "") -> None:
    """``corpus``: the texts of ``attnviz app --corpus FILE`` (else the shipped probe sentences)."""
    named = f"{corpus_name} (its first {len(corpus):,} texts)" if corpus else SHIPPED
    described = f"the corpus {named}" if corpus else SHIPPED

    @app.callback([Output(TID.corpus, "children")], Input(ID.tabs, "value"))
    def corpus_line(_tab):
        return [f"Corpus: {named}."]

    @app.callback(
        Output(TID.graph, "figure"),
        Output(TID.table, "data"),
        Output(TID.table, "columns"),
        Output(TID.note, "children"),
        Input(TID.run, "n_clicks"),
        State(ID.store, "data"),
        State(TID.coreference, "value"),
        prevent_initial_call=True,
        background=True,  # every text's forward: a job beside the server, the page stays usable
        **job_controls(TID.run, TID.cancel, TID.progress, TID.progress_text),
    )
    @shows_errors(lambda m: (message_figure(m), [], [], m))
    def build(set_progress, _clicks, store, coreference):
        set_progress(("0", "1", ""))
        if not store:
            return message_figure("Run the model first."), [], [], ""
        model = store["model"]
        if model.startswith(FILE_PREFIX):
            raise attnviz.InputError("a capture file holds no model: pick a model in the list to build its atlas")
        captures.check_model(model)

        steps = "texts, then the repeated random sequences" + (
            " and the probe set" if "en" in (coreference or []) else ""
        )

        def progress(done: int, total: int) -> None:  # the library's on_progress: the corpus' texts, then each step
            set_progress((str(done), str(total), f"{done} of {total} ({steps})"))

        bos = bool(store.get("bos"))
        atlas = attnviz.analysis.head_atlas(
            model,
            corpus or shipped_corpus(),
            add_bos=bos,
            probes="en" if "en" in (coreference or []) else None,
            progress=False,
            on_progress=progress,
        )
        set_progress(("1", "1", ""))
        data, columns = table_of(atlas)
        met = atlas["roles"].str.len().gt(0).sum()
        note = (
            f"{model}: {met} of {len(atlas)} heads meet a role, over {atlas.attrs.get('texts', 0):,} texts "
            f"({atlas.attrs.get('tokens', 0):,} tokens) of {described}"
        )
        if bos_applies(model):  # the atlas follows the side panel's box, which moves what heads meet a role
            note += ", with a BOS before each text" if bos else ", without a BOS"
        note += "."
        return atlas_figure(atlas, title=f"Head atlas of {model}"), data, columns, note

    @app.callback(
        Output(ID.layer, "value", allow_duplicate=True),
        Output(ID.head, "value", allow_duplicate=True),
        Input(TID.table, "active_cell"),
        Input(TID.graph, "clickData"),
        prevent_initial_call=True,
    )
    def select_head(cell, click):
        return head_of(click, cell, ctx.triggered_id == TID.graph)


registers(
    View(
        "atlas",
        "Head atlas",
        order=90,
        register=lambda app, server: register(app, server.captures, server.texts, server.corpus_name),
        layout=lambda page: layout(),
    )
)
