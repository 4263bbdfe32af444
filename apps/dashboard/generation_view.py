"""Generation in the dashboard: the "Continue the text" control, the marks on generated tokens in
every view, and the AttentionLab's step slider that replays a generation token by token.

The pure helpers (``new_start``, ``mark_*``, ``step_marks``, ``step_figure``, ``step_summary``) take a
capture or a figure and plain selections, so they are tested without a browser.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update
from plotly.subplots import make_subplots

import attnviz
from attnviz import figures

from .common import message_figure
from .errors import only_on, shows_errors
from .ids import GID, ID

if TYPE_CHECKING:
    from .captures import Captures

MAX_NEW_TOKENS = 512  # the page's bound; the model's own context bounds it too (the library says so)
DEFAULT_NEW_TOKENS = 20
MARK = "▸"  # before the label of every generated token, in every figure
NEW_COLOUR = "#e6550d"  # generated tokens' labels and the prompt boundary
HEAD_COLOUR = "#1f77b4"
MEAN_COLOUR = "#2ca02c"
MODEL_VIEW_CELLS = 24  # the model view's thumbnail size (passed to figures.model_view, used for its marks)


# ---------------------------------------------------------------- which tokens are new
def generation_of(cap: attnviz.Capture | None) -> attnviz.Generation | None:
    """The generation a capture holds, or None for a capture of one forward."""
    if cap is None or "generation" not in cap.model:
        return None
    return attnviz.Generation.of(cap)


def new_start(cap: attnviz.Capture, part: str | None = None, words: bool = False, axis: str = "query") -> int | None:
    """Where the generated tokens (or words) start on one axis of a part's matrix; None when that axis
    holds none (a capture of one forward, an encoder's source, cross-attention's keys)."""
    info = cap.model.get("generation")
    if not info:
        return None
    if len(cap.parts) == 1:
        name = cap.parts[0]
    elif part in cap.parts:
        name = part
    else:  # an encoder-decoder's views always say which part they show
        return None
    generated = {"decoder": ("query", "key"), "cross": ("query",)}.get(name, ())
    if axis not in generated:
        return None
    queries, keys = cap.sequences(name)
    seq = queries if axis == "query" else keys
    first = int(info["prompt_length"])
    if first >= seq.n_tokens:
        return None
    if not words:
        return first
    return next((i for i, w in enumerate(seq.words) if w.token_stop > first), None)


def marked(label: str) -> str:
    """A generated token's tick label: the mark, in the generated colour."""
    return f'<span style="color:{NEW_COLOUR}">{MARK}{label}</span>'


def _mark_axis(axis, start: int) -> None:
    if axis.tickvals is None or axis.ticktext is None:
        return
    axis.ticktext = [marked(t) if v >= start else t for v, t in zip(axis.tickvals, axis.ticktext)]


def _line(
    fig: go.Figure,
    *,
    x: float | None = None,
    y: float | None = None,
    xref: str = "x",
    yref: str = "y",
    span: tuple[float, float] = (0, 1),
) -> None:
    """A thin dotted line where the generated tokens start: vertical at ``x``, or horizontal at ``y``,
    over ``span`` of the other axis (in ``xref``/``yref`` units: "paper", "x domain"…)."""
    line = dict(color=NEW_COLOUR, width=1.5, dash="dot")
    if x is not None:
        fig.add_shape(type="line", xref=xref, yref=yref, x0=x, x1=x, y0=span[0], y1=span[1], line=line, layer="above")
    else:
        fig.add_shape(type="line", xref=xref, yref=yref, x0=span[0], x1=span[1], y0=y, y1=y, line=line, layer="above")


def _say(fig: go.Figure) -> None:
    title = fig.layout.title.text or ""
    if MARK not in title:
        fig.update_layout(title_text=f"{title} — {MARK} generated")


def mark_matrix(fig: go.Figure, query_start: int | None, key_start: int | None) -> go.Figure:
    """A query × key heatmap (heatmap, rollout): marked tick labels and the prompt boundary on each axis."""
    if query_start is None and key_start is None:
        return fig
    if key_start is not None:
        _mark_axis(fig.layout.xaxis, key_start)
        _line(fig, x=key_start - 0.5, yref="paper")
    if query_start is not None:
        _mark_axis(fig.layout.yaxis, query_start)
        _line(fig, y=query_start - 0.5, xref="paper")
    _say(fig)
    return fig


def mark_bars(fig: go.Figure, key_start: int | None) -> go.Figure:
    """A row of weights over the keys (the lab's query row, rollout's bars)."""
    if key_start is None:
        return fig
    _mark_axis(fig.layout.xaxis, key_start)
    _line(fig, x=key_start - 0.5, yref="paper")
    _say(fig)
    return fig


