"""Validation: how far attnviz's recomputation is from the model's own numbers, per layer and head.

Two comparisons, per layer and head:

- ``output``: recomputed A·V against the attention output the model's kernel returned. Always
  available, whatever the backend (eager, sdpa, flash), so this is the proof that the captured Q,
  K, V, mask and scaling are exactly what the kernel used.
- ``weights``: recomputed A against the model's own attention weights, where the backend
  produced them (eager).

Recomputation runs in float32. The tolerance is ``atol + rtol · max|model|`` for the head, with
``(atol, rtol)`` chosen by the dtype the model ran in (float32: 1e-5, 1.3e-6 — as
``torch.testing.assert_close``'s float32 rtol; float16: 1e-3, 1e-3; bfloat16: 1e-2, 1.6e-2).
``rel_error`` is the max absolute error divided by ``max|model|`` of that head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pandas as pd

    from .capture import Capture

__all__ = ["TOLERANCES", "ValidationReport", "validate"]

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1.3e-6),
    "float64": (1e-7, 1e-7),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
}


@dataclass
class ValidationReport:
    """Per layer/head errors of the recomputation; ``str()`` is a one-line verdict."""

    rows: list[dict]
    model: str
    backend: str
    dtype: str
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)

    def __bool__(self) -> bool:  # so `assert cap.validate()` reads naturally
        return self.passed

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=[
            "layer", "head", "quantity", "max_abs_error", "rel_error", "tolerance", "passed",
        ])

    def worst(self, quantity: str | None = None) -> dict | None:
        """The row with the largest error relative to its tolerance."""
        rows = [r for r in self.rows if quantity is None or r["quantity"] == quantity]
        return max(rows, key=lambda r: r["max_abs_error"] / r["tolerance"], default=None)

    def error_map(self, quantity: str = "output") -> torch.Tensor:  # [layer, head], NaN where not compared
        layers = sorted({r["layer"] for r in self.rows})
        heads = max((r["head"] for r in self.rows), default=-1) + 1
        grid = torch.full((max(layers, default=-1) + 1, heads), float("nan"))
        for r in self.rows:
            if r["quantity"] == quantity:
                grid[r["layer"], r["head"]] = r["max_abs_error"]
        return grid

    def __str__(self) -> str:
        if not self.rows:
            return "attnviz validation: nothing to compare (no layer captured)"
        verdict = "PASS" if self.passed else "FAIL"
        n_layers = len({r["layer"] for r in self.rows})
        n_heads = len({r["head"] for r in self.rows})
        parts = []
        for quantity, what in (("output", "A·V vs the model's attention output"), ("weights", "A vs the model's weights")):
            w = self.worst(quantity)
            if w is None:
                continue
            failed = sum(not r["passed"] for r in self.rows if r["quantity"] == quantity)
            parts.append(
                f"{what}: max error {w['max_abs_error']:.2e} at L{w['layer']}·H{w['head']}"
                + (f" ({failed} heads over tolerance)" if failed else "")
            )
        if not any(r["quantity"] == "weights" for r in self.rows):
            parts.append(f"weights: not produced by the {self.backend} backend (load with attn_implementation='eager' to compare them too)")
        return (
            f"attnviz validation {verdict}: {self.model}, {n_layers} layers × {n_heads} heads, {self.dtype} "
            f"on {self.backend}, tolerance {self.atol:g} + {self.rtol:g}·max|model| — " + "; ".join(parts)
        )

    __repr__ = __str__


def _head_errors(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head (dim 0): max absolute error and max |theirs|."""
    theirs = theirs.to(ours.device, torch.float32)
    diff = (ours - theirs).abs().flatten(1)
    return diff.max(dim=1).values, theirs.abs().flatten(1).max(dim=1).values


def validate(cap: Capture, *, atol: float | None = None, rtol: float | None = None) -> ValidationReport:
    """Compare the recomputation with the model's own output (and weights), per layer and head."""
    dtype = cap.model.get("dtype", "float32")
    default_atol, default_rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    rows = []
    for layer in sorted(cap.layers):
        rec = cap.layers[layer]
        checks = []
        if rec.out is not None:
            checks.append(("output", cap.output(layer), rec.out))
        if rec.weights is not None:
            checks.append(("weights", cap.attention(layer), rec.weights))
        for quantity, ours, theirs in checks:
            errors, scales = _head_errors(ours, theirs)
            for head, (err, scale) in enumerate(zip(errors.tolist(), scales.tolist())):
                tol = atol + rtol * scale
                rows.append({
                    "layer": layer,
                    "head": head,
                    "quantity": quantity,
                    "max_abs_error": err,
                    "rel_error": err / scale if scale > 0 else err,
                    "tolerance": tol,
                    "passed": err <= tol,
                })
    return ValidationReport(rows, str(cap.model.get("name")), str(cap.model.get("backend")), dtype, atol, rtol)
