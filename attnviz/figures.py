"""Plotly figures of a Capture: the public face of :mod:`attnviz.views`.

Every figure takes a :class:`~attnviz.Capture` (or a validation report, a table) and plain
selections, and returns a ``plotly.graph_objects.Figure``; the same functions draw the notebooks'
pictures and the dashboard's. Layers and heads are 0-based and labelled ``L3·H8``.
"""

from .views.figures import (
    HEAD_COLOURS,
    MASKED_COLOUR,
    MAX_LABELS,
    above_top_axis,
    compare_heads,
    comparison,
    head_view,
    heatmap,
    importance_map,
    labels,
    model_view,
    model_view_cell,
    prediction_bars,
    query_row,
    row_stats,
    strongest,
    thumb_size,
    to_html,
    validation_map,
)

__all__ = [
    "HEAD_COLOURS",
    "MASKED_COLOUR",
    "MAX_LABELS",
    "above_top_axis",
    "compare_heads",
    "comparison",
    "head_view",
    "heatmap",
    "importance_map",
    "labels",
    "model_view",
    "model_view_cell",
    "prediction_bars",
    "query_row",
    "row_stats",
    "strongest",
    "thumb_size",
    "to_html",
    "validation_map",
]
