"""Attention over the picture: a vision encoder's capture drawn on the image it read.

- :func:`image_attention`: one query's row (``[CLS]``'s by default, or a patch's) as a heat overlay
  on the image, one head or the heads' mean;
- :func:`image_heads`: every head of a layer as thumbnails over the image (DINO's picture of heads
  that find the object);
- :func:`image_rollout`: attention rollout (Abnar & Zuidema 2020) of a query over the image;
- :func:`text_attention`: the same query's row over the tokens *off* the picture — a vision-language
  model's text before and after its image tokens, or every token of a text part (a joint CLIP/SigLIP
  capture's ``text``) — drawn beside :func:`image_attention` (:func:`text_row` is its data).

Each patch's value is drawn on exactly that patch's pixels of the processed image (``cap.image``); the
share a query gives the tokens before the patches (``[CLS]``, registers) is in the title, since it has
no place on the picture. :func:`patch_row` is the grid a figure draws.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import plotly.graph_objects as go
from torch import Tensor

from ..analysis.rollout import rollout
from ..data.images import ImageGrid
from ..errors import InputError, OutOfRangeError
from .common import themed

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = [
    "IMAGE_COLOURS",
    "image_attention",
    "image_grid",
    "image_heads",
    "image_rollout",
    "patch_row",
    "query_of",
    "text_attention",
    "text_positions",
    "text_row",
]

IMAGE_COLOURS = "Inferno"  # the heat's colour scale


def image_grid(cap: Capture, part: str | None = None) -> ImageGrid:
    """The picture and patch grid of the capture's ``part`` (:meth:`attnviz.Capture.image_of`), or the
    error that says these figures need one."""
    grid = cap.image_of(part)
    if grid is None:
        if cap.image is not None:  # a joint text–image model's text part
            raise InputError(
                f"the {cap.resolve_part(part)} part's tokens are not on the picture; draw the vision part (part='vision')"
            )
        raise InputError(
            "this capture has no picture: image figures draw a vision encoder's capture "
            "(attnviz.capture(model, image) with ViT, DINOv2, CLIP's or SigLIP's vision tower)"
        )
    return grid


def query_of(grid: ImageGrid, query: int | str | tuple[int, int] | None) -> int:
    """The query token: given (an index, a label, a ``(row, col)``), else the first token before the
    patches (``[CLS]``), else — SigLIP has none — the centre patch."""
    if query is not None:
        return grid.token(query)
    if grid.n_prefix:
        return 0
    return grid.token((grid.grid[0] // 2, grid.grid[1] // 2))


def patch_row(
    cap: Capture,
    layer: int,
    head: int | None = None,
    *,
    query: int | str | tuple[int, int] | None = None,
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
) -> tuple[Tensor, float]:  # ([rows, cols], the share of the tokens before the patches)
    """The query's attention over the patches as the grid (one head, or the heads' mean), and the share
    of its row the tokens off the picture take (those before the patches; a VLM's text). ``causal``,
    ``scale`` and ``temperature`` are the
    AttentionLab's switches (:meth:`attnviz.Capture.attention`): the row recomputed with them."""
    grid = image_grid(cap, part)
    q = query_of(grid, query)
    row = _row(cap, layer, head, q, part, causal, scale, temperature)
    values = grid.patch_values(row)
    start, stop = grid.n_prefix, grid.n_prefix + grid.n_patches  # the patches' tokens; the rest is off the picture
    return values, float(row[:start].sum() + row[stop:].sum())  # read, not 1 - Σ patches (two float32 sums' error)


def _row(
    cap: Capture,
    layer: int,
    head: int | None,
    q: int,
    part: str | None,
    causal: bool | None,
    scale: bool | float,
    temperature: float,
) -> Tensor:  # [key]: query q's row, one head's or the heads' mean
    if causal is None and scale is True and temperature == 1.0:  # the model's own row: only that row computed
        rows = cap.attention_rows(layer, [q], part=part)[:, 0].float()  # [head, key]
    else:
        rows = cap.attention(layer, part=part, causal=causal, scale=scale, temperature=temperature)[:, q].float()
    if head is None:
        return rows.mean(0)
    n_heads = cap.info(part)["n_heads"]
    if not isinstance(head, int) or not 0 <= head < n_heads:
        raise OutOfRangeError(f"head {head} is out of range: layer {layer} has heads 0..{n_heads - 1}")
    return rows[cap.head_index(layer, head, part)]  # the model's head → its row (capture(heads=) keeps some)


def text_positions(cap: Capture, part: str | None = None) -> list[int]:
    """The positions of a part's tokens that are not on the picture: a vision-language model's text
    before its image tokens (``cap.image.prefix``) and after them (``suffix``); every token of a part
    whose tokens are not on a picture (a joint model's ``text``). A vision encoder's part has none."""
    grid = cap.image_of(part)
    if grid is None:
        return list(range(len(cap.sequences(part)[1].tokens)))
    if cap.vision is None or cap.resolve_part(part) == "vision":  # a vision tower: its prefix is [CLS], registers
        return []
    after = grid.n_prefix + grid.n_patches
    return list(range(grid.n_prefix)) + list(range(after, after + len(grid.suffix)))


def _text_query(cap: Capture, query: int | str | tuple[int, int], part: str | None) -> int:
    """The query's token: through the picture's grid where the part has one, else a token index."""
    grid = cap.image_of(part)
    if grid is not None:
        return grid.token(query)
    n = len(cap.sequences(part)[0].tokens)
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < n:
        raise OutOfRangeError(f"query {query!r} is not a token of the {cap.resolve_part(part)} part: 0..{n - 1}")
    return query


def text_row(
    cap: Capture,
    layer: int,
    head: int | None = None,
    *,
    query: int | str | tuple[int, int],
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
) -> tuple[list[int], Tensor, float]:  # (positions, [len(positions)] weights, the share on the picture)
    """The query's row (one head, or the heads' mean; the AttentionLab's switches as in :func:`patch_row`)
    over the tokens off the picture (:func:`text_positions`): the positions, the weights on them, and the
    share of the row the picture's tokens take (0 for a text part). A VLM's ``query`` may be a token
    index, a label or a patch's ``(row, col)``; a text part's is a token index."""
    positions = text_positions(cap, part)
    if not positions:
        raise InputError(
            f"the {cap.resolve_part(part)} part has no text: its tokens are the picture's; draw it with image_attention"
        )
    q = _text_query(cap, query, part)
    row = _row(cap, layer, head, q, part, causal, scale, temperature)
    values = row[positions]
    return positions, values, float(row.sum() - values.sum())


@themed
def text_attention(
    cap: Capture,
    layer: int,
    head: int | None = None,
    *,
    query: int | str | tuple[int, int],
    part: str | None = None,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
) -> go.Figure:
    """The query's row over the text (:func:`text_row`) as bars, one per text token in order, the
    query's own bar in red: the other half of :func:`image_attention`'s picture for a vision-language
    capture (the title says the share on the picture), or a text tower's row over its words."""
    positions, values, on_picture = text_row(
        cap, layer, head, query=query, part=part, causal=causal, scale=scale, temperature=temperature
    )
    grid = cap.image_of(part)
    q = _text_query(cap, query, part)
    names = cap.sequences(part)[1].token_labels
    shown = [names[i] for i in positions]
    who = "heads' mean" if head is None else f"H{head}"
    fig = go.Figure(
        go.Bar(
            x=list(range(len(positions))),
            y=values.tolist(),
            marker_color=["#d62728" if i == q else "#1f77b4" for i in positions],
            customdata=[[name, i] for name, i in zip(shown, positions, strict=True)],
            hovertemplate="%{customdata[0]} (token %{customdata[1]}): %{y:.4f}<extra></extra>",
        )
    )
    title = f"L{layer}·{who}: where {cap.sequences(part)[0].token_labels[q]!r} attends over the text"
    if grid is not None:
        title += f" — {on_picture:.0%} on the picture"
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10), yaxis_title="weight", bargap=0.15)
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(positions))), ticktext=shown, tickangle=-45)
    return fig


