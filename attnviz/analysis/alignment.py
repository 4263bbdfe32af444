"""Which head of one model is which head of another: similarity of their patterns, and a matching.

Two models of the same shape (a base and its fine-tune, two seeds, two checkpoints of a run) read the same
texts; a head of one and a head of the other are alike when their attention rows are: :func:`row_similarity`
sums, over every query row of a text, ``1 − JSD`` (the Jensen–Shannon divergence of the two rows in bits, in
[0, 1]) or the rows' cosine, for every pair of heads. :func:`match_heads` pairs the heads one to one with the
largest total similarity (the Hungarian method, ``scipy.optimize.linear_sum_assignment``) within each layer, or
over every head of the model. :class:`HeadAlignment` holds the similarity, the matching, and each pair's roles
and status. :func:`attnviz.align_heads` runs the models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MEASURES", "STATUSES", "HeadAlignment", "match_heads", "row_similarity"]

#: how two attention rows are compared: 1 − their Jensen–Shannon divergence (bits), or their cosine
MEASURES = ("js", "cosine")
#: a matched pair's status: same roles, other roles, or a similarity below the threshold
STATUSES = ("kept", "changed", "no match")


def row_similarity(
    a: Tensor,  # [head_a, query_pos, key_pos]: one text's attention in one layer of model A
    b: Tensor,  # [head_b, query_pos, key_pos]: the same text's in a layer of model B
    measure: str = "js",
) -> Tensor:  # [head_a, head_b]: the similarity summed over the query rows, float64
    """The similarity of every head of ``a`` with every head of ``b``, summed over the rows (divide by the
    number of rows for the mean): ``1 − JSD(p, q)`` with JSD in bits (1 for equal rows, 0 for rows on disjoint
    keys), or ``p·q / (‖p‖‖q‖)``."""
    if measure not in MEASURES:
        raise InputError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if a.shape[1:] != b.shape[1:]:
        raise InputError(f"the two texts' maps differ in shape: {tuple(a.shape[1:])} and {tuple(b.shape[1:])}")
    p = a.double()[:, None]  # [head_a, 1, q, k]
    q = b.double()[None]  # [1, head_b, q, k]
    if measure == "cosine":
        dots = torch.einsum("aqk,bqk->abq", a.double(), b.double())
        norms = a.double().norm(dim=-1)[:, None] * b.double().norm(dim=-1)[None]
        return (dots / norms.clamp_min(1e-300)).sum(-1)
    m = (p + q) / 2

    def kl(x: Tensor) -> Tensor:  # Σ x log2(x / m), 0 where x is 0
        return torch.where(x > 0, x * (torch.log2(x.clamp_min(1e-300)) - torch.log2(m.clamp_min(1e-300))), 0.0).sum(-1)

    jsd = (0.5 * kl(p) + 0.5 * kl(q)).clamp(0.0, 1.0)  # [head_a, head_b, q]
    return (1.0 - jsd).sum(-1)


def match_heads(similarity: np.ndarray) -> list[tuple[int, int, float]]:
    """One-to-one pairs ``(row, column, similarity)`` of a ``[n_a, n_b]`` similarity matrix with the largest
    total similarity (``linear_sum_assignment`` maximising), in row order."""
    from scipy.optimize import linear_sum_assignment  # deferred: scipy loads only for a matching

    sim = np.asarray(similarity, dtype=np.float64)
    if sim.ndim != 2 or not np.isfinite(sim).all():
        raise InputError(f"a similarity matrix must be 2-D and finite, got shape {sim.shape}")
    rows, cols = linear_sum_assignment(sim, maximize=True)
    return [(int(r), int(c), float(sim[r, c])) for r, c in zip(rows, cols)]


@dataclass
class HeadAlignment:
    """The heads of model A matched to those of model B.

    - ``similarity``: ``[layer, head_a, head_b]``, the mean similarity over the corpus's rows of each pair of
      heads of the same layer; ``across``: ``[layer_a, head_a, layer_b, head_b]`` when the matching ran over
      every head of the model (``across_layers=True``), else None.
    - ``matching``: one row per head of A: ``layer_a``, ``head_a``, ``layer_b``, ``head_b``, ``similarity``,
      ``roles_a``, ``roles_b`` (the atlas' roles, comma-separated; "" for none), ``status`` (:data:`STATUSES`:
      ``kept`` — similarity ≥ ``threshold`` and the same roles —, ``changed`` — ≥ ``threshold``, other roles —,
      ``no match`` — below ``threshold``).
    """

    similarity: np.ndarray
    matching: pd.DataFrame
    threshold: float
    measure: str
    across: np.ndarray | None = None
    rows: int = 0
    texts: int = 0
    names: tuple[str, str] = field(default=("A", "B"))

    def permutation(self, layer: int) -> list[int]:
        """The head of B each head of A of ``layer`` is matched to, in A's head order."""
        rows = self.matching[self.matching["layer_a"] == layer].sort_values("head_a")
        if rows.empty:
            raise InputError(f"layer {layer} is not aligned; the layers are 0..{self.similarity.shape[0] - 1}")
        return [int(h) for h in rows["head_b"]]

    def counts(self) -> dict[str, int]:
        """How many heads of A are kept, changed, or have no match."""
        return {status: int((self.matching["status"] == status).sum()) for status in STATUSES}

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items())
        return (
            f"HeadAlignment({self.names[0]} → {self.names[1]}: {len(self.matching)} heads, {counts}; "
            f"{self.measure} ≥ {self.threshold} over {self.rows:,} rows of {self.texts} texts)"
        )
