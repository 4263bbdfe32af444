"""The model view: every layer × head of a capture as a thumbnail of its map, in one mosaic."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import torch

from ..analysis.overview import MODEL_VIEW_CELLS, check_measure
from ..analysis.overview import thumbnails as pool_layer
from ..deprecation import renamed
from .common import labels, measure_map, measure_symbol, themed
from .marks import boundary, marked_title, new_starts

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["MODEL_VIEW_CELLS", "model_view", "model_view_cell", "model_view_thumbnails", "thumb_size"]


def thumb_size(cap: Capture, words: bool, cells: int, part: str | None = None) -> tuple[int, int]:
    """(query rows, key columns) of a model-view thumbnail of at most ``cells`` per side."""
    return (min(len(labels(cap, words, part, "query")), cells), min(len(labels(cap, words, part, "key")), cells))


def model_view_cell(
    cap: Capture, x: float, y: float, *, words: bool = False, cells: int = MODEL_VIEW_CELLS, part: str | None = None
) -> tuple[int, int] | None:
    """The (layer, head) under the point (x, y) of :func:`model_view`'s mosaic, None on a gap."""
    t_q, t_k = thumb_size(cap, words, cells, part)
    row, col = int(round(y)) // (t_q + 1), int(round(x)) // (t_k + 1)
    layers, heads = cap.layer_indices(part), cap.kept_heads(part)  # columns: the heads kept, by the model's numbers
    if not (0 <= row < len(layers) and 0 <= col < len(heads)):
        return None
    return layers[row], heads[col]


def model_view_thumbnails(
    cap: Capture,
    *,
    words: bool = False,
    cells: int = MODEL_VIEW_CELLS,
    part: str | None = None,
    layers: Sequence[int] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    measure: str = "weights",
    on_layer: Callable[[int, int], None] | None = None,
) -> dict[int, torch.Tensor]:
    """What :func:`model_view` draws: ``{layer: [head, t_q, t_k]}``, each head's map max-pooled to
    :func:`thumb_size` (the map itself when it fits), for ``layers`` (default: every captured layer).
    Token maps are pooled a chunk of query rows at a time (:func:`attnviz.analysis.overview.thumbnails`);
    word maps are merged whole, a layer at a time. ``on_progress(done, total)`` is called after each
    layer (``on_layer=``: its old name, deprecated); an exception it raises stops the pooling. ``measure="moved"``: what each head moves,
    α_ij·‖f_h(x_j)‖ (:meth:`Capture.moved`), max-pooled the same way — a cell is the largest
    amount any of its (query, key) pairs moves."""
    on_progress = renamed("model_view_thumbnails", "on_layer", on_layer, "on_progress", on_progress)
    check_measure(measure)
    layers = cap.layer_indices(part) if layers is None else list(layers)
    n_q, n_k = len(labels(cap, words, part, "query")), len(labels(cap, words, part, "key"))
    t_q, t_k = thumb_size(cap, words, cells, part)
    pooled = {}
    for done, layer in enumerate(layers, 1):
        if n_q == t_q and n_k == t_k:
            pooled[layer] = measure_map(cap, layer, None, measure, part=part, words=words)  # [head, q, k]
        elif words:
            w = measure_map(cap, layer, None, measure, part=part, words=True)
            pooled[layer] = torch.nn.functional.adaptive_max_pool2d(w[None], (t_q, t_k))[0]
        else:
            pooled[layer] = pool_layer(cap, layer, (t_q, t_k), part=part, measure=measure).cpu()
        if on_progress is not None:
            on_progress(done, len(layers))
    return pooled


