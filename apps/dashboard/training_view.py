"""Heads over training (``attnviz.head_timeline``): a run folder's checkpoints read as one atlas per checkpoint —
a role's scores as a heads × steps map, a line per chosen head with its first crossing of the threshold marked and
the run's loss beside, the warning when two checkpoints hold the same weights, and one head's map at two chosen
steps side by side (``attnviz.figures.compare_heads``).

The timeline's table stays on the server, in a small bounded cache of this server's (keyed by the run and the
corpus); the page's store holds the key."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from importlib import resources
from typing import Any

from dash import Dash, Input, Output, State, dcc, html

import attnviz
from attnviz.analysis import ROLES
from attnviz.figures import compare_heads, message_figure, timeline_lines, timeline_map

from .errors import shows_errors
from .registry import View, registers

KEPT = 4  # timelines this server keeps (the latest read)
ROLE_CHOICES = [r for r in ROLES if r != "coreference"]  # coreference reads a probe set, not the corpus


class RID:
    """The Training tab's component ids."""

    run = "training-run"
    corpus = "training-corpus"
    read = "training-read"
    store = "training-store"
    note = "training-note"
    warning = "training-warning"
    role = "training-role"
    map = "training-map"
    heads = "training-heads"
    lines = "training-lines"
    step_a = "training-step-a"
    step_b = "training-step-b"
    head = "training-head"
    compare = "training-compare"
    pair = "training-pair"


def layout() -> list:
    return [
        html.P(
            "Heads over training: the head atlas of every checkpoint of a training run (its checkpoint-*/ "
            "folders, as the Hugging Face Trainer writes them, in step order), one tokenization of the corpus. "
            "A role's score for every head at every step, a line per chosen head with the step it first meets the "
            "role, and one head's map at two steps side by side."
        ),
        html.Div(
            [
                dcc.Input(
                    id=RID.run, type="text", placeholder="run folder (holding checkpoint-*/)", style={"width": "40%"}
                ),
                dcc.Input(
                    id=RID.corpus,
                    type="text",
                    placeholder="corpus file (.txt / .jsonl); empty: the server's corpus",
                    style={"width": "35%", "marginLeft": "6px"},
                ),
                html.Button("Read the run", id=RID.read, n_clicks=0, style={"marginLeft": "6px"}),
            ],
            style={"margin": "6px 0"},
        ),
        dcc.Store(id=RID.store),
        html.Div(id=RID.warning, style={"color": "#a40000", "margin": "4px 0"}),
        html.Div(id=RID.note, style={"color": "#555", "margin": "4px 0"}),
        html.Div(
            [
                html.Label("Role ", htmlFor=RID.role),
                dcc.Dropdown(
                    id=RID.role,
                    options=[{"label": r, "value": r} for r in ROLE_CHOICES],
                    value="induction",
                    clearable=False,
                    style={"width": "240px", "display": "inline-block", "verticalAlign": "middle"},
                ),
            ]
        ),
        dcc.Loading(dcc.Graph(id=RID.map, figure=message_figure("Give a run folder and press Read the run."))),
        html.Div(
            [
                html.Label("Heads ", htmlFor=RID.heads),
                dcc.Dropdown(
                    id=RID.heads, multi=True, options=[], value=[], style={"width": "60%", "display": "inline-block"}
                ),
            ]
        ),
        dcc.Graph(id=RID.lines, figure=message_figure("")),
        html.Div(
            [
                html.Span("One head at two steps: "),
                dcc.Dropdown(
                    id=RID.head, options=[], placeholder="head", style={"width": "120px", "display": "inline-block"}
                ),
                dcc.Dropdown(
                    id=RID.step_a, options=[], placeholder="step", style={"width": "120px", "display": "inline-block"}
                ),
                dcc.Dropdown(
                    id=RID.step_b, options=[], placeholder="step", style={"width": "120px", "display": "inline-block"}
                ),
                html.Button("Compare the two steps", id=RID.compare, n_clicks=0, style={"marginLeft": "6px"}),
            ],
            style={"margin": "6px 0"},
        ),
        dcc.Loading(dcc.Graph(id=RID.pair, figure=message_figure("Pick a head and two steps."))),
    ]


def _shipped() -> str:
    return str(resources.files("attnviz") / "probes" / "en.jsonl")


