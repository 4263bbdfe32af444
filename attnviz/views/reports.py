"""Layer × head reports and an edit's predictions: the validation's error map, the head-ablation
importance map, the next-token bars before and after the edits, and a score taken apart
(:func:`attribution_bars`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go
import torch

from ..data.capture import Capture
from ..data.predictions import token_text
from ..errors import InputError
from .common import themed

if TYPE_CHECKING:
    import pandas as pd

    from ..data.attribution import QKAttribution
    from ..data.predictions import Intervention
    from ..data.validate import ValidationReport

__all__ = ["attribution_bars", "importance_map", "prediction_bars", "validation_map"]


@themed
def attribution_bars(why: QKAttribution, top: int = 8) -> go.Figure:
    """A :class:`~attnviz.QKAttribution` as bars: the ``top`` components writing the query, the ``top``
    writing the key (each summed over the other side) and the ``top`` pairs, largest |share| first; the
    title says the model's score, Σ pairs and their relative error."""
    from plotly.subplots import make_subplots  # deferred: only this figure has subplots

    q, k, v = why.tokens
    versus = "" if v is None else f" − s(→ {v} @{why.versus})"
    sides = [
        ("query side", why.query_side.head(top)),
        ("key side", why.key_side.head(top)),
    ]
    pairs = why.pairs.head(top)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("writing the query", "writing the key", "pairs (query × key)"))
    for col, (_, series) in enumerate(sides, start=1):
        values = series.tolist()
        fig.add_trace(
            go.Bar(
                x=values,
                y=list(series.index),
                orientation="h",
                marker_color=["#1f77b4" if x >= 0 else "#d62728" for x in values],
                hovertemplate="%{y}: %{x:+.4f}<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
    values = pairs["score"].tolist()
    fig.add_trace(
        go.Bar(
            x=values,
            y=[f"{a} × {b}" for a, b in zip(pairs["query_component"], pairs["key_component"], strict=True)],
            orientation="h",
            marker_color=["#1f77b4" if x >= 0 else "#d62728" for x in values],
            hovertemplate="%{y}: %{x:+.4f}<extra></extra>",
            showlegend=False,
        ),
        row=1,
        col=3,
    )
    for col in (1, 2, 3):
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_layout(
        title=(
            f"L{why.layer}·H{why.head}: {q} @{why.query} → {k} @{why.key}{versus}<br><sub>the model's score "
            f"{why.score:+.4f}, Σ pairs {why.total:+.4f} (relative error {why.error:.1e})</sub>"
        ),
        height=max(300, 26 * top + 140),
        margin=dict(l=10, r=10, t=90, b=30),
    )
    return fig


@themed
def validation_map(report: ValidationReport | Capture, quantity: str = "output", part: str | None = None) -> go.Figure:
    """Layer × head map of the max absolute error of one part, the worst head named in the title.
    ``report``: a :class:`~attnviz.ValidationReport`, or a :class:`~attnviz.Capture` (its ``validate()``);
    ``quantity``: ``"output"`` (A·V against the kernel's output) or ``"weights"`` (A against the model's
    weights, where its backend returned them)."""
    if isinstance(report, Capture):
        report = report.validate()
    if quantity not in ("output", "weights"):
        raise InputError(f"quantity must be 'output' or 'weights', got {quantity!r}")
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


def edits_title(edits: list, shown: int = 6) -> str:
    """The edits for a title, one per kind: "knockout 它 ↛ 小猫 at L13·H8, L15·H3, L17·H3" for three
    heads (each edit's own text ran past the figure's edge), at most ``shown`` places a kind, then how
    many in all."""
    groups: dict[str, list[str]] = {}
    for edit in edits:
        what, _, where = str(edit).partition(" at ")
        groups.setdefault(what, []).append(where)
    said = []
    for what, places in groups.items():
        listed = ", ".join(places[:shown]) + (f", … ({len(places)} in all)" if len(places) > shown else "")
        said.append(f"{what} at {listed}" if listed else what)
    return "; ".join(said)


@themed
def prediction_bars(out: Intervention, k: int = 5, continuation: str | int | list[int] | None = None) -> go.Figure:
    """The next-token probabilities before and after the edits, as bars: the top ``k`` of each,
    side by side; with ``continuation``, its log-probability change in the title. For a model
    without a language-model head, each token's cosine between its final hidden states edited and not."""
    edits = edits_title(out.edits)
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
    names = [token_text(before.tokenizer, i).replace("\n", "↵").replace(" ", "·") or f"#{i}" for i in ids]
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


@themed
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
