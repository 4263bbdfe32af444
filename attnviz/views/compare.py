"""Comparisons: the model's own numbers against attnviz's for one head, and two captures' same head."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..analysis.overview import check_measure, overview, window
from ..errors import HeadNotKeptError, InputError, OutOfRangeError
from .common import (
    MASKED_COLOUR,
    allowed_cells,
    labels,
    measure_map,
    measure_name,
    measure_symbol,
    part_label,
    themed,
    ticks,
)
from .marks import boundary, marked_title, new_starts
from .overview import categories

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = [
    "COMPARE_BLOCKS",
    "COMPARE_LONG",
    "COMPARISON_CELLS",
    "compare_heads",
    "comparison_window",
    "max_difference",
    "validation_comparison",
]


COMPARISON_CELLS = 65_536  # cells a panel shows at most: three float32 panels, ~1 MB on the wire


def comparison_window(shape: tuple[int, int], worst: tuple[int, int], cells: int = COMPARISON_CELLS) -> tuple:
    """((row0, row1), (col0, col1)): the part of a ``shape`` map that :func:`validation_comparison` shows — all of
    it when it has at most ``cells`` cells, else a window of at most ``cells`` cells around ``worst``
    (every column when that leaves room for a square's rows, as ``[n, d_head]`` outputs do)."""
    n_r, n_c = shape
    if n_r * n_c <= cells:
        return (0, n_r), (0, n_c)
    w_c = min(n_c, max(math.isqrt(cells), cells // n_r))
    w_r = min(n_r, cells // w_c)

    def around(i: int, width: int, n: int) -> tuple[int, int]:
        start = min(max(i - width // 2, 0), n - width)
        return start, start + width

    return around(worst[0], w_r, n_r), around(worst[1], w_c, n_c)


@themed
def validation_comparison(
    cap: Capture,
    layer: int,
    head: int,
    *,
    part: str | None = None,
    mark_new: bool = True,
    cells: int = COMPARISON_CELLS,
    measure: str = "weights",
) -> go.Figure:
    """The model's own numbers, attnviz's recomputation, and their difference, for one head.

    With the model's weights (eager backends, captured with ``keep_weights=True``) this compares
    attention matrices; otherwise the attention outputs A·V (``[pos, d_head]``), which every
    backend returns. ``mark_new``: a generation's prompt boundary in each panel — rows are positions;
    columns are keys only when weights are compared (:mod:`attnviz.views.marks`).

    A long text's map (more than ``cells`` cells: past 1,024 rows of ``d_head`` 64, or 256² weights)
    is shown as an exact window of it, around its largest |difference| (:func:`comparison_window`):
    the title says which rows (and keys) and where the largest is, and the max |difference| in the
    title and the colour scale is still the whole map's. The axes are the map's own positions.

    ``measure="moved"`` compares what the head moves, α_ij·‖f_h(x_j)‖: the model's own weights times
    the captured value norms against :meth:`Capture.moved` — only where the model's weights
    were kept (the output A·V has no per-key numbers to weigh).
    """
    moved = check_measure(measure) == "moved"
    rec = cap.layer(layer, part)
    index = cap.head_index(layer, head, part)  # the model's head → its place in the record's stacks
    if moved:
        if rec.weights is None:
            raise InputError(
                f"layer {layer} holds the model's output A·V, not its weights: moved (‖α·f(x)‖) is compared only "
                "against the model's own weights — capture with keep_weights=True on an eager backend, or "
                "compare the weights"
            )
        norms = cap.value_norms(layer, part=part)[index].float().cpu()
        theirs = rec.weights[index].float().cpu() * norms[None, :]
        ours, what = cap.moved(layer, head, part=part).cpu(), "‖A·f(x)‖ (moved)"
    elif rec.weights is not None:
        theirs, ours, what = rec.weights[index].float().cpu(), cap.attention(layer, head, part=part).cpu(), "weights A"
    elif rec.out is not None:
        theirs, ours, what = rec.out[index].float().cpu(), cap.output(layer, head, part=part).cpu(), "output A·V"
    else:
        raise InputError(f"layer {layer} holds neither the model's weights nor its output: nothing to compare")
    weights = rec.weights is not None
    full = (ours - theirs).abs()
    top = max(float(theirs.max()), float(ours.max()), 1e-12)
    worst = divmod(int(full.argmax()), full.shape[1])
    lim = max(float(full.max()), 1e-12)
    n_r, n_c = full.shape
    (r0, r1), (c0, c1) = comparison_window((n_r, n_c), worst, cells)
    windowed = (r1 - r0, c1 - c0) != (n_r, n_c)
    model_z, ours_z = theirs[r0:r1, c0:c1].numpy(), ours[r0:r1, c0:c1].numpy()
    diff = ours_z - model_z
    rows, cols = list(range(r0, r1)), list(range(c0, c1))
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=(f"model's {what}", f"attnviz's {what}", "difference"), horizontal_spacing=0.06
    )
    shared = dict(zmin=0, zmax=top) if moved else {}  # moved: both panels on one scale, 0..the largest
    for col, (z, scale, kw) in enumerate(
        ((model_z, "Blues", shared), (ours_z, "Blues", shared), (diff, "RdBu", dict(zmin=-lim, zmax=lim))), 1
    ):
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=cols if windowed else None,
                y=rows if windowed else None,
                colorscale=scale,
                showscale=col == 3,
                hovertemplate="%{y}, %{x}: %{z:.3e}<extra></extra>",
                **kw,
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    q_new, k_new = new_starts(cap, part, False, mark_new)
    k_new = k_new if weights else None  # A·V's columns are d_head, not keys
    q_new = q_new if q_new is not None and r0 < q_new < r1 else None  # a boundary outside the window: none
    k_new = k_new if k_new is not None and c0 < k_new < c1 else None
    shapes = []
    if q_new is not None:  # each panel's rows are positions
        for ref in ("", "2", "3"):
            shapes.append(boundary(y=q_new - 0.5, xref=f"x{ref} domain", yref=f"y{ref}"))
            if k_new is not None:
                shapes.append(boundary(x=k_new - 0.5, xref=f"x{ref}", yref=f"y{ref} domain"))
    title = f"{part_label(cap, part)}L{layer}·H{head}" + (", moved" if moved else "") + f": max |difference| {lim:.2e}"
    if windowed:
        keys = f" × keys {c0}–{c1 - 1} of {n_c:,}" if weights else ""
        at = f"query {worst[0]}, key {worst[1]}" if weights else f"position {worst[0]}, dimension {worst[1]}"
        title += (
            f"<br><sup>rows {r0}–{r1 - 1} of {n_r:,}{keys}, exact, around the largest |difference| ({at}); "
            "the max is over the whole map</sup>"
        )
    fig.update_layout(title=marked_title(title, q_new), shapes=shapes, height=420, margin=dict(l=40, r=10, t=80, b=30))
    return fig


COMPARE_LONG = 512  # a grid with more rows or columns than this is compared pooled (the Heatmap view's threshold)
COMPARE_BLOCKS = 256  # blocks a side of each pooled map: three float32 panels, ~1 MB on the wire


def max_difference(
    a: Capture,
    b: Capture,
    layer: int,
    head: int,
    *,
    part_a: str | None = None,
    part_b: str | None = None,
    measure: str = "weights",
) -> float:
    """max |A − B| over two token maps of one size (weights, or ``measure="moved"``: what the head moves),
    cell by cell, a chunk of query rows at a time (the two n² maps never exist whole)."""
    (n_q, n_k), rows = (len(labels(a, False, part_a, "query")), len(labels(a, False, part_a, "key"))), 256
    top = 0.0
    for r0 in range(0, n_q, rows):
        span = (r0, min(r0 + rows, n_q))
        wa = window(a, layer, head, span, (0, n_k), part=part_a, measure=measure)
        wb = window(b, layer, head, span, (0, n_k), part=part_b, measure=measure)
        top = max(top, float((wa - wb).abs().max()))
    return top


def _category_axis(cats: list[str], **extra) -> dict:
    step = max(1, math.ceil(len(cats) / 32))
    shown = cats[::step]
    return dict(type="category", tickmode="array", tickvals=shown, ticktext=shown, showgrid=False, **extra)


def _compare_pooled(
    a: Capture,
    b: Capture,
    layer: int,
    head: int,
    part_a: str | None,
    part_b: str | None,
    names: tuple[str, str],
    words: bool,
    blocks: int,
    measure: str = "weights",
) -> go.Figure:
    """:func:`compare_heads` of a long text: each map pooled into blocks of whole tokens (their mean)."""
    pooled, axes, grids = [], [], []
    symbol = measure_symbol(measure)
    for cap, part in ((a, part_a), (b, part_b)):
        ov = overview(cap, layer, head, part=part, size=blocks, mode="mean", measure=measure)
        q_names, k_names = labels(cap, False, part, "query"), labels(cap, False, part, "key")
        pooled.append(ov)
        axes.append((categories(q_names, ov.row_edges), categories(k_names, ov.col_edges)))
        grids.append((q_names, k_names))
    (qa, ka), (qb, kb) = grids
    same_grid = len(qa) == len(qb) and len(ka) == len(kb)
    titles = [f"{names[0]} — {a.model.get('name', '')}", f"{names[1]} — {b.model.get('name', '')}"]
    if same_grid:
        titles.append(f"{names[0]} − {names[1]} (block means)")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.08)
    top = max(float(pooled[0].values.max()), float(pooled[1].values.max()), 1e-6)
    hover = "queries %{y}<br>keys %{x}<br>"
    for col, (ov, (rows, cols)) in enumerate(zip(pooled, axes), 1):
        z = ov.values.clone()
        z[z == 0] = float("nan")  # a block whose every cell is masked: left empty, as in the overview
        fig.add_trace(
            go.Heatmap(
                z=z.numpy(),  # float32: base64 on the wire, 4 bytes a cell
                x=cols,
                y=rows,
                colorscale="Blues",
                zmin=0,
                zmax=top,
                showscale=col == 1,
                colorbar=dict(title=f"mean {symbol}", x=1.0 if same_grid else 1.02, len=0.9),
                hovertemplate=hover + f"mean {symbol} %{{z:.4g}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(row=1, col=col, **_category_axis(cols))
        fig.update_yaxes(row=1, col=col, **_category_axis(rows, autorange="reversed"))
    wr, wc = pooled[0].block
    pooling = f"pooled: the mean of each block of {wr}×{wc} tokens (of {len(qa):,} × {len(ka):,})"
    if measure == "moved":
        pooling += ", of moved (‖α·f(x)‖)"
    if words:
        pooling += f"; more than {COMPARE_LONG} words, so in tokens"
    if same_grid:
        diff = pooled[0].values - pooled[1].values  # the mean of the differences in each block
        lim = max(float(diff.abs().max()), 1e-6)
        fig.add_trace(
            go.Heatmap(
                z=diff.numpy(),
                x=axes[0][1],
                y=axes[0][0],
                colorscale="RdBu",
                zmin=-lim,
                zmax=lim,
                colorbar=dict(title="A − B", x=1.09, len=0.9),
                hovertemplate=hover + "mean A − B %{z:+.4f}<extra></extra>",
            ),
            row=1,
            col=3,
        )
        fig.update_xaxes(row=1, col=3, **_category_axis(axes[0][1]))
        fig.update_yaxes(row=1, col=3, **_category_axis(axes[0][0], autorange="reversed"))
        exact = max_difference(a, b, layer, head, part_a=part_a, part_b=part_b, measure=measure)
        differ = sum(p != q for p, q in zip(qa, qb))
        count = "1 token differs" if differ == 1 else f"{differ:,} tokens differ"
        note = f"max |A − B| {exact:.3f} cell by cell" + (f"; position by position, {count}" if differ else "")
    else:
        note = f"no difference map: the tokens differ ({len(qa):,} vs {len(qb):,})"
    fig.update_layout(
        title=f"L{layer}·H{head}, tokens, {measure_name(measure)}: {note}<br><sup>{pooling}</sup>",
        plot_bgcolor=MASKED_COLOUR,
        height=820,
        margin=dict(l=140, r=20, t=110, b=140),
    )
    return fig


@themed
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
    blocks: int = COMPARE_BLOCKS,
    measure: str = "weights",
) -> go.Figure:
    """Two captures' same layer and head side by side — two texts on one model, or two models on
    one text — and, where their token (or word) grids have the same size, the difference A − B,
    position by position (a label that differs reads "big/small").

    A grid of more than ``COMPARE_LONG`` rows or columns (a long text) is compared pooled, in tokens:
    each map is the mean of each block of whole tokens (at most ``blocks`` a side,
    :func:`attnviz.analysis.overview.overview`), so A − B is the mean of the differences in each
    block, and the title's max |A − B| is still cell by cell, over the whole maps.

    ``measure="moved"`` compares what the head moves, α_ij·‖f_h(x_j)‖ (:meth:`Capture.moved`;
    pooled: the mean of each block), on one colour scale 0..the larger map's largest.

    A layer or head that one capture lacks is an :class:`OutOfRangeError` naming both sizes."""
    check_measure(measure)
    maps = []
    for cap, part, name in ((a, part_a, names[0]), (b, part_b, names[1])):
        info = cap.info(part)
        if layer not in cap.layer_indices(part) or not 0 <= head < info["n_heads"]:
            raise OutOfRangeError(
                f"{name} has layers {cap.layer_indices(part)} and heads 0..{info['n_heads'] - 1}; "
                f"L{layer}·H{head} is not one of them: choose a layer and head both captures have"
            )
        if head not in cap.layer(layer, part).head_numbers:
            kept = ", ".join(map(str, cap.layer(layer, part).head_numbers))
            raise HeadNotKeptError(
                f"{name} kept heads {kept} of layer {layer} (capture(heads=)); H{head} is not one of them: "
                "choose a head both captures kept"
            )
    grids = [
        (len(labels(c, words, p, "query")), len(labels(c, words, p, "key"))) for c, p in ((a, part_a), (b, part_b))
    ]
    if max(max(g) for g in grids) > COMPARE_LONG:
        return _compare_pooled(a, b, layer, head, part_a, part_b, names, words, blocks, measure)
    for cap, part in ((a, part_a), (b, part_b)):
        w = measure_map(cap, layer, head, measure, part=part, words=words)
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
                z=w.numpy() if measure == "moved" else w.numpy().round(5),  # moved: no fixed scale
                colorscale="Blues",
                zmin=0,
                zmax=top,
                showscale=col == 1,
                colorbar=dict(title=measure_symbol(measure), x=1.0 if same_grid else 1.02, len=0.9),
                hovertemplate="query %{y} → key %{x}: %{z:.4g}<extra></extra>",
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
                z=diff if measure == "moved" else diff.round(5),
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
        title=f"L{layer}·H{head}, {unit}, {measure_name(measure)}: {note}",
        plot_bgcolor=MASKED_COLOUR,
        height=max(420, min(900, 14 * max(len(qa), len(qb)) + 180)),
        margin=dict(l=60, r=20, t=90, b=100),
    )
    return fig