def register(app: Dash, texts: list[str] | None) -> None:
    """``texts``: the server's corpus (``attnviz app --corpus FILE``), read when the page gives no corpus file."""
    kept: OrderedDict[str, Any] = OrderedDict()  # key → (timeline, the corpus' first text); this server's own

    def timeline_of(store: dict | None):
        if not store or store.get("key") not in kept:
            raise attnviz.InputError("read a run first (its timeline is no longer kept on the server: read it again)")
        return kept[store["key"]]

    @app.callback(
        Output(RID.store, "data"),
        Output(RID.note, "children"),
        Output(RID.warning, "children"),
        Output(RID.heads, "options"),
        Output(RID.head, "options"),
        Output(RID.step_a, "options"),
        Output(RID.step_b, "options"),
        Output(RID.step_a, "value"),
        Output(RID.step_b, "value"),
        Input(RID.read, "n_clicks"),
        State(RID.run, "value"),
        State(RID.corpus, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (None, m, "", [], [], [], [], None, None))
    def read(_clicks, run, corpus):
        if not run or not run.strip():
            raise attnviz.InputError("give the run folder: the folder a training run wrote its checkpoint-*/ in")
        source: Any = corpus.strip() if corpus and corpus.strip() else (texts or _shipped())
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", UserWarning)
            df = attnviz.head_timeline(run.strip(), source, progress=False)
        first = attnviz.analysis.read_texts(source) if isinstance(source, str) else source
        text = next(iter(first))
        key = f"{run.strip()}|{corpus or ''}"
        kept[key] = (df, text)
        kept.move_to_end(key)
        while len(kept) > KEPT:
            kept.popitem(last=False)
        steps = df.attrs["steps"]
        heads = sorted({(int(r.layer), int(r.head)) for r in df[["layer", "head"]].itertuples(index=False)})
        head_options = [{"label": f"L{layer}·H{head}", "value": f"{layer}-{head}"} for layer, head in heads]
        step_options = [{"label": f"step {s}", "value": s} for s in steps]
        note = (
            f"{len(steps)} checkpoints (steps {steps[0]}–{steps[-1]}) of {run.strip()}, over {df.attrs['texts']:,} "
            f"texts ({df.attrs['tokens']:,} tokens), tokenized once."
        )
        duplicates = " ".join(str(w.message) for w in said if issubclass(w.category, UserWarning))
        warning = f"Same weights under two steps: {duplicates}" if df.attrs["duplicates"] else ""
        return {"key": key}, note, warning, head_options, head_options, step_options, step_options, steps[0], steps[-1]

    @app.callback(
        Output(RID.map, "figure"),
        Output(RID.heads, "value"),
        Input(RID.store, "data"),
        Input(RID.role, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: (message_figure(m), []))
    def draw(store, role):
        df, _ = timeline_of(store)
        crossed = df[(df.role == role) & df.passes][["layer", "head"]].drop_duplicates()
        chosen = [f"{int(r.layer)}-{int(r.head)}" for r in crossed.itertuples(index=False)]
        return timeline_map(df, role), chosen

    @app.callback(
        Output(RID.lines, "figure"),
        Input(RID.heads, "value"),
        State(RID.store, "data"),
        State(RID.role, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: message_figure(m))
    def lines(heads, store, role):
        df, _ = timeline_of(store)
        if not heads:
            return message_figure(f"No head meets {role} at any step: pick heads to draw.")
        chosen = [tuple(int(v) for v in h.split("-")) for h in heads]
        return timeline_lines(df, role, chosen, loss=df.attrs.get("loss") or None)

    @app.callback(
        Output(RID.pair, "figure"),
        Input(RID.compare, "n_clicks"),
        State(RID.store, "data"),
        State(RID.head, "value"),
        State(RID.step_a, "value"),
        State(RID.step_b, "value"),
        prevent_initial_call=True,
    )
    @shows_errors(lambda m: message_figure(m))
    def compare(_clicks, store, head, step_a, step_b):
        df, text = timeline_of(store)
        if head is None or step_a is None or step_b is None:
            return message_figure("Pick a head and two steps.")
        layer, h = (int(v) for v in head.split("-"))
        where = dict(zip(df.attrs["steps"], df.attrs["sources"]))
        a = attnviz.capture(where[step_a], text)
        b = attnviz.capture(where[step_b], text)
        return compare_heads(a, b, layer, h, names=(f"step {step_a}", f"step {step_b}"))


registers(
    View(
        "training",
        "Training",
        order=95,
        register=lambda app, server: register(app, server.texts),
        layout=lambda page: layout(),
    )
)
