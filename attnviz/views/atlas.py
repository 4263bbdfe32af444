"""The head atlas drawn: a layer × head map coloured by role (:func:`atlas_map`) and the page that
holds it with the table (:func:`atlas_page`), from :func:`attnviz.analysis.head_atlas`' table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from ..analysis.atlas import ROLES
from ..errors import InputError
from .common import themed
from .html import CJK_TEXT, cjk_font_face, escape_html, page_head, scripts_of, write_page

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ROLE_COLOURS", "ROLE_MARKS", "atlas_map", "atlas_page"]

# one colour per role (the first role a head meets, in ROLES order, colours its cell); grey: none
ROLE_COLOURS = {
    "previous_token": "#1f77b4",
    "next_token": "#aec7e8",
    "positional": "#17becf",
    "broad": "#c7c7c7",
    "focused": "#7f7f7f",
    "sink": "#d62728",
    "special_token": "#ff9896",
    "duplicate_token": "#9467bd",
    "induction": "#2ca02c",
    "rare_word": "#ff7f0e",
    "coreference": "#8c564b",
}
NONE_COLOUR = "#f4f4f4"
# the short names written in each cell, one per role met
ROLE_MARKS = {
    "previous_token": "prev",
    "next_token": "next",
    "positional": "pos",
    "broad": "broad",
    "focused": "focus",
    "sink": "sink",
    "special_token": "spec",
    "duplicate_token": "dup",
    "induction": "ind",
    "rare_word": "rare",
    "coreference": "coref",
}


def _check(atlas: pd.DataFrame) -> list[str]:
    missing = {"layer", "head", "roles"} - set(atlas.columns)
    if missing:
        raise InputError(
            f"not a head atlas table (no {', '.join(sorted(missing))} column): give attnviz.analysis.head_atlas' table"
        )
    return [name for name in ROLES if name in atlas.columns]


def _met(cell: object) -> list[str]:
    return [r for r in str(cell).split(", ") if r] if isinstance(cell, str) else []


@themed
def atlas_map(atlas: pd.DataFrame, *, part: str | None = None, title: str | None = None) -> go.Figure:
    """A layer × head map of :func:`attnviz.analysis.head_atlas`' table: each cell coloured by the first
    role its head meets (in :data:`~attnviz.analysis.atlas.ROLES` order; grey: none), with every role it
    meets written in it (``prev·pos``: multi-role heads show each), and a hover naming each role's
    score against its threshold and the positional offset. ``part``: which part of the table (default:
    its first)."""
    roles = _check(atlas)
    if "part" in atlas.columns and len(atlas):
        parts = list(dict.fromkeys(atlas["part"]))
        chosen = part if part is not None else parts[0]
        if chosen not in parts:
            raise InputError(f"no part {chosen!r} in this atlas; its parts are {', '.join(map(str, parts))}")
        atlas = atlas[atlas["part"] == chosen]
    if not len(atlas):
        raise InputError("the atlas table has no row: give attnviz.analysis.head_atlas' table")
    layers = sorted(int(x) for x in set(atlas["layer"]))
    heads = int(atlas["head"].max()) + 1
    order = [*roles, None]
    z = [[len(roles)] * heads for _ in layers]  # the index of the colouring role; len(roles): none
    text = [[""] * heads for _ in layers]
    hover = [[""] * heads for _ in layers]
    for row in atlas.to_dict("records"):
        li, h = layers.index(int(row["layer"])), int(row["head"])
        met = [r for r in _met(row["roles"]) if r in roles]
        z[li][h] = roles.index(met[0]) if met else len(roles)
        text[li][h] = "·".join(ROLE_MARKS[r] for r in met)
        lines = [f"L{row['layer']}·H{h}: {', '.join(met) or 'no role'}"]
        for name in roles:
            role = ROLES[name]
            side = role.side
            score = row[name]
            shown = role.text(score) if name != "coreference" else _fmt(score)  # NaN: "—", not scored
            extra = (
                f" (offset {row['positional_offset']:+d})"
                if name == "positional" and "positional_offset" in row
                else ""
            )
            if name == "coreference" and "coreference_p_holm" in row:
                p_holm = row["coreference_p_holm"]
                extra = (
                    f" (Holm p = {p_holm:.3g}; counts at p {side} {role.threshold:g})"
                    if p_holm == p_holm
                    else " (not scored: no probe set was given)"
                )
                lines.append(f"{'✓' if name in met else '·'} {name}: {shown}{extra}")
                continue
            lines.append(f"{'✓' if name in met else '·'} {name}: {shown} ({side} {role.threshold:g}){extra}")
        hover[li][h] = "<br>".join(escape_html(line) for line in lines)
    n = len(order)
    colours = [ROLE_COLOURS[r] if r is not None else NONE_COLOUR for r in order]
    scale = []
    for i, colour in enumerate(colours):  # discrete bands: index i covers [i/n, (i+1)/n]
        scale += [[i / n, colour], [(i + 1) / n, colour]]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(heads)),
            y=layers,
            zmin=-0.5,
            zmax=n - 0.5,
            colorscale=scale,
            text=text,
            texttemplate="%{text}",
            textfont=dict(size=9),
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            xgap=1,
            ygap=1,
            colorbar=dict(
                tickvals=list(range(n)),
                ticktext=[r if r is not None else "no role" for r in order],
                title="first role",
            ),
        )
    )
    fig.update_layout(
        title=title or "Head atlas: each head's roles (cell text: every role it meets)",
        xaxis=dict(title="head", dtick=1),
        yaxis=dict(title="layer", autorange="reversed", dtick=1),
        height=max(360, 26 * len(layers) + 160),
        margin=dict(l=60, r=10, t=60, b=40),
    )
    return fig


def atlas_page(atlas: pd.DataFrame, path: str | Path | None = None, *, title: str = "attnviz head atlas") -> str:
    """One self-contained HTML page (plotly.js inlined, no CDN): the map of :func:`atlas_map` for each
    part, the criteria (each role's threshold and source) and the table (every head's roles, scores
    and examples), every text escaped. Written to ``path`` when given; returned."""
    import plotly.offline  # the page's own copy of plotly.js

    roles = _check(atlas)
    parts = list(dict.fromkeys(atlas["part"])) if "part" in atlas.columns else [None]
    figures = "\n".join(
        atlas_map(atlas, part=p, title=f"Head atlas{f' ({p})' if p else ''}").to_html(
            full_html=False, include_plotlyjs=False, div_id=f"attnviz-atlas-{i}"
        )
        for i, p in enumerate(parts)
    )
    cell = "padding:1px 6px;text-align:left;border-bottom:1px solid #e5e5e5;vertical-align:top"
    criteria = "".join(
        f'<tr><td style="{cell}">{escape_html(name)}</td><td style="{cell}">{escape_html(ROLES[name].what)}</td>'
        f'<td style="{cell}">{ROLES[name].threshold:g}</td><td style="{cell}">{escape_html(ROLES[name].source)}</td></tr>'
        for name in roles
    )
    columns = [c for c in ("part", "layer", "head", "roles", "positional_offset") if c in atlas.columns] + roles
    examples = [f"{name}_example" for name in roles if f"{name}_example" in atlas.columns]
    head = "".join(f'<th style="{cell}">{escape_html(c)}</th>' for c in [*columns, "examples"])
    body = []
    for row in atlas.to_dict("records"):
        values = [ROLES[c].text(row[c]) if c in ROLES and c != "coreference" else _fmt(row[c]) for c in columns]
        shown = "<br>".join(
            f"<b>{escape_html(e.removesuffix('_example'))}</b>: {escape_html(str(row[e]))}" for e in examples if row[e]
        )
        body.append(
            "<tr>"
            + "".join(f'<td style="{cell}">{escape_html(v)}</td>' for v in values)
            + f'<td style="{cell}">{shown}</td></tr>'
        )
    # the CJK face inlined only where the page holds such text (a corpus' examples in Chinese): ≈1.8 MB
    face = f"<style>{cjk_font_face()}</style>" if CJK_TEXT.search(title + figures + "".join(body)) else ""
    plotly_js = plotly.offline.get_plotlyjs()
    page = (
        f"{page_head(title, [plotly_js, *scripts_of(figures)])}{face}"
        f'<script type="text/javascript">{plotly_js}</script></head>'
        f'<body style="font-family:&quot;attnviz CJK&quot;,system-ui,sans-serif;font-size:13px"><h3>{escape_html(title)}</h3>\n{figures}\n'
        f'<h4>Criteria</h4><table style="border-collapse:collapse"><tr><th style="{cell}">role</th>'
        f'<th style="{cell}">score</th><th style="{cell}">threshold</th><th style="{cell}">source</th></tr>{criteria}</table>'
        f'<h4>Heads</h4><table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}</table>\n</body></html>\n'
    )
    if path is not None:
        write_page(page, path)
    return page


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "—" if value != value else f"{value:.3f}"
    return str(value)
