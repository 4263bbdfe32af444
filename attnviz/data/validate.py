"""Validation: how far attnviz's recomputation is from the model's own numbers, per part, layer and head.

Two comparisons:

- ``output``: recomputed A·V against the attention output the model's kernel returned. Always
  available, whatever the backend (eager, sdpa, flash, flex), so this is the proof that the
  captured Q, K, V, mask, scaling, bias and sinks are exactly what the kernel used.
- ``weights``: recomputed A against the model's own attention weights, where the backend produced
  them (eager). By default they are compared while capturing and only the errors kept
  (``capture(..., keep_weights=True)`` keeps the n×n weights too).

Every capture checks itself (``capture(check="sample")``): the first and last query rows and a few
dozen spread over the text, in every layer and head. :func:`validate` checks every row. Both run in
float32, all heads of a layer at once, the causal upper triangle skipped — never a whole layer's n² at
once. Every row of a layer that holds no model weights (the usual case) goes through
:func:`attnviz.attention.online_attention`: tiles of queries *and* keys with a running max and sum
per row, as FlashAttention computes it, whose log-sum-exp per row is kept on the record
(``LayerRecord.lse``: any tile of weights is then O(tile), ``cap.attention(l, h, rows=, cols=)``).
A sample of rows, and a layer whose record holds the model's own weights (``keep_weights=True``: they
are compared tile by tile, so each tile's weights are needed whole), go through
:func:`attnviz.attention.attention_output`, chunked over query rows.

The tolerance is ``atol + rtol · max|model|`` for the head, with ``(atol, rtol)`` chosen by the
dtype the model ran in (float32: 1e-5, 1.3e-6 — as ``torch.testing.assert_close``'s float32 rtol;
float16: 1e-3, 1e-3; bfloat16: 1e-2, 1.6e-2). ``rel_error`` is the max absolute error divided by
``max|model|`` of that head.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import SAMPLE_ROWS, attention_output, head_max, online_attention, spread_rows
from ..errors import InputError, ValidationError
from .reprs import html_of

if TYPE_CHECKING:
    import pandas as pd

    from .capture import Capture, LayerRecord

__all__ = [
    "LayerErrors",
    "SAMPLE_ROWS",
    "TOLERANCES",
    "ValidationError",
    "ValidationReport",
    "layer_rows",
    "projection_rows",
    "record_errors",
    "report",
    "sample_rows",
    "tolerance",
    "validate",
]

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1.3e-6),
    "float64": (1e-7, 1e-7),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1.6e-2),
}
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
    #: per part and layer: Σ_h Σ_j α_ij f_h(x_j) + b against the model's own output projection
    #: (measured while capturing, over the rows the taps kept; :func:`projection_rows`)
    projection: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows) and all(r["passed"] for r in self.projection)

    def projection_table(self) -> pd.DataFrame:
        """The output-projection check per part and layer: part, layer, quantity, rows, max_abs_error,
        rel_error, tolerance, passed (empty when no layer had an output projection to check)."""
        import pandas as pd

        return pd.DataFrame(self.projection, columns=[c for c in _COLUMNS if c != "head"])

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
            # float32 errors come in steps of an ulp: where other heads have this very error, say so
            # (a NaN is the same error as another NaN, though NaN != NaN: not "and -1 more heads")
            tied = (
                sum(_same(r["max_abs_error"], w["max_abs_error"]) for r in self.rows if r["quantity"] == quantity) - 1
            )
            found.append(
                f"{what}: max error {w['max_abs_error']:.2e} at {where}L{w['layer']}·H{w['head']}"
                + (f" and {tied} more heads with the same error" if tied else "")
                + (f" ({failed} heads over tolerance)" if failed else "")
            )
        if self.projection:
            w = max(self.projection, key=lambda r: r["max_abs_error"] / r["tolerance"])
            where = f"{w['part']} " if len(parts) > 1 else ""
            failed = sum(not r["passed"] for r in self.projection)
            found.append(
                f"Σ heads α·f(x) + b vs the model's output projection: max error {w['max_abs_error']:.2e} "
                f"at {where}L{w['layer']}" + (f" ({failed} layers over tolerance)" if failed else "")
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
        return html_of(self)  # drawn by attnviz.views.html, which registers it (data.reprs)


def sample_rows(n: int, count: int = SAMPLE_ROWS) -> Tensor:  # [≤ count + 2] query rows
    """The first and the last row and ``count`` more spread evenly between them
    (:func:`attnviz.attention.spread_rows`, on the host)."""
    return spread_rows(n, count)


class LayerErrors:
    """A consumer of one layer's chunks with A·V (``rows, keys, weights [head, r, keys], out [head, r, d_v]``
    from :func:`attnviz.attention.attention_output` with the layer's real V — and, when the record
    holds the model's weights, ``all_keys=True``) that keeps, per head, the max |error| and the max
    |model| of each quantity; :meth:`errors` gives them. Chunks may come in any order."""

    def __init__(self, rec: LayerRecord) -> None:
        self.rec = rec
        heads = rec.q.shape[0]
        self._errors = {"output": (torch.zeros(heads), torch.zeros(heads))} if rec.out is not None else {}
        if rec.weights is not None:
            self._errors["weights"] = (torch.zeros(heads), torch.zeros(heads))

    @property
    def wanted(self) -> bool:
        """Whether this layer has anything to compare chunk by chunk (its output or its weights)."""
        return bool(self._errors)

    def add_output(self, rows: Tensor | None, out: Tensor) -> None:
        """Compare A·V of ``rows`` (None: every row) with the model's output, without weights (a record
        that holds the model's weights compares them too: feed it :meth:`add`)."""
        rec = self.rec
        if rec.out is None or rec.weights is not None:
            raise ValueError("add_output is for a record with an output and without the model's weights; use add")
        theirs = rec.out if rows is None else rec.out[:, rows.to(rec.out.device)]
        theirs = theirs.to(out.device, torch.float32)
        err, scale = self._errors["output"]
        self._errors["output"] = (
            torch.maximum(err, head_max(out - theirs).cpu()),
            torch.maximum(scale, head_max(theirs).cpu()),
        )

    def add(self, rows: Tensor, keys: slice, weights: Tensor, out: Tensor | None = None) -> None:
        rec = self.rec
        pairs = []
        if rec.out is not None:
            if out is None:
                raise ValueError("LayerErrors needs the chunks' A·V: feed attention_output with the layer's V")
            pairs.append(("output", out, rec.out[:, rows.to(rec.out.device)]))
        if rec.weights is not None:
            pairs.append(("weights", weights, rec.weights[:, rows.to(rec.weights.device)][..., keys]))
        for quantity, ours, theirs in pairs:
            theirs = theirs.to(ours.device, torch.float32)
            err, scale = self._errors[quantity]
            self._errors[quantity] = (
                torch.maximum(err, head_max(ours - theirs).cpu()),
                torch.maximum(scale, head_max(theirs).cpu()),
            )

    def errors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """{quantity: (max abs error [head], max |model| [head])} over the chunks fed (with the errors
        measured while capturing for weights the record does not hold)."""
        errors = dict(self._errors)
        rec = self.rec
        if rec.weights is None and rec.weight_error is not None and rec.weight_scale is not None:
            errors["weights"] = (
                rec.weight_error.float().cpu(),
                rec.weight_scale.float().cpu(),
            )  # measured while capturing
        return errors


