"""Heads over training: the figures of :func:`attnviz.head_timeline`'s table.

:func:`timeline_map`: one role's score for every head (rows ``L0·H1``) at every step (columns), the role's
threshold in the title and each head's first step past it marked. :func:`timeline_lines`: a line per chosen head
over the steps, the threshold dashed and each line's first crossing marked and labelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from ..analysis.atlas import ROLES
from ..errors import InputError
from .common import themed

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["first_crossings", "timeline_lines", "timeline_map"]


def _role_rows(df: pd.DataFrame, role: str) -> pd.DataFrame:
    if role not in ROLES:
        raise InputError(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
    rows = df[df["role"] == role]
    if rows.empty:
        have = ", ".join(dict.fromkeys(df["role"])) or "none"
        raise InputError(f"the timeline holds no {role!r} scores (its roles: {have}): run it with that role")
    return rows


def first_crossings(df: pd.DataFrame, role: str) -> dict[tuple[int, int], int]:
    """``{(layer, head): step}``: the first step at which each head meets ``role`` (heads that never do are left
    out)."""
    rows = _role_rows(df, role)
    passing = rows[rows["passes"]].sort_values("step")
    first = passing.groupby(["layer", "head"])["step"].min()
    return {(int(layer), int(head)): int(step) for (layer, head), step in first.items()}


def _label(layer: int, head: int) -> str:
    return f"L{layer}·H{head}"


@themed
def timeline_map(df: pd.DataFrame, role: str, *, title: str | None = None) -> go.Figure:
    """A heatmap of ``role``'s score: a row per head, a column per step; ``×`` marks each head's first step past
    the threshold."""
    rows = _role_rows(df, role)
    table = rows.pivot_table(index=["layer", "head"], columns="step", values="score", aggfunc="first")
    steps = [int(s) for s in table.columns]
    heads = [(int(layer), int(head)) for layer, head in table.index]
    labels = [_label(*h) for h in heads]
    x = [str(s) for s in steps]  # category axis: steps unevenly spaced stay readable
    spec = ROLES[role]
    fig = go.Figure(
        go.Heatmap(
            z=table.to_numpy(dtype=float),
            x=x,
            y=labels,
            colorscale="Viridis",
            zmin=0.0,
            zmax=max(1.0, float(np.nanmax(table.to_numpy(dtype=float)))) if table.size else 1.0,
            colorbar={"title": "score"},
            hovertemplate="%{y} at step %{x}: %{z:.3f}<extra></extra>",
        )
    )
    crossings = first_crossings(df, role)
    marked = [(str(step), _label(*head)) for head, step in crossings.items()]
    if marked:
        fig.add_trace(
            go.Scatter(
                x=[m[0] for m in marked],
                y=[m[1] for m in marked],
                mode="markers",
                marker={"symbol": "x", "color": "white", "size": 10, "line": {"width": 1, "color": "black"}},
                name="first crossing",
                hovertemplate="%{y} first meets the role at step %{x}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title or f"{role} over training (meets it: score {spec.side} {spec.threshold:g}; × first step)",
        xaxis={"title": "step", "type": "category"},
        yaxis={"title": "head", "autorange": "reversed", "type": "category"},
        height=max(300, 22 * len(labels) + 140),
        margin={"l": 70, "r": 20, "t": 60, "b": 50},
        showlegend=False,
    )
    return fig


@themed
def timeline_lines(
    df: pd.DataFrame,
    role: str,
    heads: list[tuple[int, int]] | None = None,
    *,
    loss: dict[int, float] | None = None,
    title: str | None = None,
) -> go.Figure:
    """A line of ``role``'s score per head of ``heads`` (default: the heads that ever meet the role, else the
    best one at the last step) over the steps, the threshold dashed, each line's first crossing marked with its
    step; ``loss`` (``{step: loss}``) drawn beside on a second axis."""
    rows = _role_rows(df, role)
    crossings = first_crossings(df, role)
    if heads is None:
        best = rows.sort_values(["step", "score"]).iloc[-1]
        heads = sorted(crossings) or [(int(best["layer"]), int(best["head"]))]
    spec = ROLES[role]
    fig = go.Figure()
    for layer, head in heads:
        line = rows[(rows["layer"] == layer) & (rows["head"] == head)].sort_values("step")
        if line.empty:
            raise InputError(f"the timeline has no head {_label(layer, head)}")
        fig.add_trace(go.Scatter(x=line["step"], y=line["score"], mode="lines+markers", name=_label(layer, head)))
        step = crossings.get((layer, head))
        if step is not None:
            score = float(line[line["step"] == step]["score"].iloc[0])
            fig.add_trace(
                go.Scatter(
                    x=[step],
                    y=[score],
                    mode="markers+text",
                    marker={"symbol": "star", "size": 14, "color": "black"},
                    text=[f"{_label(layer, head)} step {step}"],
                    textposition="top left",
                    name=f"{_label(layer, head)} first crossing",
                    showlegend=False,
                )
            )
    fig.add_hline(
        y=spec.threshold, line_dash="dash", line_color="grey", annotation_text=f"threshold {spec.threshold:g}"
    )
    layout: dict[str, Any] = {
        "title": title or f"{role} score over training",
        "xaxis": {"title": "step"},
        "yaxis": {"title": "score", "range": [0, 1.05]},
        "height": 380,
        "margin": {"l": 60, "r": 60, "t": 60, "b": 50},
    }
    if loss:
        steps = sorted(loss)
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=[loss[s] for s in steps],
                name="loss",
                yaxis="y2",
                line={"color": "firebrick", "dash": "dot"},
            )
        )
        layout["yaxis2"] = {"title": "loss", "overlaying": "y", "side": "right", "showgrid": False}
    fig.update_layout(**layout)
    return fig
