"""Validation: how far attnviz's recomputation is from the model's own numbers, per part, layer and head.

Two comparisons:

- ``output``: recomputed A·V against the attention output the model's kernel returned. Always
  available, whatever the backend (eager, sdpa, flash, flex), so this is the proof that the
  captured Q, K, V, mask, scaling, bias and sinks are exactly what the kernel used.
- ``weights``: recomputed A against the model's own attention weights, where the backend produced
  them (eager). By default they are compared while capturing and only the errors kept
  (``capture(..., keep_weights=True)`` keeps the n×n weights too).

Every capture checks itself (``capture(check="sample")``): the first and last query rows and a few
dozen spread over the text, in every layer and head. :func:`validate` checks every row. Both run
through :func:`attnviz.attention.attention_output`: float32, chunked over query rows, all heads of
a layer at once, the causal upper triangle skipped — never a whole layer's n² at once.

The tolerance is ``atol + rtol · max|model|`` for the head, with ``(atol, rtol)`` chosen by the
dtype the model ran in (float32: 1e-5, 1.3e-6 — as ``torch.testing.assert_close``'s float32 rtol;
float16: 1e-3, 1e-3; bfloat16: 1e-2, 1.6e-2). ``rel_error`` is the max absolute error divided by
``max|model|`` of that head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import attention_output, head_max
from ..errors import ValidationError

if TYPE_CHECKING:
    import pandas as pd

    from .capture import Capture, LayerRecord

__all__ = ["SAMPLE_ROWS", "TOLERANCES", "ValidationError", "ValidationReport", "sample_rows", "validate"]

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1.3e-6),
    "float64": (1e-7, 1e-7),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
}
SAMPLE_ROWS = 32  # rows spread over the text, besides the first and the last
_COLUMNS = ["part", "layer", "head", "quantity", "rows", "max_abs_error", "rel_error", "tolerance", "passed"]


@dataclass
class ValidationReport:
    """Per part/layer/head errors of the recomputation; ``str()`` is a one-line verdict."""

    rows: list[dict]
    model: str
    backend: str
    dtype: str
    atol: float
    rtol: float
    sample: bool = False  # True when only a sample of query rows was compared

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)

    def __bool__(self) -> bool:  # so `assert cap.validate()` reads naturally
        return self.passed

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=_COLUMNS)

    def worst(self, quantity: str | None = None) -> dict | None:
        """The row with the largest error relative to its tolerance."""
        rows = [r for r in self.rows if quantity is None or r["quantity"] == quantity]
        return max(rows, key=lambda r: r["max_abs_error"] / r["tolerance"], default=None)

    @property
    def parts(self) -> list[str]:
        return list(dict.fromkeys(r["part"] for r in self.rows))

    def error_map(
        self, quantity: str = "output", part: str | None = None
    ) -> torch.Tensor:  # [layer, head], NaN where not compared
        part = part if part is not None else (self.parts[0] if self.parts else None)
        rows = [r for r in self.rows if r["part"] == part]
        layers = max((r["layer"] for r in rows), default=-1) + 1
        heads = max((r["head"] for r in rows), default=-1) + 1
        grid = torch.full((layers, heads), float("nan"))
        for r in rows:
            if r["quantity"] == quantity:
                grid[r["layer"], r["head"]] = r["max_abs_error"]
        return grid

    def __str__(self) -> str:
        if not self.rows:
            return "attnviz validation: nothing to compare (no layer captured)"
        verdict = "PASS" if self.passed else "FAIL"
        parts = self.parts
        heads = len({r["head"] for r in self.rows})
        if len(parts) == 1:
            shape = f"{len({r['layer'] for r in self.rows})} layers × {heads} heads"
        else:
            shape = (
                ", ".join(f"{p} {len({r['layer'] for r in self.rows if r['part'] == p})}" for p in parts)
                + f" layers × {heads} heads"
            )
        found = []
        for quantity, what in (
            ("output", "A·V vs the model's attention output"),
            ("weights", "A vs the model's weights"),
        ):
            w = self.worst(quantity)
            if w is None:
                continue
            where = f"{w['part']} " if len(parts) > 1 else ""
            failed = sum(not r["passed"] for r in self.rows if r["quantity"] == quantity)
            found.append(
                f"{what}: max error {w['max_abs_error']:.2e} at {where}L{w['layer']}·H{w['head']}"
                + (f" ({failed} heads over tolerance)" if failed else "")
            )
        if not any(r["quantity"] == "weights" for r in self.rows):
            found.append(
                "weights: this family computes attention inline, so only its A·V output can be compared"
                if self.backend == "projection hooks"
                else f"weights: not produced by the {self.backend} backend "
                "(load with attn_implementation='eager' to compare them too)"
            )
        scope = f" (sample of {max(r['rows'] for r in self.rows)} query rows per layer)" if self.sample else ""
        return (
            f"attnviz validation {verdict}{scope}: {self.model}, {shape}, {self.dtype} on {self.backend}, "
            f"tolerance {self.atol:g} + {self.rtol:g}·max|model| — " + "; ".join(found)
        )

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from ..views.html import report_html  # deferred: the data model imports no view at module level

        return report_html(self)


def sample_rows(n: int, count: int = SAMPLE_ROWS) -> Tensor:  # [≤ count + 2] query rows
    """The first and the last row and ``count`` more spread evenly between them."""
    return (
        torch.unique(torch.linspace(0, n - 1, count + 2).round().long()) if n > 0 else torch.zeros(0, dtype=torch.long)
    )


def record_errors(rec: LayerRecord, rows: Tensor | None = None) -> dict[str, tuple[Tensor, Tensor]]:
    """{quantity: (max abs error [head], max |model| [head])} of one layer, over ``rows`` (default all)."""
    compare_weights = rec.weights is not None
    heads = rec.q.shape[0]
    errors = {"output": (torch.zeros(heads), torch.zeros(heads))} if rec.out is not None else {}
    if compare_weights:
        errors["weights"] = (torch.zeros(heads), torch.zeros(heads))
    if not errors:
        return {}
    chunks = attention_output(rec.q, rec.k, rec.v, rows=rows, all_keys=compare_weights, **rec.sdpa_arguments())
    for r, keys, out, weights in chunks:
        pairs = []
        if rec.out is not None:
            pairs.append(("output", out, rec.out[:, r.to(rec.out.device)]))
        if rec.weights is not None:
            pairs.append(("weights", weights, rec.weights[:, r.to(rec.weights.device)][..., keys]))
        for quantity, ours, theirs in pairs:
            theirs = theirs.to(ours.device, torch.float32)
            err, scale = errors[quantity]
            errors[quantity] = (
                torch.maximum(err, head_max(ours - theirs).cpu()),
                torch.maximum(scale, head_max(theirs).cpu()),
            )
    if rec.weights is None and rec.weight_error is not None and rec.weight_scale is not None:
        errors["weights"] = (rec.weight_error.float().cpu(), rec.weight_scale.float().cpu())  # measured while capturing
    return errors


def validate(
    cap: Capture,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    rows: Tensor | int | dict[str, Tensor] | None = None,
) -> ValidationReport:
    """Compare the recomputation with the model's own output (and weights), per part, layer and head.

    ``rows``: ``None`` compares every query row; an int compares that many rows spread over the
    text (plus the first and the last); a tensor compares those rows; ``{part: rows}`` chooses
    rows per part (a generation's self-check: a sample of the prompt and every generated row).
    """
    dtype = cap.model.get("dtype", "float32")
    default_atol, default_rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    report_rows = []
    for (part, layer), rec in sorted(cap.records.items(), key=lambda kv: (cap.parts.index(kv[0][0]), kv[0][1])):
        chosen = rows.get(part) if isinstance(rows, dict) else rows
        chosen = sample_rows(rec.n_queries, chosen) if isinstance(chosen, int) else chosen
        n_rows = rec.n_queries if chosen is None else len(chosen)
        for quantity, (errors, scales) in record_errors(rec, chosen).items():
            for head, (err, scale) in enumerate(zip(errors.tolist(), scales.tolist())):
                tol = atol + rtol * scale
                report_rows.append(
                    {
                        "part": part,
                        "layer": layer,
                        "head": head,
                        "quantity": quantity,
                        "rows": n_rows if quantity == "output" or rec.weights is not None else rec.n_queries,
                        "max_abs_error": err,
                        "rel_error": err / scale if scale > 0 else err,
                        "tolerance": tol,
                        "passed": err <= tol,
                    }
                )
    return ValidationReport(
        report_rows,
        str(cap.model.get("name")),
        str(cap.model.get("backend")),
        dtype,
        atol,
        rtol,
        sample=rows is not None,
    )
