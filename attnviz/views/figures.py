"""Plotly figures of a Capture: pure functions, the same in notebooks and in the dashboard.

Every figure takes a :class:`~attnviz.Capture` (or a validation report) and plain selections, and
returns a ``plotly.graph_objects.Figure``. Layers and heads are 0-based and labelled ``L3·H8``.
Axes are numeric positions with token (or word) tick labels, so repeated tokens stay distinct.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from ..data.words import group_matrix
from ..errors import InputError, OutOfRangeError

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture
    from ..data.validate import ValidationReport
    from ..workflows.intervene import Intervention

__all__ = [
    "comparison",
    "to_html",
    "head_view",
    "heatmap",
    "importance_map",
    "labels",
    "model_view",
    "model_view_cell",
    "prediction_bars",
    "query_row",
    "row_stats",
    "validation_map",
]

HEAD_COLOURS = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#e377c2",
    "#8c564b",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#3182bd",
]
MASKED_COLOUR = "#e9e9ee"


def labels(cap: Capture, words: bool = False, part: str | None = None, axis: str = "query") -> list[str]:
    """Tick labels of a part's queries or keys: word texts, or token texts (special tokens as themselves).

    Cross-attention's queries are the target's tokens and its keys the source's."""
    queries, keys = cap.sequences(part)
    seq = queries if axis == "query" else keys
    return seq.word_labels if words else seq.token_labels


def _part_label(cap: Capture, part: str | None) -> str:
    """ "decoder " before L3·H8 when a capture has several parts, else nothing."""
    return f"{cap.resolve_part(part)} " if len(cap.parts) > 1 else ""


def _ticks(names: list[str], max_ticks: int = 64) -> dict:
    step = max(1, math.ceil(len(names) / max_ticks))
    idx = list(range(0, len(names), step))
    return dict(tickmode="array", tickvals=idx, ticktext=[names[i] for i in idx])


def _allowed(cap: Capture, layer: int, causal: bool | None, words: bool, part: str | None = None) -> torch.Tensor:
    allowed = cap.allowed(layer, causal=causal, part=part)
    if not words:
        return allowed
    queries, keys = cap.sequences(part)
    from_q = group_matrix(queries.words, queries.n_tokens)
    to_k = group_matrix(keys.words, keys.n_tokens)
    return (from_q @ allowed.float() @ to_k.T) > 0


def heatmap(
    cap: Capture,
    layer: int,
    head: int,
    *,
    words: bool = False,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
    part: str | None = None,
) -> go.Figure:
    """One head's query × key weights; masked cells (the causal triangle) are left empty.

    Cross-attention is drawn target (queries, rows) × source (keys, columns)."""
    w = cap.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature, words=words).cpu()
    allowed = _allowed(cap, layer, causal, words, part)
    z = torch.where(allowed, w, torch.full_like(w, float("nan"))).numpy().round(5)
    q_names, k_names = labels(cap, words, part, "query"), labels(cap, words, part, "key")
    n_q, n_k = len(q_names), len(k_names)
    hover = (
        [[f"{q_names[i]} → {k_names[j]}" for j in range(n_k)] for i in range(n_q)] if n_q * n_k <= 256 * 256 else None
    )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_k)),
            y=list(range(n_q)),
            colorscale="Blues",
            zmin=0,
            zmax=max(float(w.max()), 1e-6),
            customdata=hover,
            hovertemplate=("%{customdata}<br>" if hover else "query %{y} → key %{x}<br>")
            + "weight %{z:.4f}<extra></extra>",
            colorbar=dict(title="weight"),
        )
    )
    unit = "word" if words else "token"
    cross = cap.resolve_part(part) == "cross"
    key_side, query_side = ("source ", "target ") if cross else ("", "")
    x_ticks = _ticks(k_names)
    top = above_top_axis(
        f"{_part_label(cap, part)}L{layer}·H{head} — {query_side}{unit} × {key_side}{unit} attention "
        f"({_toggles(cap, layer, causal, scale, temperature, part)})",
        x_ticks["ticktext"],
    )
    fig.update_layout(
        title=top["title"],
        xaxis=dict(title=f"key ({key_side}{unit} attended to)", side="top", **x_ticks),
        yaxis=dict(title=f"query ({query_side}{unit} attending)", autorange="reversed", **_ticks(q_names)),
        plot_bgcolor=MASKED_COLOUR,
        margin=dict(l=90, r=20, t=top["margin_top"], b=20),
        height=max(420, min(900, 22 * n_q + 160)),
    )
    return fig


