"""What each head moves, added to a capture's records while the model is at hand.

For every record whose attention module has an output projection
(:func:`attnviz.engine.projections.output_projection`), the dot products of the vectors
``f_h(x_j) = W_O^h v_j`` its keys' words need (``LayerRecord.value_dots``: O(head · key · longest
word)), and — unless the check is off — the proof that they are the right vectors: over the rows
of the projection's output the taps kept, ``Σ_h Σ_j α_ij f_h(x_j) + b`` (attnviz's own weights,
the value each head reads, the head's slice of the weight) against the model's own projection
output (``LayerRecord.projection_check``, reported by :func:`attnviz.data.validate.validate`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import attention_output
from ..data.capture import Capture
from ..data.records import LayerRecord
from ..engine.projections import OutputProjection, ProjectionWatch, output_projection

__all__ = ["add_value_terms", "projection_errors"]


def projection_errors(rec: LayerRecord, projection: OutputProjection, rows: torch.Tensor, model_out: torch.Tensor):
    """``(max |error|, max size of the terms summed)`` of ``Σ_h Σ_j α_ij f_h(x_j) + b`` against the
    model's projection output ``model_out [r, hidden]`` at query ``rows``."""
    value = OutputProjection.per_head(rec.v, projection.n_heads)
    moved = []
    for _rows, keys, _, weights in attention_output(
        rec.q, rec.k, rec.v[..., :0], rows=rows, all_keys=True, **rec.sdpa_arguments()
    ):
        moved.append(torch.einsum("hrk,hkd->hrd", weights.double(), value[:, keys].to(weights.device).double()))
    per_head = torch.cat(moved, dim=1)
    ours = projection.apply(per_head)
    error = (ours - model_out.to(ours.device, torch.float64)).abs().max()
    return float(error), float(projection.magnitude(per_head).max())


def add_value_terms(model: nn.Module, made: list[Capture], watch: ProjectionWatch | None, check: str) -> None:
    """Fill ``value_dots`` (and, unless ``check == "off"``, ``projection_check``) of each capture's
    records; item ``b`` of the batch is ``made[b]``."""
    projections: dict[str, OutputProjection | None] = {}
    for b, cap in enumerate(made):
        for (part, _), rec in cap.records.items():
            n_heads = rec.q.shape[0]
            if rec.name not in projections:
                projections[rec.name] = output_projection(model, rec.name, n_heads, rec.v.shape[-1])
            projection = projections[rec.name]
            if projection is None:
                continue
            keys = cap.sequences(part)[1]
            width = max((w.token_stop - w.token_start for w in keys.words), default=1)
            rec.value_dots = projection.value_dots(rec.v, width)
            seen = None if watch is None or check == "off" else watch.rows(rec.name)
            if seen is None:
                continue
            positions, outputs = seen
            real = positions < rec.n_queries
            if not bool(real.any()):
                continue
            error, size = projection_errors(rec, projection, positions[real], outputs[b][real])
            rec.projection_check = torch.tensor([error, size, float(real.sum())])
