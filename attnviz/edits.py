"""Counterfactual attention edits, the public face of :mod:`attnviz.workflows.edits` (what an edit
is, and :func:`plan`) and :mod:`attnviz.engine.editor` (:func:`editing`).

>>> from attnviz import edits
>>> out = attnviz.intervene("smollm2", "我家的小猫很可爱，它很", [edits.knockout(layer=15, head=3, query="它", key="小猫")])

An edit names what to change and where (layers, heads, part); :func:`attnviz.workflows.intervene` runs the
model with it. :func:`plan` resolves edits against a capture into one :class:`LayerPlan` per layer,
and :func:`editing` runs a model with such plans for the length of a ``with`` block.
"""

from .engine.editor import editing
from .workflows.edits import (
    Edit,
    LayerPlan,
    ablate,
    knockout,
    no_causal_mask,
    no_scaling,
    patch,
    plan,
    scale,
    temperature,
    uniform,
)

__all__ = [
    "Edit",
    "LayerPlan",
    "ablate",
    "editing",
    "knockout",
    "no_causal_mask",
    "no_scaling",
    "patch",
    "plan",
    "scale",
    "temperature",
    "uniform",
]
