"""What every figure module shares: colours, axis labels and ticks, the title above a top axis, the
settings line of a head's map, what a map measures (weights or moved: what the head moves), the empty figure that
carries a message, and the figures' font (:data:`FONT_FAMILY`, set by :func:`themed`)."""

from __future__ import annotations

import functools
import math
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec

import plotly.graph_objects as go
import torch

from ..analysis.overview import check_measure
from ..data.words import LABEL_CHARS, group_matrix, short_label
from .marks import mark_labels

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = [
    "FONT_FAMILY",
    "HEAD_COLOURS",
    "LABEL_CHARS",
    "MASKED_COLOUR",
    "above_top_axis",
    "allowed_cells",
    "labels",
    "measure_map",
    "measure_name",
    "measure_symbol",
    "message_figure",
    "part_label",
    "settings_text",
    "short_label",
    "themed",
    "ticks",
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
#: every figure's font: the dashboard's CJK web face first (it holds only CJK characters, so Latin falls
#: through to plotly's own "Open Sans", verdana, arial), defined by the dashboard's assets/fonts.css and by
#: the pages :func:`attnviz.figures.html_page` writes; where it is not defined the next font is used
FONT_FAMILY = '"attnviz CJK", "Open Sans", verdana, arial, sans-serif'

P = ParamSpec("P")


def themed(make: Callable[P, go.Figure]) -> Callable[P, go.Figure]:
    """A figure function whose figure gets the figures' font (:data:`FONT_FAMILY`) where it names none,
    so tokens in Chinese or Japanese render wherever the CJK face is served, also on a machine without one."""

    @functools.wraps(make)
    def figure(*args: P.args, **kwargs: P.kwargs) -> go.Figure:
        fig = make(*args, **kwargs)
        if fig.layout.font.family is None:
            fig.update_layout(font_family=FONT_FAMILY)
        return fig

    return figure


def labels(cap: Capture, words: bool = False, part: str | None = None, axis: str = "query") -> list[str]:
    """Tick labels of a part's queries or keys: word texts, or token texts (special tokens as themselves).

    Cross-attention's queries are the target's tokens and its keys the source's."""
    queries, keys = cap.sequences(part)
    seq = queries if axis == "query" else keys
    return seq.word_labels if words else seq.token_labels


def part_label(cap: Capture, part: str | None) -> str:
    """ "decoder " before L3·H8 when a capture has several parts, else nothing."""
    return f"{cap.resolve_part(part)} " if len(cap.parts) > 1 else ""


def ticks(names: list[str], max_ticks: int = 64, *, new_from: int | None = None) -> dict:
    """Axis settings that label at most ``max_ticks`` evenly spaced positions of a numeric axis with
    their names (each at most :data:`LABEL_CHARS` characters); positions from ``new_from`` on (a
    generation's new tokens) are marked."""
    step = max(1, math.ceil(len(names) / max_ticks))
    idx = list(range(0, len(names), step))
    return dict(
        tickmode="array", tickvals=idx, ticktext=mark_labels([short_label(names[i]) for i in idx], new_from, idx)
    )


def allowed_cells(
    cap: Capture, layer: int, causal: bool | None, words: bool, part: str | None = None
) -> torch.Tensor:  # [query, key] bool: the cells a mask lets through (a word pair: any of its token pairs)
    """Which cells of a layer's map the mask lets through, in tokens or words."""
    allowed = cap.allowed(layer, causal=causal, part=part)
    if not words:
        return allowed
    queries, keys = cap.sequences(part)
    from_q = group_matrix(queries.words, queries.n_tokens)
    to_k = group_matrix(keys.words, keys.n_tokens)
    return (from_q @ allowed.float() @ to_k.T) > 0


def measure_map(
    cap: Capture,
    layer: int,
    head: int | None,
    measure: str,
    *,
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
    words: bool = False,
) -> torch.Tensor:  # [query, key] for one head, else [head, query, key]; float32 on the CPU
    """A map of ``measure``: the weights (:meth:`Capture.attention`) for ``"weights"``, what each head
    moves, α_ij·‖f_h(x_j)‖ (:meth:`Capture.moved`), for ``"moved"`` — with the same settings.
    A bad measure, or a layer without value norms, is an :class:`InputError`."""
    of = cap.moved if check_measure(measure) == "moved" else cap.attention
    return of(layer, head, part=part, causal=causal, scale=scale, temperature=temperature, words=words).float().cpu()


def measure_symbol(measure: str) -> str:
    """A colour scale's title: "α" (the weights) or "‖α·f(x)‖" (what the head moves)."""
    return {"weights": "α", "moved": "‖α·f(x)‖"}[check_measure(measure)]


def measure_name(measure: str) -> str:
    """What a title calls the measure: "weights" or "moved (‖α·f(x)‖)" (what the head moves)."""
    return {"weights": "weights", "moved": "moved (‖α·f(x)‖)"}[check_measure(measure)]


def label_px(label: str) -> int:
    """A tick label's width at 12 px, roughly: ~7 px a character, 12 px a wide (CJK) one — counted as 7, a
    Chinese text's labels were taken to fit level, plotly turned them upright, and they ran into the title."""
    return sum(12 if unicodedata.east_asian_width(c) in "WF" else 7 for c in label)


def above_top_axis(text: str, tick_labels: list[str], *, angle: float | None = None, width: int = 700) -> dict:
    """Layout for a figure whose key axis is on top: its title pinned to the top of the figure and a top
    margin that holds the title, the axis title and the tick labels one above the other (plotly places
    each in the margin on its own, so a tall tick label would run into the title).

    ``angle``: the labels' fixed angle in degrees; None is plotly's own choice, level when they fit
    side by side in ``width`` pixels, upright when they do not."""
    lines = text.count("<br>")
    title_px = 28 + 16 * lines
    longest = max((label_px(label) for label in tick_labels), default=0)
    if angle is None:
        angle = 0 if sum(label_px(label) + 8 for label in tick_labels) <= width else 90
    ticks_px = 16 + longest * abs(math.sin(math.radians(angle)))
    return dict(
        title=dict(
            text=text, y=1, yref="container", yanchor="top", pad=dict(t=10 + 18 * lines)
        ),  # plotly anchors a title at its first line
        margin_top=int(title_px + 24 + ticks_px + 12),
    )


def settings_text(
    cap: Capture, layer: int, causal: bool | None, scale: bool | float, temperature: float, part: str | None = None
) -> str:
    """The settings a head's map was computed with, for its title: "model's mask, ×0.125, + sinks"."""
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


@themed
def message_figure(message: str) -> go.Figure:
    """An empty figure that carries a message instead of a plot."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=15), x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), height=200)
    return fig
