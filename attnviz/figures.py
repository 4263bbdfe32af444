"""Plotly figures of a Capture: the public face of :mod:`attnviz.views`.

Every figure takes a :class:`~attnviz.Capture` (or a validation report, a table, an analysis'
result) and plain selections, and returns a ``plotly.graph_objects.Figure``; the same functions draw
the notebooks' pictures and the dashboard's. Layers and heads are 0-based and labelled ``L3·H8``.
Figures with token axes take ``mark_new=True``: a capture from :func:`attnviz.generate` has its
generated tokens marked ``▸`` (:mod:`attnviz.views.marks`). Files: :func:`to_html` (a page that opens
offline) and :func:`write_image` (PNG, SVG, PDF through kaleido, the CJK labels drawn without a CJK font).
Images: a query's row over the picture (:func:`image_attention`, :func:`patch_row`), every head
(:func:`image_heads`), the rollout (:func:`image_rollout`); a vision-language model's word beside it over
the text (:func:`text_attention`, :func:`text_row`, :func:`text_positions`).
"""

from .views.atlas import ROLE_COLOURS, atlas_page, head_atlas
from .views.common import HEAD_COLOURS, MASKED_COLOUR, above_top_axis, labels, message_figure, short_label
from .views.compare import compare_heads, comparison
from .views.export import to_image, write_image
from .views.generation import step_figure, step_summary
from .views.head_view import MAX_LABELS, head_view, strongest
from .views.html import html_page, to_html
from .views.image import (
    IMAGE_COLOURS,
    image_attention,
    image_heads,
    image_rollout,
    patch_row,
    text_attention,
    text_positions,
    text_row,
)
from .views.maps import heatmap, query_row, row_stats
from .views.marks import MARK, NEW_COLOUR, marked, new_start
from .views.model_view import MODEL_VIEW_CELLS, model_view, model_view_cell, model_view_thumbnails, thumb_size
from .views.overview import overview_figure, window_figure
from .views.plots import coref_bars, head_map, probe_accuracy_map, probe_intervals, rollout_figure
from .views.reports import importance_map, prediction_bars, validation_map
from .views.space import SPACE_COLOURS, qk_space_figure

__all__ = [
    "HEAD_COLOURS",
    "IMAGE_COLOURS",
    "MARK",
    "MASKED_COLOUR",
    "MAX_LABELS",
    "MODEL_VIEW_CELLS",
    "NEW_COLOUR",
    "ROLE_COLOURS",
    "SPACE_COLOURS",
    "above_top_axis",
    "atlas_page",
    "compare_heads",
    "comparison",
    "coref_bars",
    "head_atlas",
    "head_map",
    "head_view",
    "heatmap",
    "html_page",
    "image_attention",
    "image_heads",
    "image_rollout",
    "importance_map",
    "labels",
    "marked",
    "message_figure",
    "model_view",
    "model_view_cell",
    "model_view_thumbnails",
    "new_start",
    "overview_figure",
    "patch_row",
    "prediction_bars",
    "probe_accuracy_map",
    "probe_intervals",
    "qk_space_figure",
    "query_row",
    "rollout_figure",
    "row_stats",
    "short_label",
    "step_figure",
    "step_summary",
    "strongest",
    "text_attention",
    "text_positions",
    "text_row",
    "thumb_size",
    "to_html",
    "to_image",
    "validation_map",
    "window_figure",
    "write_image",
]
