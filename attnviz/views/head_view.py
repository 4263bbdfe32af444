"""The head view: token-to-token arcs of one layer's heads, and the rule that picks which arcs to draw."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
import torch
from torch import Tensor

from ..errors import InputError, OutOfRangeError
from .common import HEAD_COLOURS, labels, measure_map, measure_name, part_label, themed
from .marks import MARK, boundary, mark_labels, marked_title, new_starts

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["MAX_LABELS", "head_view", "strongest"]

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


@themed
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
    mark_new: bool = True,
    measure: str = "weights",
) -> go.Figure:
    """Token-to-token arcs: queries on the left, keys on the right, opacity by weight, a colour a head.

    ``query`` isolates the lines leaving one query position; ``queries=(start, stop)`` draws only
    those query rows. Lines are drawn for weights ≥ ``threshold``, and — for long texts — only each
    query's ``top_k`` strongest keys and/or the keys that together hold ``mass`` of its row. At most
    :data:`MAX_LABELS` tokens per side are labelled; hover names every token. ``mark_new``: a
    generation's new tokens marked (:mod:`attnviz.views.marks`), a dotted line under the prompt.

    ``measure="moved"``: lines by what each head moves from a key into a query, α_ij·‖f_h(x_j)‖
    (:meth:`Capture.moved`), not by weight. Those do not sum to 1, so each line's value is what it
    moves divided by the largest value moved among the heads and queries drawn (the title gives that
    largest value): ``threshold`` and the opacity levels apply to that share of the largest, ``top_k``
    ranks the lines by what they move, and ``mass`` is the share of what each row receives in all.
    """
    moved = measure_name(measure) != "weights"  # checks the measure
    # the model's numbers of the heads drawn (default: every head the layer kept, capture(heads=))
    heads = cap.layer(layer, part).head_numbers if heads is None else list(heads)
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
    new = dict(zip(("query", "key"), new_starts(cap, part, words, mark_new)))
    rows = torch.tensor([query]) if query is not None else torch.arange(*(queries or (0, n)))
    fig = go.Figure()
    levels = [(0.0, 0.1, 0.15), (0.1, 0.3, 0.35), (0.3, 0.6, 0.6), (0.6, 1.01, 0.95)]
    lines = 0
    maps = {head: measure_map(cap, layer, head, measure, part=part, words=words)[rows] for head in heads}
    largest = max((float(m.max()) for m in maps.values() if m.numel()), default=0.0)
    for head in heads:
        colour = HEAD_COLOURS[head % len(HEAD_COLOURS)]
        w = maps[head]
        if moved:  # a share of the largest value drawn; mass: of each row's total
            shares = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
            w = w / max(largest, 1e-30)
            keep = strongest(w, threshold=threshold, top_k=top_k) & strongest(shares, mass=mass)
        else:
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
        start = new[side]
        shown = [name if i % step == 0 or (x == 0 and i == query) else "" for i, name in enumerate(names)]
        fig.add_trace(
            go.Scatter(
                x=[x] * len(names),
                y=list(range(len(names))),
                mode="markers+text",
                text=mark_labels(shown, start),
                hovertext=names if start is None else [MARK + t if i >= start else t for i, t in enumerate(names)],
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
    rule = [f"‖α·f(x)‖ ≥ {threshold:g} × the largest ({largest:.3g})" if moved else f"weights ≥ {threshold:g}"]
    if top_k is not None:
        rule.append(f"top {top_k} per query")
    if mass is not None:
        rule.append(f"{mass:.0%} of each row" + (" (of what it receives)" if moved else ""))
    if queries is not None and query is None:
        rule.append(f"queries {queries[0]}–{queries[1] - 1}")
    title = f"{part_label(cap, part)}L{layer} head view{', moved' if moved else ''} — " + (
        "every query" if query is None else f"from {q_names[query]!r} (#{query})"
    )
    rows_shown = max(n, len(k_names))
    height = max(420, min(2400, 20 * rows_shown + 120))
    pad = max(0.5, 8 * rows_shown / (height - 70))  # 8 px: half a label's height
    fig.update_layout(
        title=marked_title(title + ": " + ", ".join(rule) + f" ({lines:,} lines)", *new.values()),
        xaxis=dict(visible=False, range=[-0.6, 1.6]),
        # the rows and half a label more (autorange pads ~5 % of the height: ~100 px of nothing at 500 tokens)
        yaxis=dict(visible=False, range=[rows_shown - 1 + pad, -pad]),
        plot_bgcolor="white",
        height=height,
        margin=dict(l=10, r=10, t=60, b=10),
        legend=dict(
            orientation="h", yanchor="top", y=-8 / height
        ),  # right under the lines (its default: 10 % of the height lower)
        shapes=[
            boundary(y=start - 0.5, span=(-0.6, 0.05) if side == "query" else (0.95, 1.6))
            for side, start in new.items()
            if start is not None
        ],
    )
    return fig