def above_top_axis(text: str, tick_labels: list[str], *, angle: float | None = None, width: int = 700) -> dict:
    """Layout for a figure whose key axis is on top: its title pinned to the top of the figure and a top
    margin that holds the title, the axis title and the tick labels one above the other (plotly places
    each in the margin on its own, so a tall tick label would run into the title).

    ``angle``: the labels' fixed angle in degrees; None is plotly's own choice, level when they fit
    side by side in ``width`` pixels, upright when they do not."""
    lines = text.count("<br>")
    title_px = 28 + 16 * lines
    longest = max((len(label) for label in tick_labels), default=0) * 7  # ~7 px a character at 12 px
    if angle is None:
        angle = 0 if sum(len(label) * 7 + 8 for label in tick_labels) <= width else 90
    ticks_px = 16 + longest * abs(math.sin(math.radians(angle)))
    return dict(
        title=dict(
            text=text, y=1, yref="container", yanchor="top", pad=dict(t=10 + 18 * lines)
        ),  # plotly anchors a title at its first line
        margin_top=int(title_px + 24 + ticks_px + 12),
    )


def _toggles(
    cap: Capture, layer: int, causal: bool | None, scale: bool | float, temperature: float, part: str | None = None
) -> str:
    rec = cap.layer(layer, part)
    mask = {None: "model's mask" + (f", window {rec.window}" if rec.window else ""), True: "causal", False: "no mask"}[
        causal
    ]
    if scale is True:
        sc = f"×{rec.scaling:.4g}"
    elif scale is False:
        sc = "unscaled"
    else:
        sc = f"×{float(scale):.4g}"
    extra = ", + position bias" if rec.bias is not None or rec.relative_bias is not None else ""
    extra += ", + sinks" if rec.sinks is not None else ""
    return f"{mask}, {sc}{extra}" + (f", T={temperature:g}" if temperature != 1.0 else "")


MAX_LABELS = 120  # token labels a head view writes per side; every token is named on hover


def strongest(w: Tensor, *, threshold: float = 0.0, top_k: int | None = None, mass: float | None = None) -> Tensor:
    """Which cells of ``w`` ([row, key]) to draw: at least ``threshold``, among each row's ``top_k``
    largest, and within the smallest set of keys that holds ``mass`` of the row (exBERT's slider).
    A zero weight (a masked key) is never drawn."""
    keep = (w >= threshold) & (w > 0)
    if top_k is not None:
        k = min(top_k, w.shape[-1])
        ranked = torch.zeros_like(keep)
        ranked.scatter_(-1, w.topk(k, dim=-1).indices, True)
        keep &= ranked
    if mass is not None:
        values, order = w.sort(dim=-1, descending=True)
        before = values.cumsum(-1) - values  # mass of the stronger keys
        inside = torch.zeros_like(keep)
        inside.scatter_(-1, order, before < mass)
        keep &= inside
    return keep


