"""A long text's map: one head pooled into blocks of whole tokens (the *overview*), and the exact
weights of a window of it. Both are drawn on category axes, one category per block, named by its
token range ("512–519 ('the'…'cat')"), so hover reads them whatever the length. Each shows the
weights, or (``measure="moved"``) what the head moves, α_ij·‖f_h(x_j)‖, pooled the same way."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import torch

from ..analysis.overview import overview, window
from .common import MASKED_COLOUR, above_top_axis, labels, measure_symbol, part_label, themed
from .marks import MARK, boundary, mark_labels, new_starts

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["OVERVIEW_SIZE", "TICKS", "categories", "overview_figure", "window_figure"]

OVERVIEW_SIZE = 512  # blocks per side of the overview (its payload: ~1.8 MB at 512 × 512, whatever n)
TICKS = 32  # labelled categories per axis


def categories(names: list[str], edges: list[int]) -> list[str]:
    """One unique axis category per block, naming its tokens: "517 'the'" or "512–519 ('the'…'cat')"."""
    out = []
    for a, b in zip(edges, edges[1:]):
        out.append(f"{a} {names[a]!r}" if b - a == 1 else f"{a}–{b - 1} ({names[a]!r}…{names[b - 1]!r})")
    return out


def _axis(cats: list[str], names: list[str], edges: list[int], title: str, new: int | None, **extra) -> dict:
    step = max(1, math.ceil(len(cats) / TICKS))
    idx = list(range(0, len(cats), step))
    return dict(
        type="category",
        title=title,
        tickmode="array",
        tickvals=[cats[i] for i in idx],
        ticktext=mark_labels([f"{edges[i]} {names[edges[i]]}" for i in idx], new, [edges[i] for i in idx]),
        showgrid=False,
        **extra,
    )


def _at(edges: list[int], token: int | None) -> float | None:
    """Where ``token``'s left edge falls among the blocks, in category units (None: outside them)."""
    if token is None or not edges[0] <= token < edges[-1]:
        return None
    i = next(i for i, (a, b) in enumerate(zip(edges, edges[1:])) if a <= token < b)
    return i + (token - edges[i]) / (edges[i + 1] - edges[i]) - 0.5


def _grid_figure(
    cap: Capture,
    z: torch.Tensor,  # [rows, cols], NaN where nothing is attended
    row_edges: list[int],
    col_edges: list[int],
    *,
    title: str,
    hint: str | None,
    hover: str,
    part: str | None,
    mark_new: bool,
    measure: str = "weights",
) -> go.Figure:
    q_names, k_names = labels(cap, False, part, "query"), labels(cap, False, part, "key")
    q_new, k_new = new_starts(cap, part if part in cap.parts else None, False, mark_new)
    rows, cols = categories(q_names, row_edges), categories(k_names, col_edges)
    finite = z[torch.isfinite(z)]
    top = max(float(finite.max()), 1e-6) if finite.numel() else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z.numpy(),  # float32: base64 on the wire, 4 bytes a cell
            x=cols,
            y=rows,
            colorscale="Blues",
            zmin=0,
            zmax=top,
            hovertemplate=hover,
            colorbar=dict(title=measure_symbol(measure)),
        )
    )
    shapes = []  # a generation's prompt boundary, where it falls among the blocks
    if (x := _at(col_edges, k_new)) is not None:
        shapes.append(boundary(x=x, yref="paper"))
    if (y := _at(row_edges, q_new)) is not None:
        shapes.append(boundary(y=y, xref="paper"))
    if q_new is not None or k_new is not None:
        title += f" — {MARK} generated from token {q_new if q_new is not None else k_new}"
    if hint:
        title += f"<br><sup>{hint}</sup>"
    key_side, query_side = ("source ", "target ") if cap.resolve_part(part) == "cross" else ("", "")
    xaxis = _axis(cols, k_names, col_edges, f"key ({key_side}tokens attended to)", k_new, side="top", tickangle=-45)
    plain = [
        f"{col_edges[i]} {k_names[col_edges[i]]}" for i in range(0, len(cols), max(1, math.ceil(len(cols) / TICKS)))
    ]
    top_axis = above_top_axis(title, plain, angle=-45)
    fig.update_layout(
        title=top_axis["title"],
        xaxis=xaxis,
        yaxis=_axis(rows, q_names, row_edges, f"query ({query_side}tokens attending)", q_new, autorange="reversed"),
        plot_bgcolor=MASKED_COLOUR,
        margin=dict(l=140, r=20, t=top_axis["margin_top"], b=20),
        height=820,
        shapes=shapes,
    )
    return fig