def mark_head_view(fig: go.Figure, query_start: int | None, key_start: int | None) -> go.Figure:
    """The head view's token columns: generated labels marked and coloured, a line under the prompt."""
    if query_start is None and key_start is None:
        return fig
    for trace in fig.data:
        start = {"query": query_start, "key": key_start}.get(trace.name)
        if start is None or trace.text is None:
            continue
        # long texts label every n-th token ("" between) and name each one on hover
        trace.text = [marked(t) if i >= start and t else t for i, t in enumerate(trace.text)]
        if trace.hovertext is not None and not isinstance(trace.hovertext, str):
            trace.hovertext = [MARK + t if i >= start else t for i, t in enumerate(trace.hovertext)]
        _line(fig, y=start - 0.5, span=(-0.6, 0.05) if trace.name == "query" else (0.95, 1.6))
    _say(fig)
    return fig


def mark_mosaic(
    fig: go.Figure,
    cap: attnviz.Capture,
    query_start: int | None,
    key_start: int | None,
    *,
    words: bool,
    part: str | None,
) -> go.Figure:
    """The model view's thumbnails (``MODEL_VIEW_CELLS`` wide): the prompt boundary in every one of them,
    as one line per row of layers and one per column of heads (pooled thumbnails: where it falls)."""
    if query_start is None and key_start is None:
        return fig
    n_q, n_k = len(figures.labels(cap, words, part, "query")), len(figures.labels(cap, words, part, "key"))
    t_q, t_k = min(n_q, MODEL_VIEW_CELLS), min(n_k, MODEL_VIEW_CELLS)
    n_layers, n_heads = len(cap.layer_indices(part)), cap.info(part)["n_heads"]
    height, width = n_layers * (t_q + 1) - 1, n_heads * (t_k + 1) - 1
    line = dict(color=NEW_COLOUR, width=1, dash="dot")
    if query_start is not None:
        for r in range(n_layers):
            y = r * (t_q + 1) + query_start * t_q / n_q - 0.5
            fig.add_shape(type="line", x0=-0.5, x1=width - 0.5, y0=y, y1=y, line=line, layer="above")
    if key_start is not None:
        for h in range(n_heads):
            x = h * (t_k + 1) + key_start * t_k / n_k - 0.5
            fig.add_shape(type="line", x0=x, x1=x, y0=-0.5, y1=height - 0.5, line=line, layer="above")
    _say(fig)
    return fig


def mark_comparison(fig: go.Figure, query_start: int | None, key_start: int | None, *, weights: bool) -> go.Figure:
    """The validation's three panels (model, attnviz, difference): rows are positions; columns are keys
    only when the model's weights are compared (its outputs' columns are d_head)."""
    if query_start is None:
        return fig
    for ref in ("", "2", "3"):
        _line(fig, y=query_start - 0.5, xref=f"x{ref} domain", yref=f"y{ref}")
        if weights and key_start is not None:
            _line(fig, x=key_start - 0.5, xref=f"x{ref}", yref=f"y{ref} domain")
    _say(fig)
    return fig


def mark_view(
    fig: go.Figure, cap: attnviz.Capture, view: str, *, words: bool = False, part: str | None = None
) -> go.Figure:
    """Mark the generated tokens of ``cap`` in one view's figure (a no-op for a capture of one forward).

    ``view``: "matrix" (heatmap, rollout), "bars" (the lab's row), "head", "model" or "comparison"."""
    if "generation" not in cap.model:
        return fig
    part = part if part in cap.parts else None
    q, k = new_start(cap, part, words, "query"), new_start(cap, part, words, "key")
    if view == "matrix":
        return mark_matrix(fig, q, k)
    if view == "bars":
        return mark_bars(fig, k)
    if view == "head":
        return mark_head_view(fig, q, k)
    if view == "model":
        return mark_mosaic(fig, cap, q, k, words=words, part=part)
    if view == "comparison":
        return mark_comparison(fig, q, k, weights=cap.layer(cap.layer_indices(part)[0], part).weights is not None)
    raise ValueError(f"unknown view {view!r}")


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


def _layer_row(step: attnviz.GenerationStep, layer: int, head: int) -> int:
    """Where ``layer`` sits in the step's rows (with a message for a layer or head it does not hold)."""
    if layer not in step.layers:
        raise attnviz.InputError(f"layer {layer} was not captured; captured layers: {step.layers}")
    n_heads = step.weights.shape[1]
    if not 0 <= head < n_heads:
        raise attnviz.InputError(f"head {head} is out of range: heads 0..{n_heads - 1}")
    return step.layers.index(layer)


