"""Comparisons: the model's own numbers against attnviz's for one head, and two captures' same head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..errors import InputError, OutOfRangeError
from .common import MASKED_COLOUR, allowed_cells, labels, part_label, ticks
from .marks import boundary, marked_title, new_starts

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["compare_heads", "comparison"]


def comparison(cap: Capture, layer: int, head: int, *, part: str | None = None, mark_new: bool = True) -> go.Figure:
    """The model's own numbers, attnviz's recomputation, and their difference, for one head.

    With the model's weights (eager backends, captured with ``keep_weights=True``) this compares
    attention matrices; otherwise the attention outputs A·V (``[pos, d_head]``), which every
    backend returns. ``mark_new``: a generation's prompt boundary in each panel — rows are positions;
    columns are keys only when weights are compared (:mod:`attnviz.views.marks`).
    """
    rec = cap.layer(layer, part)
    cap.check_head(head, part)
    if rec.weights is not None:
        theirs, ours, what = rec.weights[head].float().cpu(), cap.attention(layer, head, part=part).cpu(), "weights A"
    elif rec.out is not None:
        theirs, ours, what = rec.out[head].float().cpu(), cap.output(layer, head, part=part).cpu(), "output A·V"
    else:
        raise InputError(f"layer {layer} holds neither the model's weights nor its output: nothing to compare")
    diff = (ours - theirs).numpy()
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=(f"model's {what}", f"attnviz's {what}", "difference"), horizontal_spacing=0.06
    )
    lim = float(max(abs(diff.min()), abs(diff.max()), 1e-12))
    for col, (z, scale, kw) in enumerate(
        ((theirs.numpy(), "Blues", {}), (ours.numpy(), "Blues", {}), (diff, "RdBu", dict(zmin=-lim, zmax=lim))), 1
    ):
        fig.add_trace(
            go.Heatmap(
                z=z, colorscale=scale, showscale=col == 3, hovertemplate="%{y}, %{x}: %{z:.3e}<extra></extra>", **kw
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    q_new, k_new = new_starts(cap, part, False, mark_new)
    k_new = k_new if rec.weights is not None else None  # A·V's columns are d_head, not keys
    shapes = []
    if q_new is not None:  # each panel's rows are positions
        for ref in ("", "2", "3"):
            shapes.append(boundary(y=q_new - 0.5, xref=f"x{ref} domain", yref=f"y{ref}"))
            if k_new is not None:
                shapes.append(boundary(x=k_new - 0.5, xref=f"x{ref}", yref=f"y{ref} domain"))
    fig.update_layout(
        title=marked_title(f"{part_label(cap, part)}L{layer}·H{head}: max |difference| {lim:.2e}", q_new),
        shapes=shapes,
        height=420,
        margin=dict(l=40, r=10, t=80, b=30),
    )
    return fig


def compare_heads(
    a: Capture,
    b: Capture,
    layer: int,
    head: int,
    *,
    words: bool = False,
    part_a: str | None = None,
    part_b: str | None = None,
    names: tuple[str, str] = ("A", "B"),
) -> go.Figure:
    """Two captures' same layer and head side by side — two texts on one model, or two models on
    one text — and, where their token (or word) grids have the same size, the difference A − B,
    position by position (a label that differs reads "big/small").

    A layer or head that one capture lacks is an :class:`OutOfRangeError` naming both sizes."""
    maps = []
    for cap, part, name in ((a, part_a, names[0]), (b, part_b, names[1])):
        info = cap.info(part)
        if layer not in cap.layer_indices(part) or not 0 <= head < info["n_heads"]:
            raise OutOfRangeError(
                f"{name} has layers {cap.layer_indices(part)} and heads 0..{info['n_heads'] - 1}; "
                f"L{layer}·H{head} is not one of them: choose a layer and head both captures have"
            )
        w = cap.attention(layer, head, part=part, words=words).cpu()
        allowed = allowed_cells(cap, layer, None, words, part)
        maps.append(
            (
                torch.where(allowed, w, torch.full_like(w, float("nan"))),
                labels(cap, words, part, "query"),
                labels(cap, words, part, "key"),
            )
        )
    (wa, qa, ka), (wb, qb, kb) = maps
    same_grid = len(qa) == len(qb) and len(ka) == len(kb)

    def merged(x: list[str], y: list[str]) -> list[str]:
        return [p if p == q else f"{p}/{q}" for p, q in zip(x, y)]

    unit = "words" if words else "tokens"
    titles = [f"{names[0]} — {a.model.get('name', '')}", f"{names[1]} — {b.model.get('name', '')}"]
    if same_grid:
        titles.append(f"{names[0]} − {names[1]}")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.08)
    top = max(float(wa.nan_to_num(0).max()), float(wb.nan_to_num(0).max()), 1e-6)
    for col, (w, q_names, k_names) in enumerate(maps, 1):
        fig.add_trace(
            go.Heatmap(
                z=w.numpy().round(5),
                colorscale="Blues",
                zmin=0,
                zmax=top,
                showscale=col == 1,
                colorbar=dict(title="weight", x=1.0 if same_grid else 1.02, len=0.9),
                hovertemplate="query %{y} → key %{x}: %{z:.4f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(row=1, col=col, **ticks(k_names, 32))  # key labels below: the panel titles are above
        fig.update_yaxes(autorange="reversed", row=1, col=col, **ticks(q_names, 32))
    if same_grid:
        diff = (wa - wb).numpy()
        lim = float(max(np.nanmax(np.abs(diff)) if np.isfinite(diff).any() else 0.0, 1e-6))
        fig.add_trace(
            go.Heatmap(
                z=diff.round(5),
                colorscale="RdBu",
                zmin=-lim,
                zmax=lim,
                colorbar=dict(title="A − B", x=1.09, len=0.9),
                hovertemplate="query %{y} → key %{x}: %{z:+.4f}<extra></extra>",
            ),
            row=1,
            col=3,
        )
        fig.update_xaxes(row=1, col=3, **ticks(merged(ka, kb), 32))
        fig.update_yaxes(autorange="reversed", row=1, col=3, **ticks(merged(qa, qb), 32))
        differ = [m for m in merged(qa, qb) if "/" in m]
        count = f"1 {unit[:-1]} differs" if len(differ) == 1 else f"{len(differ)} {unit} differ"
        note = f"max |A − B| {lim:.3f}" + (
            f"; position by position, {count} ({', '.join(differ[:3])})" if differ else ""
        )
    else:
        note = f"no difference map: the {unit} differ ({len(qa)} vs {len(qb)})" + (
            "" if words else "; compare words instead"
        )
    fig.update_layout(
        title=f"L{layer}·H{head}, {unit}: {note}",
        plot_bgcolor=MASKED_COLOUR,
        height=max(420, min(900, 14 * max(len(qa), len(qb)) + 180)),
        margin=dict(l=60, r=20, t=90, b=100),
    )
    return fig