def record_errors(rec: LayerRecord, rows: Tensor | None = None) -> dict[str, tuple[Tensor, Tensor]]:
    """{quantity: (max abs error [head], max |model| [head])} of one layer, over ``rows`` (default all):
    a :class:`LayerErrors` fed the layer's A·V. Every row of a record without the model's weights: A·V
    by :func:`attnviz.attention.online_attention` (tiles of queries and keys), whose log-sum-exp per row
    becomes ``rec.lse``; else the layer's chunks of rows from :func:`attnviz.attention.attention_output`."""
    consumer = LayerErrors(rec)
    if not consumer.wanted:
        return {}
    if rows is None and rec.weights is None:
        out, rec.lse = online_attention(rec.q, rec.k, rec.v, **rec.sdpa_arguments())
        consumer.add_output(None, out)
        return consumer.errors()
    chunks = attention_output(rec.q, rec.k, rec.v, rows=rows, all_keys=rec.weights is not None, **rec.sdpa_arguments())
    for r, keys, out, weights in chunks:
        consumer.add(r, keys, weights, out)
    return consumer.errors()


def tolerance(cap: Capture, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    """(atol, rtol) of a capture's validation: the given ones, else its dtype's (:data:`TOLERANCES`)."""
    default_atol, default_rtol = TOLERANCES.get(cap.model.get("dtype", "float32"), TOLERANCES["float32"])
    return (default_atol if atol is None else atol, default_rtol if rtol is None else rtol)


def layer_rows(
    part: str,
    layer: int,
    rec: LayerRecord,
    errors: Mapping[str, tuple[Tensor | list[float], Tensor | list[float]]],
    n_rows: int,
    atol: float,
    rtol: float,
) -> list[dict]:
    """A report's rows (one per quantity and head) of one layer's :meth:`LayerErrors.errors` (per head, as
    tensors or lists of floats read back already), over ``n_rows`` compared query rows."""
    out = []
    numbers = rec.head_numbers  # the model's numbers of the heads stacked (capture(heads=) keeps some)
    for quantity, (errs, scales) in errors.items():
        read = (t.tolist() if isinstance(t, Tensor) else t for t in (errs, scales))
        for i, (err, scale) in enumerate(zip(*read)):
            head = numbers[i] if len(numbers) > i else i
            tol = atol + rtol * scale
            out.append(
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
    return out


def projection_rows(cap: Capture, atol: float, rtol: float) -> list[dict]:
    """One row per part and layer whose output projection was checked while capturing
    (``LayerRecord.projection_check``); the tolerance is ``atol + rtol ·`` a bound on the size of the
    terms the projection sums, ``max_e Σ_k |W[e, k]| · max |o| + max |b|`` (what a float dot product's
    error is proportional to)."""
    out = []
    for (part, layer), rec in sorted(cap.records.items(), key=lambda kv: (cap.parts.index(kv[0][0]), kv[0][1])):
        if rec.projection_check is None:
            continue
        error, size, n_rows = rec.projection_check.tolist()
        tol = atol + rtol * size
        out.append(
            {
                "part": part,
                "layer": layer,
                "quantity": "projection",
                "rows": int(n_rows),
                "max_abs_error": error,
                "rel_error": error / size if size > 0 else error,
                "tolerance": tol,
                "passed": error <= tol,
            }
        )
    return out


def report(cap: Capture, rows: list[dict], atol: float, rtol: float, *, sample: bool = False) -> ValidationReport:
    """The :class:`ValidationReport` of a capture's rows (:func:`layer_rows`), with its output-projection
    checks (:func:`projection_rows`)."""
    return ValidationReport(
        rows,
        str(cap.model.get("name")),
        str(cap.model.get("backend")),
        cap.model.get("dtype", "float32"),
        atol,
        rtol,
        sample=sample,
        projection=projection_rows(cap, atol, rtol),
    )


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
    kept = cap.model.get("kept")
    if kept is not None and not {"v", "out"} <= set(kept):
        raise InputError(
            f"this capture kept {', '.join(kept)} of each layer (keep= / --keep): A·V needs the values and the "
            "kernel's output to be compared after the capture; its self-check ran while capturing (its largest "
            "error over the tolerance is cap.model['check_error']). Capture again keeping v and out to validate "
            "it afterwards"
        )
    atol, rtol = tolerance(cap, atol, rtol)
    report_rows = []
    for (part, layer), rec in sorted(cap.records.items(), key=lambda kv: (cap.parts.index(kv[0][0]), kv[0][1])):
        chosen = rows.get(part) if isinstance(rows, dict) else rows
        chosen = sample_rows(rec.n_queries, chosen) if isinstance(chosen, int) else chosen
        n_rows = rec.n_queries if chosen is None else len(chosen)
        report_rows += layer_rows(part, layer, rec, record_errors(rec, chosen), n_rows, atol, rtol)
    return report(cap, report_rows, atol, rtol, sample=rows is not None)


def _same(a: float, b: float) -> bool:
    """Two errors equal, a NaN equal to a NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))