def step_figure(gen: attnviz.Generation, step: attnviz.GenerationStep, layer: int, head: int) -> go.Figure:
    """One step of a generation (``gen.step(i)``) at one layer: two rows of weights over the tokens so far.

    Top: the row of the position before the new token, whose output chose it (``chosen_by``).
    Bottom: the new token's own row when the model read it (the lab's query row). Bars: head
    ``head``; line: the mean over the layer's heads. The rows are the ones the model computed."""
    li = _layer_row(step, layer, head)
    n_heads = step.weights.shape[1]
    names = gen.sequence.token_labels[: step.position + 1]
    ticks = [marked(t) if i >= gen.prompt_length else t for i, t in enumerate(names)]
    token, chooser = names[step.position], names[step.position - 1] if step.position else names[0]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.16,
        subplot_titles=(
            f"choosing {token!r}: the row of {chooser!r} (#{step.position - 1}), whose output predicted it",
            f"reading {token!r} (#{step.position}): its own row — the lab's query",
        ),
    )
    xs = list(range(len(names)))
    for row, rows in ((1, step.chosen_by), (2, step.weights)):
        fig.add_trace(
            go.Bar(
                x=xs,
                y=rows[li, head].numpy().round(5),
                marker_color=[NEW_COLOUR if i >= gen.prompt_length else HEAD_COLOUR for i in xs],
                name=f"L{layer}·H{head}",
                legendgroup="head",
                showlegend=row == 1,
                customdata=names,
                hovertemplate="%{customdata}: %{y:.4f}<extra>" + f"L{layer}·H{head}</extra>",
            ),
            row=row,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=rows[li].mean(0).numpy().round(5),
                mode="lines+markers",
                line=dict(color=MEAN_COLOUR, width=2),
                marker=dict(size=5),
                name=f"mean of L{layer}'s {n_heads} heads",
                legendgroup="mean",
                showlegend=row == 1,
                customdata=names,
                hovertemplate="%{customdata}: %{y:.4f}<extra>mean over heads</extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text="weight", range=[0, 1.02], row=row, col=1)
        ref = "" if row == 1 else "2"
        _line(fig, x=gen.prompt_length - 0.5, xref=f"x{ref}", yref=f"y{ref} domain")
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, tickangle=-45, row=2, col=1)
    fig.update_layout(
        title=f"Step {step.index} of 0…{len(gen) - 1}: the model wrote {MARK}{token!r} at position {step.position} "
        f"(L{layer}·H{head} bars, the mean over heads as a line; {MARK} generated)",
        height=520,
        margin=dict(l=50, r=10, t=90, b=90),
        legend=dict(orientation="h", y=1.08, x=1, xanchor="right"),
        bargap=0.15,
    )
    return fig


def step_summary(gen: attnviz.Generation, step: attnviz.GenerationStep, layer: int, head: int) -> str:
    """One line for a step: the token written, and where each of its two rows looked most."""
    li = _layer_row(step, layer, head)
    names = gen.sequence.token_labels[: step.position + 1]
    token = names[step.position]

    def top(rows) -> str:
        h, mean = rows[li, head], rows[li].mean(0)
        return (
            f"{names[int(h.argmax())]!r} {float(h.max()):.2f} at L{layer}·H{head}, "
            f"{names[int(mean.argmax())]!r} {float(mean.max()):.2f} averaged over heads"
        )

    before = names[step.position - 1] if step.position else names[0]
    return (
        f"Step {step.index}: the model wrote {MARK}{token!r} (position {step.position}). "
        f"Choosing it, {before!r} looked most at {top(step.chosen_by)}. "
        f"Reading it, {token!r} looked most at {top(step.weights)}."
    )


# ---------------------------------------------------------------- layout and callbacks
def controls() -> list:
    """The "Continue the text" control, placed beside "Run model"."""
    return [
        html.Span("Continue the text by ", style={"color": "#555"}),
        dcc.Input(
            id=GID.new_tokens,
            type="number",
            min=1,
            max=MAX_NEW_TOKENS,
            step=1,
            value=DEFAULT_NEW_TOKENS,
            style={"width": "64px"},
        ),
        html.Span(" new tokens ", style={"color": "#555"}),
        html.Button(
            "Generate",
            id=GID.generate,
            n_clicks=0,
            style={"marginRight": "12px"},
            title="the model writes the continuation (greedy); every view then shows prompt + new tokens, "
            f"the new ones marked {MARK}",
        ),
        html.Span(id=GID.progress, style={"color": NEW_COLOUR, "marginRight": "8px"}),
    ]


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
