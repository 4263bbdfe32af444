"""The result of scoring a probe set: every head's pick on every probe, and what follows from the picks —
per-head accuracy and the two baselines (nearest and first candidate).

:func:`attnviz.evaluate_probes` fills it; nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ProbeResult"]


@dataclass
class ProbeResult:
    """Per-head accuracy at picking the gold antecedent, with two baselines.

    The picks themselves are kept (``picks[probe, layer, head]``: the index, in the probe's own
    candidate order, of the candidate that head gives the most attention; -1 where the layer was not
    captured), beside each probe's ``gold``, ``nearest`` and ``first`` candidate index and its number of
    candidates (``n_candidates``): every statistic is computed from them.
    """

    accuracy: pd.DataFrame  # layer, head, accuracy, correct, n
    per_probe: pd.DataFrame  # id, text, pronoun, gold, nearest, first, best_head, best_head_pick, best_head_weight
    baselines: dict[str, float]  # nearest candidate, first candidate
    model: str
    how: str = ""
    n_layers: int = 0
    n_heads: int = 0
    skipped: list[str] = field(default_factory=list)
    picks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), dtype=np.int16))  # [probe, layer, head]
    gold: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    nearest: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]
    n_candidates: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int16))  # [probe]

    @property
    def best(self) -> dict:
        return self.ranked().iloc[0].to_dict()

    def accuracy_map(self) -> Tensor:  # [layer, head]
        grid = torch.full((self.n_layers, self.n_heads), float("nan"))
        for row in self.accuracy.itertuples():
            grid[row.layer, row.head] = row.accuracy
        return grid

    def ranked(self) -> pd.DataFrame:
        """Heads by accuracy, best first (ties: lower layer, then lower head)."""
        return self.accuracy.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True], kind="stable")

    def __str__(self) -> str:
        b = self.best
        n = int(b["n"])
        return (
            f"{n} probes on {self.model} ({self.how}): best head L{int(b['layer'])}·H{int(b['head'])} picks the gold "
            f"antecedent {b['accuracy']:.0%} of the time; baselines — nearest candidate "
            f"{self.baselines['nearest']:.0%}, first candidate {self.baselines['first']:.0%}; "
            + _count((self.accuracy.accuracy > max(self.baselines.values())).sum(), "head beats", "heads beat")
            + " both"
            + (f"; skipped {len(self.skipped)}" if self.skipped else "")
        )

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from ..views.html import probes_html  # deferred: analyses import no view at module level

        return probes_html(self)


def _count(n: int, one: str, many: str) -> str:  # '1 head beats', '3 heads beat'
    return f"{n} {one if n == 1 else many}"
