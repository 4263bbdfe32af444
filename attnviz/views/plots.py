"""Plotly figures of the analyses (pure functions, like :mod:`attnviz.figures`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import torch

from ..analysis.rollout import ROLLOUT_CELLS
from ..analysis.stats import DETECTORS, MOVED_STATISTICS, STATISTICS
from ..data.words import group_matrix
from ..errors import InputError
from .common import labels, short_label, themed
from .marks import boundary, mark_labels, marked_title, new_starts

if TYPE_CHECKING:
    import pandas as pd

    from ..analysis.coref import CorefRanking
    from ..analysis.probes import ProbeResult
    from ..data.capture import Capture

__all__ = ["coref_bars", "head_map", "probe_accuracy_map", "probe_intervals", "rollout_figure"]


@themed
def head_map(table: pd.DataFrame, column: str, *, title: str | None = None, colorscale: str = "Viridis") -> go.Figure:
    """A layer × head map of one column of a per-head table (head statistics, detector scores…)."""
    if column not in table.columns:
        raise ValueError(f"no column {column!r}; columns are {list(table.columns)}")
    layers = int(table.layer.max()) + 1
    numbers = sorted({int(h) for h in table["head"]})  # the model's heads in the table (capture(heads=) keeps some)
    contiguous = numbers == list(range(len(numbers)))
    heads = numbers  # one column each, labelled by the model's number
    grid = torch.full((layers, len(heads)), float("nan"))
    for row in table.itertuples(index=False):
        grid[row.layer, heads.index(int(row.head))] = float(getattr(row, column))
    meaning = STATISTICS.get(column) or DETECTORS.get(column) or MOVED_STATISTICS.get(column) or column
    fig = go.Figure(
        go.Heatmap(
            z=grid.numpy(),
            x=heads,
            y=list(range(layers)),
            colorscale=colorscale,
            hovertemplate="L%{y}·H%{x}: %{z:.3f}<extra></extra>",
            colorbar=dict(title=column),
        )
    )
    fig.update_layout(
        title=title or f"{column}: {meaning}",
        xaxis=dict(title="head", dtick=1, type="linear" if contiguous else "category"),
        yaxis=dict(title="layer", autorange="reversed", dtick=1),
        height=max(320, 22 * layers + 140),
        margin=dict(l=60, r=10, t=60, b=40),
    )
    return fig


@themed
def probe_accuracy_map(result: ProbeResult) -> go.Figure:
    """Layer × head accuracy at picking the gold antecedent, with the baselines in the title."""
    grid = result.accuracy_map()
    best = result.best
    fig = go.Figure(
        go.Heatmap(
            z=grid.numpy(),
            colorscale="RdBu",
            zmin=0,
            zmax=1,
            zmid=max(result.baselines.values()),
            hovertemplate="L%{y}·H%{x}: %{z:.0%}<extra></extra>",
            colorbar=dict(title="accuracy", tickformat=".0%"),
        )
    )
    interval = f" [{100 * best['low']:.1f}, {100 * best['high']:.1f}]" if "low" in best else ""
    holm = (
        f"<br><sub>{result.beating_chance} of {len(result.accuracy)} heads beat chance after Holm (α = 0.05); "
        "the best head was chosen on these probes: see probe_intervals for its held-out score</sub>"
        if result.has_picks and "beats_chance" in result.accuracy.columns
        else ""
    )
    fig.update_layout(
        title=(
            f"{int(best['n'])} probes: best L{int(best['layer'])}·H{int(best['head'])} {100 * best['accuracy']:.1f} %"
            f"{interval} — baselines: nearest {100 * result.baselines['nearest']:.1f} %, first "
            f"{100 * result.baselines['first']:.1f} % (red beats both){holm}"
        ),
        xaxis=dict(title="head", dtick=1),
        yaxis=dict(title="layer", autorange="reversed", dtick=1),
        height=max(320, 22 * grid.shape[0] + 140),
        margin=dict(l=60, r=10, t=60, b=40),
    )
    return fig


@themed
def probe_intervals(result: ProbeResult, top: int = 15) -> go.Figure:
    """The ``top`` heads' accuracy with its 95 % Wilson interval, as horizontal interval bars (best at
    the top; green: beats chance after Holm's correction over every head), with chance and both
    baselines as vertical lines, and a first row for the held-out estimate
    (:meth:`~attnviz.analysis.ProbeResult.held_out` with seed 0): the head chosen on half the probes,
    scored on the other half — the top heads' own intervals are optimistic, since they were chosen on
    the probes they are scored on."""
    if top < 1:
        raise InputError(f"top is how many heads to draw, at least 1; got {top}")
    ranked = result.ranked().head(top)
    if not result.has_picks or "low" not in ranked.columns:
        raise InputError(
            "probe_intervals needs the per-probe picks and the intervals: build the result with "
            "ProbeResult.from_picks (attnviz.evaluate_probes does)"
        )
    names = [f"L{int(r.layer)}·H{int(r.head)}" for r in ranked.itertuples(index=False)]
    colour = ["#1a7f37" if beats else "#555555" for beats in ranked.beats_chance]
    traces = [
        go.Scatter(
            x=ranked.accuracy.to_numpy(),
            y=names,
            mode="markers",
            name="chosen on these probes",
            marker=dict(color=colour, size=8),
            error_x=dict(
                type="data",
                symmetric=False,
                array=(ranked.high - ranked.accuracy).to_numpy(),
                arrayminus=(ranked.accuracy - ranked.low).to_numpy(),
                color="#777777",
                thickness=2,
                width=0,
            ),
            customdata=ranked[["low", "high", "correct", "n", "p_chance", "p_holm"]].to_numpy(),
            hovertemplate=(
                "%{y}: %{x:.1%} [%{customdata[0]:.1%}, %{customdata[1]:.1%}], %{customdata[2]} of %{customdata[3]}"
                "<br>vs chance p = %{customdata[4]:.2g}, after Holm %{customdata[5]:.2g}<extra></extra>"
            ),
        )
    ]
    rows = list(names)
    try:
        held = result.held_out()
    except InputError:  # too few probes (or groups) to hold any out: the figure says so in its title
        held = None
    if held is not None:
        label = f"held out: {held.label}"
        rows.insert(0, label)
        traces.append(
            go.Scatter(
                x=[held.accuracy_b],
                y=[label],
                mode="markers",
                name=f"held out (seed {held.seed}): chosen on {held.n_a}, scored on {held.n_b}",
                marker=dict(color="#d62728", size=10, symbol="diamond"),
                error_x=dict(
                    type="data",
                    symmetric=False,
                    array=[held.high_b - held.accuracy_b],
                    arrayminus=[held.accuracy_b - held.low_b],
                    color="#d62728",
                    thickness=2,
                    width=0,
                ),
                hovertemplate=(
                    f"{held.label} chosen on {held.n_a} probes ({100 * held.accuracy_a:.1f} %), "
                    f"{held.correct_b} of {held.n_b} on the others: %{{x:.1%}} "
                    f"[{100 * held.low_b:.1f}, {100 * held.high_b:.1f}] (seed {held.seed})<extra></extra>"
                ),
            )
        )
    lines = {"chance": (result.chance, "#000000", "dash")}
    for (name, value), c in zip(result.baselines.items(), ("#1f77b4", "#ff7f0e", "#9467bd"), strict=False):
        lines[f"{name} candidate"] = (value, c, "dot")
    for name, (value, c, dash) in lines.items():  # a line across every row, named in the legend
        traces.append(
            go.Scatter(
                x=[value, value],
                y=[rows[0], rows[-1]],
                mode="lines",
                name=f"{name} {100 * value:.1f} %",
                line=dict(color=c, dash=dash, width=1.5),
                hovertemplate=f"{name}: {100 * value:.1f} %<extra></extra>",
            )
        )
    fig = go.Figure(traces)
    n = len(result.gold)
    held_text = "" if held is not None else " (too few probes to hold any out)"
    fig.update_layout(
        title=dict(
            text=(
                f"top {len(names)} of {len(result.accuracy)} heads on {n} probes: accuracy, 95 % Wilson intervals"
                f"{held_text}<br><sub>{result.beating_chance} heads beat chance after Holm (α = 0.05, green); "
                "chosen on these probes, so optimistic — the red row is scored on probes it was not chosen on</sub>"
            ),
            font=dict(size=13),
        ),
        xaxis=dict(title="accuracy (gold antecedent picked)", range=[0, 1], tickformat=".0%"),
        yaxis=dict(categoryorder="array", categoryarray=rows[::-1]),
        showlegend=True,
        legend=dict(orientation="h", y=-0.15),
        height=max(320, 24 * len(rows) + 200),
        margin=dict(l=110, r=20, t=90, b=80),
    )
    return fig


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


@themed
def coref_bars(ranking: CorefRanking, *, top: int = 10) -> go.Figure:
    """The top heads' attention from the pronoun to each candidate, as grouped bars, each beside
    (hatched) what the same head gives that candidate from the text's other tokens."""
    table = ranking.table.head(top)
    names = ranking.names
    x = [f"L{r.layer}·H{r.head}" for r in table.itertuples(index=False)]
    bars = []
    for i, name in enumerate(names):
        colour = _COLOURS[i % len(_COLOURS)]
        bars.append(
            go.Bar(
                name=name,
                x=x,
                y=table[name].round(4),
                marker_color=colour,
                hovertemplate=f"{ranking.pronoun.text} → {name}: %{{y:.3f}}<extra></extra>",
            )
        )
        others = f"{name} from others"
        if others in table.columns:
            bars.append(
                go.Bar(
                    name=f"{name}, from the other tokens",
                    x=x,
                    y=table[others].round(4),
                    marker=dict(
                        color="white", line=dict(color=colour, width=1.5), pattern=dict(shape="/", fgcolor=colour)
                    ),
                    hovertemplate=f"other tokens → {name}: %{{y:.3f}} (mean)<extra></extra>",
                )
            )
    fig = go.Figure(bars)
    fig.update_layout(
        barmode="group",
        title=f"{ranking.pronoun.text!r} → candidates, top {len(table)} heads ({ranking.how()})",
        yaxis=dict(title="attention", range=[0, 1]),
        height=360,
        margin=dict(l=50, r=10, t=60, b=40),
    )
    return fig