def _traces(grid: ImageGrid, values: Tensor, *, opacity: float, showscale: bool, name: str) -> list:
    """The picture, and ``values`` ``[rows, cols]`` as a heatmap whose cell (r, c) covers exactly the
    pixels of patch (r, c): a picture's pixel (y, x) is centred at (x, y), so a cell's centre is the
    centre of its ``ph × pw`` block. The colours run from the map's smallest value to its largest."""
    (ph, pw), (rows, cols) = grid.patch, grid.grid
    cells = [[f"({r},{c})" for c in range(cols)] for r in range(rows)]
    return [
        go.Image(z=grid.pixels.numpy(), hoverinfo="skip"),
        go.Heatmap(
            z=values.tolist(),
            x0=(pw - 1) / 2,
            dx=pw,
            y0=(ph - 1) / 2,
            dy=ph,
            zmin=float(values.min()),
            zmax=max(float(values.max()), float(values.min()) + 1e-12),
            opacity=opacity,
            colorscale=IMAGE_COLOURS,
            showscale=showscale,
            text=cells,
            hovertemplate=f"patch %{{text}}<br>{name}: %{{z:.3f}}<extra></extra>",
        ),
    ]


def _query_name(cap: Capture, grid: ImageGrid, q: int, part: str | None) -> str:
    """How a title names the query: a patch or ``[CLS]`` by its label, a word of a vision-language
    model's text as the page reads it, quoted (``'cat'``, not the tokenizer's ``Ġcat``)."""
    if grid.position(q) is None and q in text_positions(cap, part):
        return repr(cap.sequences(part)[0].token_labels[q])
    return grid.labels[q]


