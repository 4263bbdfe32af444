"""A generation replayed step by step: the two rows of weights behind each token the model wrote."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import InputError
from .common import themed
from .marks import MARK, NEW_COLOUR, boundary, marked

if TYPE_CHECKING:
    from ..workflows.generation_result import Generation, GenerationStep

__all__ = ["step_figure", "step_row", "step_summary"]

HEAD_COLOUR = "#1f77b4"  # the chosen head's bars
MEAN_COLOUR = "#2ca02c"  # the mean over the layer's heads


def step_row(step: GenerationStep, layer: int, head: int) -> tuple[int, int]:
    """Where ``layer`` and the model's head ``head`` sit in the step's rows ``[layer, head, key]`` (an
    :class:`InputError` for a layer or head it does not hold; a
    :class:`~attnviz.errors.HeadNotKeptError` for a head ``generate(heads=)`` did not keep)."""
    if layer not in step.layers:
        raise InputError(f"layer {layer} was not captured; captured layers: {step.layers}")
    return step.layers.index(layer), step.head_index(head)


@themed
def step_figure(gen: Generation, step: GenerationStep, layer: int, head: int) -> go.Figure:
    """One step of a generation (``gen.step(i)``) at one layer: two rows of weights over the tokens so far.

    Top: the row of the position before the new token, whose output chose it (``chosen_by``).
    Bottom: the new token's own row when the model read it (the lab's query row). Bars: head
    ``head`` (the model's number); line: the mean over the layer's heads (those kept, with
    ``generate(heads=)``). The rows are the ones the model computed."""
    li, hi = step_row(step, layer, head)
    n_heads = step.weights.shape[1]
    heads = f"{n_heads} heads" if step.heads is None else f"{n_heads} kept heads"
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
                y=rows[li, hi].numpy().round(5),
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
                name=f"mean of L{layer}'s {heads}",
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
        fig.add_shape(boundary(x=gen.prompt_length - 0.5, xref=f"x{ref}", yref=f"y{ref} domain"))
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks, tickangle=-45, row=2, col=1)
    # the title on two lines and the legend on a row of its own above the first subplot's title: at a
    # page's width (1280 px) one long line was cut on the right and the legend covered that subplot title
    fig.update_layout(
        title=dict(
            text=f"Step {step.index} of 0…{len(gen) - 1}: the model wrote {MARK}{token!r} at position "
            f"{step.position}<br><sup>L{layer}·H{head} bars, the mean over heads as a line; {MARK} generated</sup>",
            y=0.965,
            yanchor="top",
        ),
        height=560,
        margin=dict(l=50, r=10, t=120, b=90),
        legend=dict(orientation="h", y=1.07, yanchor="bottom", x=1, xanchor="right"),
        bargap=0.15,
    )
    return fig


def step_summary(gen: Generation, step: GenerationStep, layer: int, head: int) -> str:
    """One line for a step: the token written, and where each of its two rows looked most."""
    li, hi = step_row(step, layer, head)
    names = gen.sequence.token_labels[: step.position + 1]
    token = names[step.position]

    def top(rows) -> str:
        h, mean = rows[li, hi], rows[li].mean(0)
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