def head_view(
    cap: Capture,
    layer: int,
    heads: list[int] | None = None,
    *,
    words: bool = False,
    query: int | None = None,
    threshold: float = 0.02,
    top_k: int | None = None,
    mass: float | None = None,
    queries: tuple[int, int] | None = None,
    part: str | None = None,
) -> go.Figure:
    """Token-to-token arcs: queries on the left, keys on the right, opacity by weight, a colour a head.

    ``query`` isolates the lines leaving one query position; ``queries=(start, stop)`` draws only
    those query rows. Lines are drawn for weights ≥ ``threshold``, and — for long texts — only each
    query's ``top_k`` strongest keys and/or the keys that together hold ``mass`` of its row. At most
    :data:`MAX_LABELS` tokens per side are labelled; hover names every token.
    """
    heads = list(range(cap.info(part)["n_heads"])) if heads is None else list(heads)
    q_names, k_names = labels(cap, words, part, "query"), labels(cap, words, part, "key")
    n = len(q_names)
    if query is not None and not 0 <= query < n:
        raise OutOfRangeError(f"query {query} is out of range: 0..{n - 1}")
    if queries is not None and not (
        isinstance(queries, (tuple, list)) and len(queries) == 2 and 0 <= queries[0] < queries[1] <= n
    ):
        raise OutOfRangeError(f"queries must be a (start, stop) range within 0..{n}, got {queries!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top_k must be a whole number ≥ 1, got {top_k!r}")
    if mass is not None and not 0 < mass <= 1:
        raise InputError(f"mass must be in (0, 1], got {mass!r}")
    rows = torch.tensor([query]) if query is not None else torch.arange(*(queries or (0, n)))
    fig = go.Figure()
    levels = [(0.0, 0.1, 0.15), (0.1, 0.3, 0.35), (0.3, 0.6, 0.6), (0.6, 1.01, 0.95)]
    lines = 0
    for head in heads:
        colour = HEAD_COLOURS[head % len(HEAD_COLOURS)]
        w = cap.attention(layer, head, part=part, words=words).cpu()[rows]
        keep = strongest(w, threshold=threshold, top_k=top_k, mass=mass)
        first = True
        for lo, hi, alpha in levels:
            i, j = torch.nonzero(keep & (w >= lo) & (w < hi), as_tuple=True)
            if len(i):
                lines += len(i)
                ys = torch.stack([rows[i].float(), j.float(), torch.full_like(j, -1, dtype=torch.float)], 1).flatten()
                xs = torch.tensor([0.0, 1.0, -1.0]).repeat(len(i))
                fig.add_trace(
                    go.Scatter(
                        x=[None if x < 0 else x for x in xs.tolist()],
                        y=[None if x < 0 else int(x) for x in ys.tolist()],
                        mode="lines",
                        line=dict(color=colour, width=2),
                        opacity=alpha,
                        name=f"H{head}",
                        legendgroup=f"H{head}",
                        showlegend=first,
                        hoverinfo="skip",
                    )
                )
                first = False
        if first:  # nothing drawn: keep the head in the legend anyway
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=colour), name=f"H{head}"))
    for side, x, names in (("query", 0, q_names), ("key", 1, k_names)):
        step = -(-len(names) // MAX_LABELS)
        fig.add_trace(
            go.Scatter(
                x=[x] * len(names),
                y=list(range(len(names))),
                mode="markers+text",
                text=[name if i % step == 0 or (x == 0 and i == query) else "" for i, name in enumerate(names)],
                hovertext=names,
                textposition="middle left" if x == 0 else "middle right",
                marker=dict(
                    size=9 if len(names) <= MAX_LABELS else 5,
                    color=["#000" if (query == i and x == 0) else "#999" for i in range(len(names))],
                ),
                customdata=list(range(len(names))),
                hovertemplate=f"{side} %{{customdata}}: %{{hovertext}}<extra></extra>",
                showlegend=False,
                name=side,
            )
        )
    rule = [f"weights ≥ {threshold:g}"]
    if top_k is not None:
        rule.append(f"top {top_k} per query")
    if mass is not None:
        rule.append(f"{mass:.0%} of each row")
    if queries is not None and query is None:
        rule.append(f"queries {queries[0]}–{queries[1] - 1}")
    title = f"{_part_label(cap, part)}L{layer} head view — " + (
        "every query" if query is None else f"from {q_names[query]!r} (#{query})"
    )
    rows_shown = max(n, len(k_names))
    height = max(420, min(2400, 20 * rows_shown + 120))
    pad = max(0.5, 8 * rows_shown / (height - 70))  # 8 px: half a label's height
    fig.update_layout(
        title=title + ": " + ", ".join(rule) + f" ({lines:,} lines)",
        xaxis=dict(visible=False, range=[-0.6, 1.6]),
        # the rows and half a label more (autorange pads ~5 % of the height: ~100 px of nothing at 500 tokens)
        yaxis=dict(visible=False, range=[rows_shown - 1 + pad, -pad]),
        plot_bgcolor="white",
        height=height,
        margin=dict(l=10, r=10, t=60, b=10),
        legend=dict(
            orientation="h", yanchor="top", y=-8 / height
        ),  # right under the lines (its default: 10 % of the height lower)
    )
    return fig


def thumb_size(cap: Capture, words: bool, cells: int, part: str | None = None) -> tuple[int, int]:
    """(query rows, key columns) of a model-view thumbnail of at most ``cells`` per side."""
    return (min(len(labels(cap, words, part, "query")), cells), min(len(labels(cap, words, part, "key")), cells))


def model_view_cell(
    cap: Capture, x: float, y: float, *, words: bool = False, cells: int = 24, part: str | None = None
) -> tuple[int, int] | None:
    """The (layer, head) under the point (x, y) of :func:`model_view`'s mosaic, None on a gap."""
    t_q, t_k = thumb_size(cap, words, cells, part)
    row, col = int(round(y)) // (t_q + 1), int(round(x)) // (t_k + 1)
    layers = cap.layer_indices(part)
    if not (0 <= row < len(layers) and 0 <= col < cap.info(part)["n_heads"]):
        return None
    return layers[row], col


def model_view(
    cap: Capture,
    *,
    words: bool = False,
    cells: int = 24,
    selected: tuple[int, int] | None = None,
    part: str | None = None,
) -> go.Figure:
    """All layers × heads as thumbnails in one mosaic (each pattern max-pooled to ``cells``²).

    Hover names the head; :func:`model_view_cell` maps a clicked point back to (layer, head).
    """
    layers = cap.layer_indices(part)
    h = cap.info(part)["n_heads"]
    n_q, n_k = len(labels(cap, words, part, "query")), len(labels(cap, words, part, "key"))
    t_q, t_k = thumb_size(cap, words, cells, part)
    size_r, size_c = len(layers) * (t_q + 1) - 1, h * (t_k + 1) - 1
    z = torch.full((size_r, size_c), float("nan"))
    for r, layer in enumerate(layers):
        w = cap.attention(layer, part=part, words=words).cpu()  # [head, q, k]
        pooled = torch.nn.functional.adaptive_max_pool2d(w[None], (t_q, t_k))[0] if (n_q > t_q or n_k > t_k) else w
        for head in range(h):
            z[r * (t_q + 1) : r * (t_q + 1) + t_q, head * (t_k + 1) : head * (t_k + 1) + t_k] = pooled[head]
    # hover ids: [layer, head] of the thumbnail under each cell (gaps carry the neighbour's, never shown)
    row_layer = np.array(layers)[np.minimum(np.arange(size_r) // (t_q + 1), len(layers) - 1)]
    col_head = np.minimum(np.arange(size_c) // (t_k + 1), h - 1)
    ids = np.stack(np.broadcast_arrays(row_layer[:, None], col_head[None, :]), axis=-1)
    fig = go.Figure(
        go.Heatmap(
            z=z.numpy().round(3),
            colorscale="Blues",
            zmin=0,
            zmax=1,
            showscale=False,
            customdata=ids,
            hovertemplate="L%{customdata[0]}·H%{customdata[1]}<extra></extra>",
            xgap=0,
            ygap=0,
        )
    )
    fig.update_layout(
        title=f"Model view{': ' + cap.resolve_part(part) if len(cap.parts) > 1 else ''}: {len(layers)} layers × {h} heads "
        "(click a head to select it)",
        xaxis=dict(
            tickmode="array",
            tickvals=[k * (t_k + 1) + t_k / 2 for k in range(h)],
            ticktext=[f"H{k}" for k in range(h)],
            side="top",
            showgrid=False,
            zeroline=False,
        ),
        yaxis=dict(
            tickmode="array",
            tickvals=[r * (t_q + 1) + t_q / 2 for r in range(len(layers))],
            ticktext=[f"L{layer}" for layer in layers],
            autorange="reversed",
            showgrid=False,
            zeroline=False,
            scaleanchor="x",
        ),
        plot_bgcolor="white",
        height=max(400, 40 * len(layers) + 120),
        margin=dict(l=50, r=10, t=80, b=10),
    )
    if selected is not None and selected[0] in layers:
        r, head = layers.index(selected[0]), selected[1]
        fig.add_shape(
            type="rect",
            x0=head * (t_k + 1) - 0.5,
            x1=head * (t_k + 1) + t_k - 0.5,
            y0=r * (t_q + 1) - 0.5,
            y1=r * (t_q + 1) + t_q - 0.5,
            line=dict(color="#d62728", width=3),
        )
    return fig


def row_stats(row: torch.Tensor) -> dict:
    """Entropy (nats and as a share of the maximum), the top weight and where it goes."""
    p = row[row > 0]
    entropy = float(-(p * p.log()).sum()) if len(p) else 0.0
    support = int((row > 0).sum())
    top = int(row.argmax())
    return {
        "entropy": entropy,
        "entropy_share": entropy / math.log(support) if support > 1 else 0.0,
        "top_weight": float(row[top]),
        "top_index": top,
        "support": support,
    }


def query_row(
    cap: Capture,
    layer: int,
    head: int,
    query: int,
    *,
    words: bool = False,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
    part: str | None = None,
) -> go.Figure:
    """The AttentionLab bar chart: one query's row of weights, with entropy and top weight."""
    q_names, names = labels(cap, words, part, "query"), labels(cap, words, part, "key")
    if not 0 <= query < len(q_names):
        raise OutOfRangeError(f"query {query} is out of range: 0..{len(q_names) - 1}")
    row = cap.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature, words=words)[
        query
    ].cpu()
    stats = row_stats(row)
    colours = ["#d62728" if i == stats["top_index"] else "#1f77b4" for i in range(len(names))]
    fig = go.Figure(
        go.Bar(
            x=list(range(len(names))),
            y=row.numpy().round(5),
            marker_color=colours,
            customdata=names,
            hovertemplate="%{customdata}: %{y:.4f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=(
            f"{q_names[query]!r} → {_part_label(cap, part)}L{layer}·H{head} "
            f"({_toggles(cap, layer, causal, scale, temperature, part)}): "
            f"top {stats['top_weight']:.2f} on {names[stats['top_index']]!r}, "
            f"entropy {stats['entropy']:.2f} nats"
        ),
        xaxis=dict(**_ticks(names), tickangle=-45),
        yaxis=dict(title="weight", range=[0, 1.02]),
        height=380,
        margin=dict(l=50, r=10, t=60, b=80),
    )
    return fig


def validation_map(report: ValidationReport, quantity: str = "output", part: str | None = None) -> go.Figure:
    """Layer × head map of the max absolute error of one part, the worst head named in the title."""
    part = part if part is not None else (report.parts[0] if report.parts else None)
    grid = report.error_map(quantity, part)
    rows = [r for r in report.rows if r["part"] == part and r["quantity"] == quantity]
    worst = max(rows, key=lambda r: r["max_abs_error"] / r["tolerance"], default=None)
    layers, heads = grid.shape
    fig = go.Figure(
        go.Heatmap(
            z=grid.numpy(),
            x=list(range(heads)),
            y=list(range(layers)),
            colorscale="Reds",
            zmin=0,
            zmax=max(float(torch.nan_to_num(grid).max()), report.atol),
            hovertemplate="L%{y}·H%{x}: max |error| %{z:.2e}<extra></extra>",
            colorbar=dict(title="max |err|"),
        )
    )
    what = {
        "output": "recomputed A·V vs the model's attention output",
        "weights": "recomputed A vs the model's weights",
    }
    title = f"{what[quantity]}" + (f" ({part})" if len(report.parts) > 1 else "")
    if worst is not None:
        title += f" — worst L{worst['layer']}·H{worst['head']}: {worst['max_abs_error']:.2e}"
    fig.update_layout(
        title=title,
        xaxis=dict(title="head", dtick=1),
        yaxis=dict(title="layer", autorange="reversed", dtick=1),
        height=max(320, 22 * layers + 140),
        margin=dict(l=60, r=10, t=60, b=40),
    )
    return fig


def comparison(cap: Capture, layer: int, head: int, *, part: str | None = None) -> go.Figure:
    """The model's own numbers, attnviz's recomputation, and their difference, for one head.

    With the model's weights (eager backends, captured with ``keep_weights=True``) this compares
    attention matrices; otherwise the attention outputs A·V (``[pos, d_head]``), which every
    backend returns.
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
    fig.update_layout(
        title=f"{_part_label(cap, part)}L{layer}·H{head}: max |difference| {lim:.2e}",
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
        allowed = _allowed(cap, layer, None, words, part)
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
        fig.update_xaxes(row=1, col=col, **_ticks(k_names, 32))  # key labels below: the panel titles are above
        fig.update_yaxes(autorange="reversed", row=1, col=col, **_ticks(q_names, 32))
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
        fig.update_xaxes(row=1, col=3, **_ticks(merged(ka, kb), 32))
        fig.update_yaxes(autorange="reversed", row=1, col=3, **_ticks(merged(qa, qb), 32))
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


def prediction_bars(out: Intervention, k: int = 5, continuation: str | int | list[int] | None = None) -> go.Figure:
    """The next-token probabilities before and after the edits, as bars: the top ``k`` of each,
    side by side; with ``continuation``, its log-probability change in the title. For a model
    without a language-model head, each token's cosine between its final hidden states edited and not."""
    edits = "; ".join(str(e) for e in out.edits)
    if out.before is None or out.after is None:
        names = out.capture_before.token_labels
        fig = go.Figure(
            go.Bar(
                x=out.similarity.tolist(),
                y=[f"{i}: {t}" for i, t in enumerate(names)],
                orientation="h",
                marker_color="#1f77b4",
                hovertemplate="%{y}: cosine %{x:.4f}<extra></extra>",
            )
        )
        fig.update_layout(
            title=f"{edits}<br><sub>no language-model head: each token's final hidden state, cosine edited vs not</sub>",
            xaxis=dict(title="cosine to the unedited", range=[min(0.0, float(out.similarity.min())), 1.0]),
            yaxis=dict(autorange="reversed"),
            height=max(260, 18 * len(names) + 120),
            margin=dict(l=10, r=10, t=70, b=40),
        )
        return fig
    before, after = out.before, out.after
    ids: list[int] = []
    for choice in [*before.top_tokens(k), *after.top_tokens(k)]:
        if choice.id not in ids:
            ids.append(choice.id)
    names = [before._text(i).replace("\n", "↵").replace(" ", "·") or f"#{i}" for i in ids]
    fig = go.Figure()
    for name, pred, colour in (("before", before, "#9e9e9e"), ("after", after, "#d62728")):
        probs = [float(pred.logprobs[i].exp()) for i in ids]
        fig.add_trace(
            go.Bar(
                x=probs,
                y=names,
                name=name,
                orientation="h",
                marker_color=colour,
                hovertemplate=f"%{{y}}: P = %{{x:.3f}} ({name})<extra></extra>",
            )
        )
    title = edits
    if continuation is not None:
        b, a = out.logprob(continuation)
        title += f"<br><sub>log P({continuation!r}): {b:.2f} → {a:.2f} (Δ {a - b:+.2f})</sub>"
    fig.update_layout(
        title=title,
        barmode="group",
        xaxis=dict(title="probability of the next token", rangemode="tozero"),
        yaxis=dict(autorange="reversed"),
        height=max(260, 40 * len(ids) + 120),
        margin=dict(l=10, r=10, t=70, b=40),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def importance_map(table: pd.DataFrame, part: str | None = None) -> go.Figure:
    """Layer × head map of :func:`attnviz.head_importance`: how much log P(target) drops when each
    head is ablated (red: the prediction needs the head; blue: it does better without it)."""
    if "logprob_drop" not in table.columns:
        raise InputError("importance_map takes the table attnviz.head_importance returns")
    if "part" in table.columns:
        parts = list(dict.fromkeys(table["part"]))
        part = part if part is not None else parts[0]
        if part not in parts:
            raise InputError(f"no part {part!r} in this table; its parts are {', '.join(parts)}")
        table = table[table["part"] == part]
    layers, heads = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    grid = torch.full((layers, heads), float("nan"))
    for layer, head, drop in zip(table["layer"], table["head"], table["logprob_drop"]):
        grid[int(layer), int(head)] = float(drop)
    top = table.loc[table["logprob_drop"].idxmax()]
    bound = max(float(torch.nan_to_num(grid).abs().max()), 1e-6)
    target = table.attrs.get("target", "the target")
    fig = go.Figure(
        go.Heatmap(
            z=grid.numpy(),
            x=list(range(heads)),
            y=list(range(layers)),
            colorscale="RdBu_r",
            zmid=0,
            zmin=-bound,
            zmax=bound,
            hovertemplate="L%{y}·H%{x}: log P drops by %{z:.3f}<extra></extra>",
            colorbar=dict(title="drop"),
        )
    )
    how = table.attrs.get("how", "zero")
    fig.update_layout(
        title=(
            f"how much log P({target!r}) drops when each head is {how}-ablated"
            + (f" ({part})" if part else "")
            + f" — most needed L{int(top['layer'])}·H{int(top['head'])}: {float(top['logprob_drop']):.2f}"
        ),
        xaxis=dict(title="head", dtick=1),
        yaxis=dict(title="layer", autorange="reversed", dtick=1),
        height=max(320, 22 * layers + 140),
        margin=dict(l=60, r=10, t=60, b=40),
    )
    return fig


def to_html(figures: go.Figure | list[go.Figure], path: str | Path | None = None, *, title: str = "attnviz") -> str:
    """One self-contained HTML page holding the figures: plotly.js inlined once, no CDN, no server —
    it opens offline, in any browser, years from now. Written to ``path`` when given; returned."""
    import plotly.offline

    figs = [figures] if isinstance(figures, go.Figure) else list(figures)
    if not figs or not all(isinstance(f, go.Figure) for f in figs):
        raise InputError("to_html takes a plotly Figure or a list of them")
    divs = "\n".join(f.to_html(full_html=False, include_plotlyjs=False) for f in figs)
    page = (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>'
        f'<body style="font-family:system-ui,sans-serif"><h3>{escape(title)}</h3>\n{divs}\n</body></html>\n'
    )
    if path is not None:
        path = Path(path)
        if not path.parent.is_dir():
            raise InputError(f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist")
        path.write_text(page, encoding="utf-8")
    return page