def _query_box(grid: ImageGrid, q: int) -> dict | None:
    box = grid.box(q)
    if box is None:
        return None
    x0, y0, x1, y1 = box
    return dict(type="rect", x0=x0 - 0.5, y0=y0 - 0.5, x1=x1 - 0.5, y1=y1 - 0.5, line=dict(color="#00e5ff", width=2))


@themed
def image_attention(
    cap: Capture,
    layer: int,
    head: int | None = None,
    *,
    query: int | str | tuple[int, int] | None = None,
    part: str | None = None,
    opacity: float = 0.6,
    causal: bool | None = None,
    scale: bool | float = True,
    temperature: float = 1.0,
) -> go.Figure:
    """One query's attention row drawn over the picture: ``head`` (None: the heads' mean) at ``layer``;
    ``query`` an index, a label (``"[CLS]"``, ``"(2,3)"``) or a ``(row, col)`` (default: ``[CLS]``, or
    the centre patch where there is none). A query patch is outlined. ``causal``, ``scale``,
    ``temperature``: the AttentionLab's switches (the title says which are not the model's own)."""
    grid = image_grid(cap, part)
    q = query_of(grid, query)
    values, prefix = patch_row(
        cap, layer, head, query=q, part=part, causal=causal, scale=scale, temperature=temperature
    )
    who = "heads' mean" if head is None else f"H{head}"
    fig = go.Figure(_traces(grid, values, opacity=opacity, showscale=True, name="weight"))
    box = _query_box(grid, q)
    if box is not None:
        fig.add_shape(**box)
    title = f"L{layer}·{who}: where {_query_name(cap, grid, q, part)} attends"
    switched = [
        text
        for text, on in (
            ("causal mask", causal is True),
            ("no mask", causal is False),
            ("no ÷√d_k" if scale is False else f"scale {scale}", scale is not True),
            (f"temperature {temperature:g}", temperature != 1.0),
        )
        if on
    ]
    if switched:
        title += f" ({', '.join(switched)})"
    if text_positions(cap, part):  # a vision-language capture: the rest of the row is over the text
        title += f" — {prefix:.0%} on the text (not drawn)"
    elif grid.n_prefix:
        title += f" — {prefix:.0%} on {', '.join(grid.prefix)} (not drawn)"
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x")
    return fig


