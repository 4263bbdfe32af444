"""bertviz and CircuitsVis: the conversions moved to :mod:`attnviz.data.interop` (they draw nothing; the
data model's ``Capture.to_bertviz`` / ``to_circuitsvis`` call them). This module keeps the old import path."""

from ..data.interop import to_bertviz, to_circuitsvis

__all__ = ["to_bertviz", "to_circuitsvis"]
