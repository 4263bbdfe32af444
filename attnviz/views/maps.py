"""One head's map and one query's row: the heatmap, the AttentionLab's bars and the row's statistics."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import torch

from ..analysis.moved import row_shares
from ..analysis.overview import check_measure
from ..errors import ArgumentTypeError, OutOfRangeError
from .common import (
    MASKED_COLOUR,
    above_top_axis,
    allowed_cells,
    labels,
    measure_map,
    measure_name,
    measure_symbol,
    part_label,
    settings_text,
    short_label,
    themed,
    ticks,
)
from .marks import boundary, marked_title, new_starts

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["heatmap", "query_row", "row_stats"]


@themed
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
    mark_new: bool = True,
    measure: str = "weights",
) -> go.Figure:
    """One head's query × key weights; masked cells (the causal triangle) are left empty.

    ``measure="moved"`` draws what the head moves from each key into each query instead,
    α_ij·‖f_h(x_j)‖ (:meth:`Capture.moved`, with the same settings): its rows do not sum to 1,
    so the colour scale runs from 0 to the map's largest value, and the title and colour bar say
    "moved (‖α·f(x)‖)". Cross-attention is drawn target (queries, rows) × source (keys, columns).
    ``mark_new``: a generation's new tokens marked (:mod:`attnviz.views.marks`)."""
    w = measure_map(
        cap, layer, head, measure, part=part, causal=causal, scale=scale, temperature=temperature, words=words
    )
    allowed = allowed_cells(cap, layer, causal, words, part)
    moved = measure == "moved"
    z = torch.where(allowed, w, torch.full_like(w, float("nan"))).numpy()
    z = z if moved else z.round(5)  # moved has no fixed scale: its float32 values as they are
    q_names, k_names = labels(cap, words, part, "query"), labels(cap, words, part, "key")
    n_q, n_k = len(q_names), len(k_names)
    q_new, k_new = new_starts(cap, part, words, mark_new)
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
            + ("moved ‖α·f(x)‖ %{z:.4g}" if moved else "weight %{z:.4f}")
            + "<extra></extra>",
            colorbar=dict(title=measure_symbol(measure)),
        )
    )
    unit = "word" if words else "token"
    cross = cap.resolve_part(part) == "cross"
    key_side, query_side = ("source ", "target ") if cross else ("", "")
    top = above_top_axis(
        marked_title(
            f"{part_label(cap, part)}L{layer}·H{head} — {query_side}{unit} × {key_side}{unit} attention"
            f"{': ' if moved else ' '}{measure_name(measure)} ({settings_text(cap, layer, causal, scale, temperature, part)})",
            q_new,
            k_new,
        ),
        ticks(k_names)["ticktext"],  # the labels' lengths, unmarked
    )
    shapes = []
    if k_new is not None:
        shapes.append(boundary(x=k_new - 0.5, yref="paper"))
    if q_new is not None:
        shapes.append(boundary(y=q_new - 0.5, xref="paper"))
    fig.update_layout(
        title=top["title"],
        xaxis=dict(title=f"key ({key_side}{unit} attended to)", side="top", **ticks(k_names, new_from=k_new)),
        yaxis=dict(
            title=f"query ({query_side}{unit} attending)", autorange="reversed", **ticks(q_names, new_from=q_new)
        ),
        plot_bgcolor=MASKED_COLOUR,
        margin=dict(l=90, r=20, t=top["margin_top"], b=20),
        height=max(420, min(900, 22 * n_q + 160)),
        shapes=shapes,
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


@themed
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
    mark_new: bool = True,
    measure: str = "weights",
    highlight: int | None = None,
) -> go.Figure:
    """The AttentionLab bar chart: one query's row of weights, with entropy and top weight.

    ``measure="moved"``: each key's share of what the head moves into the query,
    ``α_ij·‖f(x_j)‖ / Σ_j' α_ij'·‖f(x_j')‖`` (:func:`attnviz.analysis.row_shares`), drawn beside its
    weight (the first trace the shares, the second the weights); with ``"weights"`` the weights alone,
    each key's moved share in its hover where the layer holds value norms. ``mark_new``: a
    generation's new keys marked (:mod:`attnviz.views.marks`). ``highlight``: one key (a position on
    the same axis as the bars: a word with ``words``) boxed and named above the bars."""
    check_measure(measure)
    q_names, names = labels(cap, words, part, "query"), labels(cap, words, part, "key")
    if not isinstance(query, int) or isinstance(query, bool):
        unit = "word" if words else "token"
        raise ArgumentTypeError(
            f"query is the {unit}'s position (an int), got {query!r}"
            + (f": cap.{unit}_labels.index({query!r}) finds it" if isinstance(query, str) else "")
        )
    if not 0 <= query < len(q_names):
        raise OutOfRangeError(f"query {query} is out of range: 0..{len(q_names) - 1}")
    if highlight is not None and not 0 <= highlight < len(names):
        raise OutOfRangeError(f"highlighted key {highlight} is out of range: 0..{len(names) - 1}")
    share = None
    if measure == "moved" or cap.layer(layer, part).value_dots is not None:  # "moved" without norms: InputError
        row, _, share = row_shares(
            cap, layer, head, query, part=part, causal=causal, scale=scale, temperature=temperature, words=words
        )
    else:
        row = cap.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature, words=words)
        row = row[query].cpu()
    stats = row_stats(row)
    _, k_new = new_starts(cap, part, words, mark_new)
    x = list(range(len(names)))
    colours = ["#d62728" if i == stats["top_index"] else "#1f77b4" for i in x]
    head_name = f"{part_label(cap, part)}L{layer}·H{head}"
    settings = settings_text(cap, layer, causal, scale, temperature, part)
    if measure == "moved" and share is not None:
        top_moved = int(share.argmax())
        weights = row.numpy().round(5)
        bars = [
            go.Bar(
                x=x,
                y=share.numpy().round(5),
                name="moved share",
                marker_color=["#d62728" if i == top_moved else "#ff7f0e" for i in x],
                customdata=[[n, w] for n, w in zip(names, weights, strict=True)],
                hovertemplate="%{customdata[0]}: moved share %{y:.1%} · weight %{customdata[1]:.4f}<extra></extra>",
            ),
            go.Bar(
                x=x,
                y=weights,
                name="weight α",
                marker_color="#1f77b4",
                opacity=0.45,
                customdata=names,
                hovertemplate="%{customdata}: weight %{y:.4f}<extra></extra>",
            ),
        ]
        title = (
            f"{short_label(q_names[query])!r} → {head_name} ({settings}): moved (‖α·f(x)‖) — "
            f"{100 * float(share[top_moved]):.0f} % from {short_label(names[top_moved])!r}, "
            f"top weight {stats['top_weight']:.2f} on {short_label(names[stats['top_index']])!r}"
        )
        y_title = "moved share · weight"
    else:
        bars = [
            go.Bar(
                x=x,
                y=row.numpy().round(5),
                name="weight α",
                marker_color=colours,
                customdata=names if share is None else [[n, s] for n, s in zip(names, share.tolist(), strict=True)],
                hovertemplate="%{customdata}: %{y:.4f}<extra></extra>"
                if share is None
                else "%{customdata[0]}: weight %{y:.4f} · moved share %{customdata[1]:.1%}<extra></extra>",
            )
        ]
        title = (
            f"{short_label(q_names[query])!r} → {head_name} ({settings}): "
            f"top {stats['top_weight']:.2f} on {short_label(names[stats['top_index']])!r}, "
            f"entropy {stats['entropy']:.2f} nats"
        )
        y_title = "weight"
    fig = go.Figure(bars)
    fig.update_layout(
        title=marked_title(title, k_new),
        xaxis=dict(**ticks(names, new_from=k_new), tickangle=-45),
        yaxis=dict(title=y_title, range=[0, 1.02]),
        barmode="group",
        showlegend=len(bars) > 1,
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
        height=380,
        margin=dict(l=50, r=10, t=60, b=80),
        shapes=[] if k_new is None else [boundary(x=k_new - 0.5, yref="paper")],
    )
    if highlight is not None:
        fig.add_vrect(
            x0=highlight - 0.5,
            x1=highlight + 0.5,
            line={"color": "#2ca02c", "width": 2},
            fillcolor="rgba(44, 160, 44, 0.12)",
            annotation_text=f"key {short_label(names[highlight])!r}: {float(row[highlight]):.4f}",
            annotation_position="top",
        )
    return fig
