"""Why a head looks there: one query–key score taken apart (:class:`QKAttribution`, what
:func:`attnviz.qk_attribution` returns).

The residual stream entering a layer at a position is a sum of components — the embeddings, every
earlier head's output, every earlier MLP's output, the biases. With each normalisation's scale held at
the value the forward read, the path from the stream to the head's pre-softmax score is linear in the
query's stream and in the key's, so the score is a sum over *pairs* (component writing the query,
component writing the key): ``s = Σ_a Σ_b q_a · k_b · scale`` (+ the model's own score bias). The
object holds that ``[query component, key component]`` matrix, the model's own score read from the
capture, and the components themselves at the positions (O(components · hidden), never n²).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from ..errors import ValidationError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCORE_BIAS", "QKAttribution"]

#: the label of the model's own score bias (ALiBi, a relative position bias): a pair of its own
SCORE_BIAS = "score bias"


@dataclass
class QKAttribution:
    """The score of one (query, key) cell of one head, taken apart into what wrote the query and the key.

    - :attr:`matrix` ``[query component, key component]``: each pair's share of the score (float64); its
      sum, :attr:`total`, is the model's own pre-softmax score :attr:`score` (``q·k·scale + bias``, read
      from the capture) — :meth:`check` raises :class:`~attnviz.ValidationError` when they differ by more
      than :attr:`tolerance` relative to the larger of |score| and 1.
    - With ``versus``, every number is s(query, key) − s(query, versus): why this key and not that one.
    - :attr:`pairs`, :attr:`query_side`, :attr:`key_side`: tables sorted by |score|.
    - :attr:`components` ``[component, position, hidden]``: the residual stream entering the layer at
      :attr:`positions` (the query's, the key's, the versus key's), before the layer's norm; their sum is
      the model's hidden state there (:attr:`residual_error` says how close, relative).
    """

    layer: int
    head: int
    part: str
    query: int  # token positions
    key: int
    versus: int | None
    tokens: tuple[str, str, str | None]  # the query's, the key's and the versus key's tokens
    query_labels: list[str]
    key_labels: list[str]
    matrix: Tensor  # [query component, key component], float64
    score: float  # the model's own pre-softmax score (or difference of two), from the capture
    labels: list[str]  # the components' labels, in the order of ``components``
    components: Tensor  # [component, position, hidden], float64
    positions: tuple[int, ...]
    residual_error: float  # max |Σ components − the stream the model computed| / max |stream|
    tolerance: float

    @property
    def total(self) -> float:
        """Σ of every pair: the score as the components add up to it."""
        return float(self.matrix.sum())

    @property
    def error(self) -> float:
        """|total − score| relative to max(|score|, 1)."""
        return abs(self.total - self.score) / max(abs(self.score), 1.0)

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance and self.residual_error <= self.tolerance

    def check(self) -> QKAttribution:
        """This attribution, or :class:`~attnviz.ValidationError` when the pairs do not add up to the
        model's score (or the components to the model's residual stream) within :attr:`tolerance`."""
        if not self.passed:
            raise ValidationError(
                f"the score's attribution at layer {self.layer} head {self.head}, query {self.query} → key "
                f"{self.key} does not add up: Σ pairs {self.total:.6g}, the model's score {self.score:.6g} "
                f"(relative error {self.error:.1e}; the residual stream's {self.residual_error:.1e}; tolerance "
                f"{self.tolerance:.0e}). Is the capture this model's, in the dtype it ran in? Capture the text "
                "again with this model, or report the model to attnviz",
                report=self,
            )
        return self

    def pairs_table(self) -> pd.DataFrame:
        """(query_component, key_component, score), every pair, by |score|, largest first."""
        import pandas as pd  # deferred: pandas is heavy and only the tables need it

        n_q, n_k = self.matrix.shape
        values = self.matrix.flatten().tolist()
        frame = pd.DataFrame(
            {
                "query_component": [a for a in self.query_labels for _ in range(n_k)],
                "key_component": self.key_labels * n_q,
                "score": values,
            }
        )
        return frame.reindex(frame["score"].abs().sort_values(ascending=False, kind="stable").index).reset_index(
            drop=True
        )

    @property
    def pairs(self) -> pd.DataFrame:
        """:meth:`pairs_table`: every (query component, key component) pair and its share of the score."""
        return self.pairs_table()

    def _side(self, labels: list[str], values: Tensor) -> pd.Series:
        import pandas as pd  # deferred: pandas is heavy and only the tables need it

        series = pd.Series(values.tolist(), index=labels, name="score", dtype=float)
        return series.reindex(series.abs().sort_values(ascending=False, kind="stable").index)

    @property
    def query_side(self) -> pd.Series:
        """Each query component's share, summed over every key component, by |score|."""
        return self._side(self.query_labels, self.matrix.sum(1))

    @property
    def key_side(self) -> pd.Series:
        """Each key component's share, summed over every query component, by |score|."""
        return self._side(self.key_labels, self.matrix.sum(0))

    def top(self, n: int = 10) -> pd.DataFrame:
        """The ``n`` largest pairs by |score|."""
        return self.pairs.head(n)

    def __repr__(self) -> str:
        versus = "" if self.versus is None else f" − s(→{self.tokens[2]!r}@{self.versus})"
        return (
            f"QKAttribution(layer {self.layer} head {self.head}: {self.tokens[0]!r}@{self.query} → "
            f"{self.tokens[1]!r}@{self.key}{versus}; score {self.score:.4g}, Σ pairs {self.total:.4g}, "
            f"error {self.error:.1e}; {len(self.query_labels)}×{len(self.key_labels)} components)"
        )