@themed
def overview_figure(
    cap: Capture,
    layer: int,
    head: int,
    *,
    part: str | None = None,
    mode: str = "max",
    size: int = OVERVIEW_SIZE,
    hint: str | None = None,
    mark_new: bool = True,
    measure: str = "weights",
) -> go.Figure:
    """The head's map pooled (:func:`attnviz.analysis.overview.overview`) into at most ``size``² blocks
    of whole tokens, each the ``mode`` ("max" or "mean") of its weights; a block whose every cell is
    masked is left empty. ``hint``: a line under the title (the dashboard's "drag a box…");
    ``mark_new``: a generation's prompt boundary drawn where it falls (:mod:`attnviz.views.marks`).

    ``measure="moved"``: each block is the max (or mean) of what the head moves, α_ij·‖f_h(x_j)‖,
    in it — the most (or the average) any query of the block receives from any key of it; the colour
    scale runs from 0 to the largest block."""
    ov = overview(cap, layer, head, part=part, size=size, mode=mode, measure=measure)
    moved = measure == "moved"
    what = "‖α·f(x)‖" if moved else "weight"
    n_q, n_k = len(labels(cap, False, part, "query")), len(labels(cap, False, part, "key"))
    z = ov.values.clone()
    z[z == 0] = float("nan")  # a block whose every cell is masked (or exactly 0): left empty
    wr, wc = ov.block
    title = (
        f"{part_label(cap, part)}L{layer}·H{head} — overview of {n_q:,} × {n_k:,} tokens: "
        f"the {mode} {'moved (‖α·f(x)‖)' if moved else 'weight'} of each block of {wr}×{wc} tokens"
    )
    hover = f"queries %{{y}}<br>keys %{{x}}<br>{mode} {what} %{{z:.4{'g' if moved else 'f'}}}<extra></extra>"
    return _grid_figure(
        cap,
        z,
        ov.row_edges,
        ov.col_edges,
        title=title,
        hint=hint,
        hover=hover,
        part=part,
        mark_new=mark_new,
        measure=measure,
    )


@themed
def window_figure(
    cap: Capture,
    layer: int,
    head: int,
    rows: tuple[int, int],
    keys: tuple[int, int],
    *,
    part: str | None = None,
    hint: str | None = None,
    mark_new: bool = True,
    measure: str = "weights",
) -> go.Figure:
    """The exact weights of queries ``rows[0]:rows[1]`` × keys ``keys[0]:keys[1]`` of a long text
    (:func:`attnviz.analysis.overview.window`), masked cells empty, on the overview's category axes;
    ``measure="moved"``: the exact values moved, α_ij·‖f_h(x_j)‖, there, on a scale 0..their largest."""
    w = window(cap, layer, head, (rows[0], rows[1]), (keys[0], keys[1]), part=part, measure=measure)
    moved = measure == "moved"
    allowed = cap.allowed(layer, part=part)[rows[0] : rows[1], keys[0] : keys[1]]
    z = torch.where(allowed, w, torch.full_like(w, float("nan")))
    n_q, n_k = len(labels(cap, False, part, "query")), len(labels(cap, False, part, "key"))
    row_edges, col_edges = list(range(rows[0], rows[1] + 1)), list(range(keys[0], keys[1] + 1))
    title = (
        f"{part_label(cap, part)}L{layer}·H{head} — exact {'moved (‖α·f(x)‖)' if moved else 'weights'} of queries {rows[0]}–{rows[1] - 1} "
        f"× keys {keys[0]}–{keys[1] - 1} (of {n_q:,} × {n_k:,} tokens)"
    )
    hover = "query %{y} → key %{x}<br>" + ("moved ‖α·f(x)‖ %{z:.4g}" if moved else "weight %{z:.4f}")
    return _grid_figure(
        cap,
        z,
        row_edges,
        col_edges,
        title=title,
        hint=hint,
        hover=hover + "<extra></extra>",
        part=part,
        mark_new=mark_new,
        measure=measure,
    )
