"""What each head moves, added to a capture's records while the model is at hand.

For every record whose attention module has an output projection
(:func:`attnviz.engine.projections.output_projection`), the dot products of the vectors
``f_h(x_j) = W_O^h v_j`` its keys' words need (``LayerRecord.value_dots``: O(head · key · longest
word)), and — unless the check is off — the proof that they are the right vectors: over the rows
of the projection's output the taps kept, ``Σ_h W_O^h o_ih + b`` (the heads' outputs through the
same head slices the norms are made of) against the model's own projection output
(``LayerRecord.projection_check``, reported by :func:`attnviz.data.validate.validate`; see
:func:`projection_errors` for why, with the output line, that proves ``Σ_h Σ_j α_ij f_h(x_j) + b``).
"""

from __future__ import annotations

import torch
from torch import nn

from ...data.capture import Capture
from ...data.records import LayerRecord
from ...engine.projections import OutputProjection, ProjectionWatch, output_projection

__all__ = ["add_value_terms", "check_projection", "projection_errors"]


def projection_errors(rec: LayerRecord, projection: OutputProjection, rows: torch.Tensor, model_out: torch.Tensor):
    """``(max |error|, a bound on the size of the terms summed)`` of ``Σ_h W_O^h o_ih + b`` against the model's
    projection output ``model_out [r, hidden]`` at query ``rows``.

    ``o_ih`` is the kernel's own output for head *h* (the record's ``out``), which the self-check's
    output line proves equal to attnviz's ``Σ_j α_ij v_j`` (GQA's value sharing included): the two
    lines together prove ``Σ_h Σ_j α_ij f_h(x_j) + b`` is what the projection computed, and this one
    proves the head slices, their order and that nothing sits between the kernel and the projection."""
    assert rec.out is not None  # a record the taps just made holds the kernel's output
    per_head = rec.out[:, rows.to(rec.out.device)].float()
    ours = projection.apply(per_head)
    error = (ours - model_out.to(ours.device, torch.float32)).abs().max()
    return float(error), projection.magnitude(per_head)


def add_value_terms(
    model: nn.Module,
    made: list[Capture],
    watch: ProjectionWatch | None,
    check: str,
    *,
    only: set[tuple[str, int]] | None = None,
    item: int = 0,
) -> None:
    """Fill ``value_dots`` (and, unless ``check == "off"``, ``projection_check``) of each capture's
    records (``only``: of these (part, layer) alone); item ``item + b`` of the batch is ``made[b]``."""
    projections: dict[str, OutputProjection | None] = {}
    for b, cap in enumerate(made, start=item):
        widths = {  # the longest word of each part's keys, in tokens
            part: max((w.token_stop - w.token_start for w in cap.sequences(part)[1].words), default=1)
            for part in cap.parts
        }
        for (part, layer), rec in cap.records.items():
            if only is not None and (part, layer) not in only:
                continue
            n_heads = rec.q.shape[0]
            if rec.name not in projections:
                projections[rec.name] = output_projection(model, rec.name, n_heads, rec.v.shape[-1])
            projection = projections[rec.name]
            if projection is None:
                continue
            rec.value_dots = projection.value_dots(rec.v, widths[part])
            if watch is not None and check != "off":
                check_projection(rec, layer, projection, watch, b)


def check_projection(
    rec: LayerRecord, layer: int, projection: OutputProjection, watch: ProjectionWatch, b: int
) -> None:
    """Set ``rec.projection_check`` from the rows of item ``b`` the taps kept of ``layer``'s projection
    output that fall in the record (a padded batch's item keeps fewer), if any."""
    seen = watch.rows(rec.name, layer)
    if seen is None:
        return
    positions, outputs = seen
    real = positions < rec.n_queries  # positions: on the host
    if not bool(real.any()):
        return
    picked = torch.nonzero(real).flatten()
    error, size = projection_errors(
        rec, projection, positions[picked], outputs[b].index_select(-2, picked.to(outputs.device))
    )
    rec.projection_check = torch.tensor([error, size, float(len(picked))])
