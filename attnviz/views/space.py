"""The query–key space of one head (:func:`attnviz.analysis.qk_space`) as a WebGL scatter."""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from ..errors import InputError
from .common import themed
from .html import escape_html

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SPACE_COLOURS", "qk_space_figure"]

SPACE_COLOURS = {
    "kind": "query or key",
    "position": "position in its text",
    "token_class": "token class",
    "text": "text",
}
_KIND = {"query": "#d62728", "key": "#1f77b4"}
_CLASS = {"first": "#7f7f7f", "special": "#9467bd", "punctuation": "#ff7f0e", "word": "#2ca02c"}
_SYMBOL = {"query": "circle", "key": "diamond"}


def _hover(df: pd.DataFrame) -> list[str]:
    return [
        f"{kind} · text {text} · pos {pos}<br>{escape_html(context)}<br>word: {escape_html(word)} · |v| = {norm:.3g}"
        for kind, text, pos, context, word, norm in zip(
            df["kind"], df["text"], df["position"], df["context"], df["word"], df["norm"]
        )
    ]


_NO_BREAK = "\u00a0"  # textwrap breaks at white space only: a no-break space holds a group together
_GROUP = re.compile(r"\([^()]*\)")


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words but never inside a
    parenthesis of up to ``width`` characters — "(|t| = 5.52)" stays on one line."""
    held = _GROUP.sub(lambda m: m.group(0).replace(" ", _NO_BREAK) if len(m.group(0)) <= width else m.group(0), text)
    return [line.replace(_NO_BREAK, " ") for line in textwrap.wrap(held, width, break_on_hyphens=False)]


@themed
def qk_space_figure(df: pd.DataFrame, *, color: str = "kind", title: str | None = None) -> go.Figure:
    """A scatter of a :func:`~attnviz.analysis.qk_space` frame: WebGL (``Scattergl``, or ``Scatter3d``
    for 3-D), queries as circles and keys as diamonds, coloured by ``color`` (:data:`SPACE_COLOURS`);
    hover names the token in its context. Each trace's ``customdata`` is ``[text, position, kind]``
    (what a click means). The title states the transform (``df.attrs["description"]``)."""
    if color not in SPACE_COLOURS:
        raise InputError(f"unknown color {color!r}; choose from {', '.join(SPACE_COLOURS)}")
    for column in ("kind", "text", "position", "x", "y"):
        if column not in df.columns:
            raise InputError(f"this is not a qk_space frame: it has no column {column!r}")
    three = "z" in df.columns
    fig = go.Figure()
    hover = _hover(df)
    groups: list[tuple[str, pd.Series]]
    if color in ("kind", "token_class"):
        groups = [(str(v), df[color] == v) for v in dict.fromkeys(df[color])]
    else:
        groups = [(kind, df["kind"] == kind) for kind in ("query", "key")]
    for name, mask in groups:
        part = df[mask]
        if part.empty:
            continue
        texts = [h for h, m in zip(hover, mask) if m]
        marker: dict = {"size": 4 if three else 6, "opacity": 0.75}
        if color == "kind":
            marker["color"] = _KIND.get(name)
        elif color == "token_class":
            marker["color"] = _CLASS.get(name)
        else:
            marker.update(color=part[color].to_numpy(), colorscale="Viridis", showscale=name == "query")
            marker["colorbar"] = {"title": SPACE_COLOURS[color]}
        if not three:
            marker["symbol"] = [_SYMBOL[k] for k in part["kind"]]
        custom = list(zip(part["text"].tolist(), part["position"].tolist(), part["kind"].tolist()))
        kwargs = dict(
            mode="markers",
            name=name,
            text=texts,
            hovertemplate="%{text}<extra></extra>",
            customdata=custom,
            marker=marker,
        )
        if three:
            fig.add_trace(go.Scatter3d(x=part["x"], y=part["y"], z=part["z"], **kwargs))
        else:
            fig.add_trace(go.Scattergl(x=part["x"], y=part["y"], **kwargs))
    described = "<br>".join(_wrap(df.attrs.get("description", ""), 110))  # one line was cut off
    lines = described.count("<br>") + 1 if described else 0
    fig.update_layout(
        title={"text": title or f"Query–key space<br><sup>{described}</sup>", "x": 0.01},
        legend={"title": SPACE_COLOURS[color]},
        margin={"l": 60, "r": 20, "t": 60 + 16 * lines, "b": 50},
        height=600 + 16 * lines,
        clickmode="event",
    )
    method = df.attrs.get("transform", {}).get("method")
    names = {"pca": "PC", "tsne": "t-SNE ", "umap": "UMAP "}.get(method, "axis ")
    ratios = df.attrs.get("transform", {}).get("explained_variance_ratio") or []
    axes = [f"{names}{i + 1}" + (f" ({ratios[i]:.0%} of the variance)" if i < len(ratios) else "") for i in range(3)]
    if three:
        fig.update_layout(scene={"xaxis_title": axes[0], "yaxis_title": axes[1], "zaxis_title": axes[2]})
    else:
        fig.update_xaxes(title=axes[0])
        fig.update_yaxes(title=axes[1], scaleanchor="x", scaleratio=1)  # distances read the same both ways
    return fig