MAX_TICKS = 60  # axis labels a figure shows; every token is named on hover


def thinned_ticks(names: list[str], max_ticks: int = MAX_TICKS, *, new_from: int | None = None, block: int = 1) -> dict:
    """Axis settings that label at most ``max_ticks`` evenly spaced tokens of a categorical axis
    ("3:cat" reads "cat", cut at :data:`~attnviz.data.words.LABEL_CHARS`); a category whose first token (``block`` tokens a category) is at or after
    ``new_from`` (a generation's new tokens) is marked."""
    step = -(-len(names) // max_ticks)
    text = [short_label(n.split(":", 1)[1]) for n in names[::step]]
    return dict(
        tickmode="array",
        tickvals=names[::step],
        ticktext=mark_labels(text, new_from, [i * block for i in range(0, len(names), step)]),
    )


MAX_CELLS = ROLLOUT_CELLS  # the rollout heatmap's cells per side at most


def _decimals(top: float) -> int:
    """Decimals that keep three significant digits of values up to ``top`` (at least 5): a rollout's cells
    outside the sinks are ~1e-5 on a 30-layer decoder, which 5 decimals rounded to 0 and 1e-5."""
    return max(5, 3 - math.floor(math.log10(top))) if top > 0 else 5


@themed
def rollout_figure(
    cap: Capture,
    flow: torch.Tensor,
    *,
    query: int | None = None,
    percentile: float = 99.0,
    mark_new: bool = True,
    words: bool = False,
) -> go.Figure:
    """The final layer's rollout as a heatmap, or one query's row as bars.

    ``flow``: :func:`rollout`'s ``[layer, n, n]`` (its last layer is drawn), the final layer's
    ``[n, n]``, its block means ``[m, m]`` from :func:`rollout_blocks`, or — with ``query`` — that
    query's row ``[n]`` from :func:`rollout_rows`.

    The heatmap's colour scale ends at the ``percentile`` of the cells outside the sink columns (the
    first and special tokens, which take most of the flow in decoders), so the rest of the map is
    not drawn in one pale shade; the figure's title says where it ends. Axes label at most
    :data:`MAX_TICKS` tokens; hover names the query and key of every cell. Past :data:`MAX_CELLS`
    tokens each cell is the mean over a block of tokens (the title says how many), so the figure
    stays near 1.5 MB whatever the length. ``mark_new``: a generation's new tokens marked and the prompt
    boundary drawn (:mod:`attnviz.views.marks`).

    ``words``: word × word (a word's flow to a word summed over its pieces, from a word averaged over
    its pieces, as :meth:`~attnviz.Capture.to_words` merges weights: rows still sum to 1); ``query`` is
    then a word's number, and a ``[n]`` row given is that word's own (its pieces' rows averaged). A
    block-mean map stays in tokens (its title says so)."""
    from ..analysis.coref import sink_tokens  # deferred: only the rollout figure needs it

    last = flow[-1] if flow.dim() == 3 else flow
    asked, words = words, words and last.shape[-1] == cap.n_tokens  # block means have no words
    names = [f"{i}:{name}" for i, name in enumerate(labels(cap, words))]  # unique categories: hover names it
    n = len(names)
    if words:
        queries, _ = cap.sequences(None)
        to_sum = group_matrix(queries.words, queries.n_tokens).to(last)  # [word, token]
        if last.dim() == 2 and query is None:
            last = cap.to_words(last)
        elif last.dim() == 2:  # the query word's row: its pieces' rows averaged
            last = group_matrix(queries.words, queries.n_tokens, mean=True).to(last)[query] @ last
        if last.dim() == 1:
            last = to_sum @ last
    caption = "attention rollout (heads averaged, residual mixed in, multiplied through layers) — a flow estimate, not an attribution"
    q_new, k_new = new_starts(cap, None, words, mark_new)
    if query is None:
        if last.dim() != 2 or last.shape[0] != last.shape[1] or last.shape[0] > n:
            raise InputError(f"a rollout heatmap needs an [n, n] or block-mean [m, m] matrix, got {tuple(flow.shape)}")
        if last.shape[0] > MAX_CELLS:  # never ship more than the screen shows: mean over blocks of tokens
            block = -(-n // MAX_CELLS)
            last = torch.nn.functional.avg_pool2d(last[None].float(), block, ceil_mode=True)[0]
        pooled = -(-n // last.shape[0])  # tokens a cell holds per side (1: exact)
        sinks = set(sink_tokens(cap))
        if words:  # the words that hold a sink token
            sinks = {i for i, w in enumerate(queries.words) if any(w.token_start <= j < w.token_stop for j in sinks)}
        sink_cells = {j // pooled for j in sinks}
        kept = [j for j in range(last.shape[1]) if j not in sink_cells]
        values = last[:, kept].flatten() if kept else last.flatten()
        if values.numel() > 1_000_000:
            values = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(0))[:1_000_000]]
        top = float(torch.quantile(values.float(), percentile / 100)) if values.numel() else 1.0
        top = top if top > 0 else float(last.max())
        cells = names
        if pooled > 1:
            cells = [f"{names[i]} … {names[min(i + pooled, n) - 1]}" for i in range(0, n, pooled)]
        fig = go.Figure(
            go.Heatmap(
                z=last.numpy().round(_decimals(top)),
                x=cells,
                y=cells,
                zmin=0,
                zmax=top,
                colorscale="Greens",
                hovertemplate="query %{y} ← key %{x}: %{z:.3g}<extra></extra>",
            )
        )
        shapes = []
        if k_new is not None:
            shapes.append(boundary(x=k_new / pooled - 0.5, yref="paper"))
        if q_new is not None:
            shapes.append(boundary(y=q_new / pooled - 0.5, xref="paper"))
        fig.update_layout(
            xaxis=dict(side="top", **thinned_ticks(cells, new_from=k_new, block=pooled)),
            yaxis=dict(autorange="reversed", **thinned_ticks(cells, new_from=q_new, block=pooled)),
            shapes=shapes,
        )
        caption = marked_title(caption, q_new, k_new)
        outside = "blocks" if pooled > 1 else "cells"
        if pooled > 1:
            unit = "words" if words else "tokens"
            caption += f"<br><sub>{n:,} {unit}: each cell is the mean over a block of {pooled}×{pooled} {unit}</sub>"
        left_out = ", ".join(repr(names[j].split(":", 1)[1]) for j in sorted(sinks)[:3])
        caption += (
            f"<br><sub>colour ends at the {percentile:g}th percentile of the {outside} outside the sink columns "
            f"({left_out or 'none'}): {top:.3g}; higher {outside} (max {float(last.max()):.2f}) are drawn at full colour</sub>"
        )
        if asked and not words:
            caption += "<br><sub>in tokens: a map of block means has no words</sub>"
    else:
        row = last if last.dim() == 1 else last[query]
        fig = go.Figure(
            go.Bar(
                x=names,
                y=row.numpy().round(_decimals(float(row.max()))),
                hovertemplate="%{x}: %{y:.3g}<extra></extra>",
            )
        )
        fig.update_layout(
            xaxis=thinned_ticks(names, new_from=k_new),
            yaxis=dict(title="share of the flow"),
            shapes=[] if k_new is None else [boundary(x=k_new - 0.5, yref="paper")],
        )
        caption = marked_title(f"{names[query].split(':', 1)[1]!r}: " + caption, k_new)
    fig.update_layout(
        title=dict(text=caption, font=dict(size=13)),
        height=max(360, min(900, 18 * min(len(names), MAX_TICKS) + 200)),
        margin=dict(l=80, r=10, t=110, b=40),
    )
    return fig