@themed
def model_view(
    cap: Capture,
    *,
    words: bool = False,
    cells: int = MODEL_VIEW_CELLS,
    selected: tuple[int, int] | None = None,
    part: str | None = None,
    mark_new: bool = True,
    thumbnails: dict[int, torch.Tensor] | None = None,
    measure: str = "weights",
) -> go.Figure:
    """All layers × heads as thumbnails in one mosaic (each pattern max-pooled to ``cells``²).

    Token thumbnails are pooled a chunk of query rows at a time
    (:func:`attnviz.analysis.overview.thumbnails`): no layer's n×n maps exist whole, whatever the
    length (word thumbnails merge the full maps). Hover names the head; :func:`model_view_cell` maps a
    clicked point back to (layer, head). ``mark_new``: a generation's prompt boundary drawn in every
    thumbnail, where it falls (:mod:`attnviz.views.marks`). ``thumbnails``: precomputed thumbnails
    ``{layer: [head, t_q, t_k]}`` — :func:`attnviz.analysis.summarize`'s (tokens) or
    :func:`model_view_thumbnails`' (tokens or words, as ``words`` says, and of this ``measure``) — used
    for each layer whose thumbnail has this figure's size; the others are computed here.

    ``measure="moved"``: the thumbnails of what each head moves, α_ij·‖f_h(x_j)‖, max-pooled; they
    share one colour scale from 0 to the largest cell of the mosaic (shown, titled "‖α·f(x)‖"), where
    the weights' scale is 0..1.
    """
    moved = check_measure(measure) == "moved"
    layers = cap.layer_indices(part)
    kept = cap.kept_heads(part)  # one column per head kept (capture(heads=)), labelled by the model's number
    h = len(kept)
    n_q, n_k = len(labels(cap, words, part, "query")), len(labels(cap, words, part, "key"))
    t_q, t_k = thumb_size(cap, words, cells, part)
    size_r, size_c = len(layers) * (t_q + 1) - 1, h * (t_k + 1) - 1
    z = torch.full((size_r, size_c), float("nan"))
    given = thumbnails or {}
    stacked = {layer: cap.layer(layer, part).head_numbers for layer in layers}  # each layer's stack, in order
    missing = [
        layer for layer in layers if tuple(getattr(given.get(layer), "shape", ())) != (len(stacked[layer]), t_q, t_k)
    ]
    if missing:  # computed here: every layer not given at this figure's size
        given = {
            **given,
            **model_view_thumbnails(cap, words=words, cells=cells, part=part, layers=missing, measure=measure),
        }
    for r, layer in enumerate(layers):
        pooled = given[layer].cpu()
        for i, number in enumerate(stacked[layer]):
            c = kept.index(number)
            z[r * (t_q + 1) : r * (t_q + 1) + t_q, c * (t_k + 1) : c * (t_k + 1) + t_k] = pooled[i]
    # hover ids: [layer, head] of the thumbnail under each cell (gaps carry the neighbour's, never shown)
    row_layer = np.array(layers)[np.minimum(np.arange(size_r) // (t_q + 1), len(layers) - 1)]
    col_head = np.array(kept)[np.minimum(np.arange(size_c) // (t_k + 1), h - 1)]
    ids = np.stack(np.broadcast_arrays(row_layer[:, None], col_head[None, :]), axis=-1)
    top = float(z.nan_to_num(0).max()) if moved else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z.numpy().round(3) if not moved else z.numpy(),  # float32: moved has no fixed scale to round to
            colorscale="Blues",
            zmin=0,
            zmax=max(top, 1e-6),
            showscale=moved,
            colorbar=dict(title=measure_symbol(measure)),
            customdata=ids,
            hovertemplate="L%{customdata[0]}·H%{customdata[1]}"
            + ("<br>max ‖α·f(x)‖ %{z:.4g}" if moved else "")
            + "<extra></extra>",
            xgap=0,
            ygap=0,
        )
    )
    q_new, k_new = new_starts(cap, part, words, mark_new)
    fig.update_layout(
        title=marked_title(
            f"Model view{': ' + cap.resolve_part(part) if len(cap.parts) > 1 else ''}: {len(layers)} layers × {h} "
            + ("heads" if h == cap.info(part)["n_heads"] else f"heads kept ({', '.join(f'H{n}' for n in kept)})")
            + (", moved (‖α·f(x)‖, max of each cell) " if moved else " ")
            + "(click a head to select it)",
            q_new,
            k_new,
        ),
        xaxis=dict(
            tickmode="array",
            tickvals=[k * (t_k + 1) + t_k / 2 for k in range(h)],
            ticktext=[f"H{k}" for k in kept],  # the model's numbers
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
    # the prompt boundary in every thumbnail (pooled: where it falls): a line per row of layers, one per column of heads
    if q_new is not None:
        for r in range(len(layers)):
            y = r * (t_q + 1) + q_new * t_q / n_q - 0.5
            fig.add_shape(boundary(y=y, span=(-0.5, size_c - 0.5), width=1))
    if k_new is not None:
        for k in range(h):
            fig.add_shape(boundary(x=k * (t_k + 1) + k_new * t_k / n_k - 0.5, span=(-0.5, size_r - 0.5), width=1))
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