@themed
def image_heads(
    cap: Capture,
    layer: int,
    *,
    query: int | str | tuple[int, int] | None = None,
    part: str | None = None,
    columns: int | None = None,
    opacity: float = 0.7,
) -> go.Figure:
    """Every head of ``layer`` as a thumbnail: the query's row over the picture, each head on its own
    scale (its smallest to its largest patch weight), as in DINO's figures of heads that segment the object."""
    from plotly.subplots import make_subplots  # deferred: only the thumbnails need subplots

    grid = image_grid(cap, part)
    q = query_of(grid, query)
    numbers = cap.layer(layer, part).head_numbers  # the model's heads kept (capture(heads=)), in order
    n_heads = len(numbers)
    cols = columns or min(n_heads, 4)
    if cols < 1:
        raise OutOfRangeError(f"columns must be ≥ 1, got {columns}")
    rows = math.ceil(n_heads / cols)
    titles = []
    grids = []
    for h in numbers:
        values, prefix = patch_row(cap, layer, h, query=q, part=part)
        grids.append(values)
        off = "text" if text_positions(cap, part) else "prefix"  # what the tokens off the picture are
        titles.append(f"H{h}" + (f" · {off} {prefix:.0%}" if grid.n_prefix or grid.suffix else ""))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.06)
    box = _query_box(grid, q)
    for h, values in enumerate(grids):
        r, c = divmod(h, cols)
        for trace in _traces(grid, values, opacity=opacity, showscale=False, name=f"H{numbers[h]}"):
            fig.add_trace(trace, row=r + 1, col=c + 1)
        if box is not None:
            fig.add_shape(**box, row=r + 1, col=c + 1)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    for i in range(1, n_heads + 1):
        fig.update_yaxes(scaleanchor=f"x{i if i > 1 else ''}", row=(i - 1) // cols + 1, col=(i - 1) % cols + 1)
    fig.update_layout(
        title=f"L{layer}: where {_query_name(cap, grid, q, part)} attends, per head",
        height=220 * rows + 60,
        margin=dict(t=70),
    )
    return fig


@themed
def image_rollout(
    cap: Capture,
    *,
    query: int | str | tuple[int, int] | None = None,
    layer: int = -1,
    residual: float = 0.5,
    head_fusion: str = "mean",
    opacity: float = 0.6,
    part: str | None = None,
) -> go.Figure:
    """Attention rollout (:func:`attnviz.analysis.rollout`, heads fused by ``head_fusion``, the
    residual mixed in, multiplied through the layers up to ``layer``) of ``query`` over the picture
    (``part``: of a capture of two towers, which one)."""
    grid = image_grid(cap, part)
    q = query_of(grid, query)
    flow = rollout(cap, residual=residual, head_fusion=head_fusion, part=part)
    if not -len(flow) <= layer < len(flow):
        raise OutOfRangeError(f"layer {layer} is out of range: the rollout has layers 0..{len(flow) - 1}")
    row = flow[layer][q].float()
    values = grid.patch_values(row)
    shown = layer % len(flow)
    fig = go.Figure(_traces(grid, values, opacity=opacity, showscale=True, name="rollout"))
    box = _query_box(grid, q)
    if box is not None:
        fig.add_shape(**box)
    title = f"rollout to L{shown} of {_query_name(cap, grid, q, part)} (heads {head_fusion}, residual {residual})"
    if text_positions(cap, part):  # a vision-language capture: the rest of the flow is on the text
        title += f" — {float(row.sum() - values.sum()):.0%} on the text (not drawn)"
    elif grid.n_prefix:
        title += f" — {float(row[: grid.n_prefix].sum()):.0%} on {', '.join(grid.prefix)} (not drawn)"
    fig.update_layout(title=title, margin=dict(l=10, r=10, t=50, b=10))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x")
    return fig
