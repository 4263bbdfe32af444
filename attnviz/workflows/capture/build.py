"""Step 4 of the pipeline (:mod:`attnviz.workflows.capture.pipeline`): the calls a forward recorded become one
checked :class:`~attnviz.Capture` per text — its records, what each head moves, the metadata, the self-check,
batched where the records are (:func:`captures`); :func:`run_captures` is the tap → record → build sequence
every capture takes, steps 3 and 4 in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ...data.capture import Capture, TokenSequence
from ...data.images import ImageGrid
from ...data.validate import SAMPLE_ROWS, ValidationError, ValidationReport, validate
from ...engine.projections import ProjectionWatch
from ...engine.specs import PARTS
from ...engine.taps import AttentionCall, Recorder, tap
from .call_records import build_records
from .device_check import check_captures
from .device_check import to_host as records_to_host
from .kept import KEEP, HeadChoice, drop_unkept, keep_heads
from .pipeline import (
    Resolved,
    T,
    check_mode,
    model_class,
    tapped,
    weight_mode_for,
)
from .provenance import add_check, capture_provenance

__all__ = ["Item", "capture_meta", "captures", "part_sizes", "run_captures", "self_check"]


def part_sizes(calls: list[AttentionCall]) -> dict[str, dict[str, int]]:
    """Per part that ran: its number of layers and the sizes of its heads (n_heads, n_kv_heads, d_head)."""
    parts: dict[str, dict[str, int]] = {}
    for part in PARTS:
        mine = [c for c in calls if c.part == part]
        if mine:
            parts[part] = {"n_layers": max(c.layer for c in mine) + 1, **mine[0].sizes}
    return parts


# ---------------------------------------------------------------- 4. the captures
@dataclass
class Item:
    """One capture to make from the recorded calls: its sequences, and per part the
    ``(queries, keys)`` of the batch's rows it owns."""

    source: TokenSequence
    target: TokenSequence | None
    cut: dict[str, tuple[int, int]]
    image: ImageGrid | None = None  # the picture the source's tokens (or a joint model's vision part) sit on
    vision: ImageGrid | None = None  # a vision-language model's vision tower's tokens over the picture


def captures(
    resolved: Resolved,
    calls: list[AttentionCall],
    items: list[Item],
    check: str,
    kept: list[AttentionCall] | None = None,
    rows: dict[str, Tensor] | None = None,
    extra: dict[str, Any] | None = None,
    projections: ProjectionWatch | None = None,
    to_host: bool = False,
    keep: frozenset[str] = frozenset(KEEP),
    heads: HeadChoice = None,
) -> list[Capture]:
    """One checked :class:`Capture` per item of the batch the ``calls`` recorded: its records (from
    ``kept``, default the calls whose tensors were kept), what each head moves
    (:func:`attnviz.workflows.capture.what_moves.add_value_terms`, proved against the rows of the output
    projections the taps kept in ``projections``), the metadata (``extra`` added), and the
    self-check unless ``check="off"`` (``rows``: per part, the query rows to prove) — batched where the
    records are (:mod:`attnviz.workflows.capture.device_check`), over every head; then the records narrowed
    to the query heads ``heads`` keeps (:func:`keep_heads`), what ``keep`` does not name let go
    (:func:`drop_unkept`) and, with ``to_host``, the records copied to the host."""
    kept = [c for c in calls if c.q is not None] if kept is None else kept
    meta = capture_meta(resolved, kept[0], part_sizes(calls), check) | (extra or {})
    provenance = capture_provenance(
        resolved.model,
        resolved.tokenizer,
        resolved.name,
        device=meta["device"],
        dtype=meta["dtype"],
        backend=meta["backend"],
        check=check,
    )
    batched = len(items) > 1
    made = [
        Capture.of(
            item.source,
            build_records(kept, b, item.cut, batched),
            {**meta, "provenance": dict(provenance)},  # each capture its own: its check's verdict differs
            item.target,
            item.image,
            item.vision,
        )
        for b, item in enumerate(items)
    ]
    reports = check_captures(resolved.model, made, projections, check, rows)
    keep_heads(made, heads)  # after the checks (every head), before the copies: a head not kept stays on the device
    drop_unkept(made, keep)  # before the copies: what is not kept never reaches the host
    if to_host:  # after the checks, which ran where the model did: every record's tensors in one wait
        records_to_host(made)
    if check != "off":
        self_check(made, check, rows, reports)
    return made


