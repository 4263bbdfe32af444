"""What the figures are made with, for code that places or extends them (the dashboard, a notebook's own
figure): axis labels, new-token marks, the model view's thumbnails and cells, a row's statistics, the
picture's and the text's rows as numbers, and the figures' colours and limits. Nothing here returns a
figure: those are in :mod:`attnviz.figures`.

For one release these names are also reached as ``attnviz.figures.<name>``, with a ``DeprecationWarning``.
"""

from ..views.atlas import ROLE_COLOURS
from ..views.common import HEAD_COLOURS, MASKED_COLOUR, above_top_axis, labels, short_label
from ..views.generation import step_summary
from ..views.head_view import MAX_LABELS, strongest
from ..views.image import IMAGE_COLOURS, patch_row, text_positions, text_row
from ..views.maps import row_stats
from ..views.marks import MARK, NEW_COLOUR, marked, new_start
from ..views.model_view import MODEL_VIEW_CELLS, model_view_cell, model_view_thumbnails, thumb_size
from ..views.space import SPACE_COLOURS

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
    "labels",
    "marked",
    "model_view_cell",
    "model_view_thumbnails",
    "new_start",
    "patch_row",
    "row_stats",
    "short_label",
    "step_summary",
    "strongest",
    "text_positions",
    "text_row",
    "thumb_size",
]
