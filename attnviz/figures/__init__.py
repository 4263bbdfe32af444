"""Plotly figures of a Capture: the public face of :mod:`attnviz.views`.

Every figure takes a :class:`~attnviz.Capture` (or a validation report, a table, an analysis'
result) and plain selections, and returns a ``plotly.graph_objects.Figure``; the same functions draw
the notebooks' pictures and the dashboard's. Layers and heads are 0-based and labelled ``L3·H8``.
Figures with token axes take ``mark_new=True``: a capture from :func:`attnviz.generate` has its
generated tokens marked ``▸`` (:mod:`attnviz.views.marks`). Files: :func:`to_html` (a page that opens
offline), :func:`write_image` (PNG, SVG, PDF through kaleido, the CJK labels drawn without a CJK font) and
:func:`report` (a whole capture as one offline page, its layer, head, units and query chosen in the page).
Images: a query's row over the picture (:func:`image_attention`), every head (:func:`image_heads`), the
rollout (:func:`image_rollout`); a vision-language model's word beside it over the text
(:func:`text_attention`). Two heads side by side: :func:`compare_heads`; the model's own numbers beside
attnviz's: :func:`validation_comparison`; the head atlas' table as a map: :func:`atlas_map`;
heads over training (:func:`attnviz.head_timeline`): :func:`timeline_map`, :func:`timeline_lines`.

This module exports figures (and the files made of them) only. What they are made with — labels,
marks, colours, the rows as numbers — is in :mod:`attnviz.figures.helpers`.
"""

from ..deprecation import warn_renamed
from ..views.atlas import atlas_map, atlas_page
from ..views.common import message_figure
from ..views.compare import compare_heads, validation_comparison
from ..views.export import to_image, write_image
from ..views.generation import step_figure
from ..views.head_view import head_view
from ..views.html import html_page, to_html
from ..views.image import image_attention, image_heads, image_rollout, text_attention
from ..views.maps import heatmap, query_row
from ..views.model_view import model_view
from ..views.overview import overview_figure, window_figure
from ..views.plots import coref_bars, head_map, probe_accuracy_map, probe_intervals, rollout_figure
from ..views.report_page import report
from ..views.reports import attribution_bars, importance_map, prediction_bars, validation_map
from ..views.space import qk_space_figure
from ..views.timeline import timeline_lines, timeline_map
from . import helpers

__all__ = [
    "atlas_map",
    "atlas_page",
    "attribution_bars",
    "compare_heads",
    "coref_bars",
    "head_map",
    "head_view",
    "heatmap",
    "html_page",
    "image_attention",
    "image_heads",
    "image_rollout",
    "importance_map",
    "message_figure",
    "model_view",
    "overview_figure",
    "prediction_bars",
    "probe_accuracy_map",
    "probe_intervals",
    "qk_space_figure",
    "query_row",
    "report",
    "rollout_figure",
    "step_figure",
    "text_attention",
    "timeline_lines",
    "timeline_map",
    "to_html",
    "to_image",
    "validation_comparison",
    "validation_map",
    "window_figure",
    "write_image",
]

#: the figures' old names, kept one release: old name → new name
RENAMED = {"head_atlas": "atlas_map", "comparison": "validation_comparison"}


def __getattr__(name: str) -> object:
    """The old names: a renamed figure, or a helper that used to sit beside the figures (each use warns,
    naming where it lives now: :func:`attnviz.deprecation.warn_renamed`)."""
    if name in RENAMED:
        warn_renamed(f"attnviz.figures.{name}", f"attnviz.figures.{RENAMED[name]}")
        return globals()[RENAMED[name]]
    if name in helpers.__all__:
        warn_renamed(f"attnviz.figures.{name}", f"attnviz.figures.helpers.{name}")
        return getattr(helpers, name)
    raise AttributeError(f"module 'attnviz.figures' has no attribute {name!r}")