def run_captures(
    resolved: Resolved,
    forward: Callable[[], T],
    items: list[Item],
    *,
    layers: set[int] | None,
    check: str,
    keep_on_device: bool,
    weight_mode: str | None,
    lengths: dict[str, list[int]] | None = None,
    ran: Callable[[list[AttentionCall]], None] | None = None,
    keep: frozenset[str] = frozenset(KEEP),
    recorder_class: type[Recorder] = Recorder,
    heads: HeadChoice = None,
) -> tuple[list[Capture], T]:
    """(one checked :class:`Capture` per item, what ``forward()`` returned): the tap → record → build
    sequence every capture takes — ``forward()`` under taps that keep what they record where the model
    runs (``weight_mode`` as :func:`weight_mode_for` says for ``check``, when None), the calls checked
    (:func:`tapped`; ``recorder_class``: the recorder, e.g. one that reports progress, :func:`counting`;
    ``ran(calls)`` may refuse a run whose shapes do not match what the caller expects),
    then :func:`captures`: the records, checked where they are, copied to the host unless ``keep_on_device``."""
    check_mode(check)
    taps = tap(
        resolved.model,
        layers=layers,
        keep_on_device=True,
        weight_mode=weight_mode or weight_mode_for(check),
        lengths=lengths,
        recorder_class=recorder_class,
    )
    recorder, output = tapped(resolved, taps, lambda _: forward(), layers)
    if ran is not None:
        ran(recorder.calls)
    made = captures(
        resolved,
        recorder.calls,
        items,
        check,
        projections=recorder.projections,
        to_host=not keep_on_device,
        keep=keep,
        heads=heads,
    )
    return made, output


def capture_meta(resolved: Resolved, first: AttentionCall, parts: dict, check: str) -> dict:
    """What a capture records about the model that made it (``Capture.model``)."""
    model = resolved.model
    config = model.config
    assert first.q is not None
    return {
        "name": resolved.name,
        "model_type": getattr(config, "model_type", None),
        "class": model_class(model),
        "backend": first.backend,
        "dtype": str(first.q.dtype).removeprefix("torch."),
        "device": str(resolved.device),
        "encoder_decoder": resolved.encoder_decoder,
        "parts": parts,
        "d_model": getattr(config, "hidden_size", None)
        or getattr(config, "n_embd", None)
        or getattr(config, "d_model", None),
        "max_positions": resolved.limit,
        "check": check,
    }


def self_check(
    made: list[Capture],
    check: str,
    rows: dict[str, Tensor] | None = None,
    reports: list[ValidationReport | None] | None = None,
) -> None:
    """Validate each capture (``rows``: per part, else a sample or all; ``reports``: already made, by
    :func:`~attnviz.workflows.capture.device_check.check_captures`); raise :class:`ValidationError` on a mismatch."""
    for i, cap in enumerate(made):
        report = reports[i] if reports is not None else None
        if report is None:
            report = validate(cap, rows=rows if rows is not None else SAMPLE_ROWS if check == "sample" else None)
        cap.model["check_error"] = max((r["max_abs_error"] / r["tolerance"] for r in report.rows), default=0.0)
        if "provenance" in cap.model:
            add_check(cap.model["provenance"], report.rows, report.passed)
        if not report.passed:
            which = "" if len(made) == 1 else f" (text {i})"
            raise ValidationError(
                f"attnviz could not reproduce what the model computed{which}, so it will not show these maps: "
                f"{report}. The capture is on this error (.capture, .report); please report the model.",
                report,
                made[0] if len(made) == 1 else made,
            )
