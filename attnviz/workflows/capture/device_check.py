"""The self-check and what each head moves, as a few batched operations where the records are.

On a GPU a capture's cost after the forward is counted in kernel launches and in the times the host
waits for the device, not in arithmetic: a check of 12 layers as 12 × 30 small operations, each
result read back at once, cost GPT-2 small 7–9× its forward. So, for each capture, the layers of
one part whose kernels saw the same shapes and the same terms — scaling, a causal flag, a window, a
soft-cap, and no tensor of their own (no custom mask, bias, sinks or kept weights) — form a
:class:`Group`, and each group runs as one:

- its Q, K, V and outputs are stacked ``[layer, head, pos, d]`` (one copy each; the records become
  views of the stacks) when that stays under :data:`STACK_BYTES`, else each layer is its own group
  (at long context an operation costs far more than its launch) — and on the CPU, where a launch costs
  nothing, each layer is its own group too (:data:`STACK_CPU`);
- the sampled rows (:func:`attnviz.data.validate.sample_rows`, made on the device) are recomputed
  for every layer and head at once — one Q·Kᵀ, the causal and window structure built on the device,
  one softmax, one A·V — and compared with the kernels' outputs;
- ``value_dots`` (:meth:`attnviz.engine.projections.OutputProjection.value_dots`) and the output
  projection's check (:func:`attnviz.workflows.capture.what_moves.projection_errors`) for every layer at once;
- every error of the capture comes back to the host in one transfer.

A record that fits no group (a custom mask, a bias, sinks, kept weights, a batch's padded rows) goes
the per-layer way (:func:`attnviz.workflows.capture.what_moves.add_value_terms`, :func:`attnviz.data.validate.validate`),
and its rows join the same report. The numbers are the per-layer path's: the same formula in the same
float32, only batched (``tests/test_gpu_feel.py`` compares them).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ...attention import attention_output, head_max, spread_rows
from ...data.capture import Capture
from ...data.records import LayerRecord
from ...data.validate import (
    SAMPLE_ROWS,
    ValidationReport,
    layer_rows,
    record_errors,
    report,
    sample_rows,
    tolerance,
    validate,
)
from ...engine.projections import WATCHED_ROWS, OutputProjection, ProjectionWatch, output_projection
from ...engine.transfer import HostCopies
from .what_moves import add_value_terms, check_projection

__all__ = ["STACK_BYTES", "Group", "Stacked", "check_captures", "groups", "stacked", "to_host"]

#: the most bytes a group's stacked Q, K, V and outputs may take; past it each layer is its own group
STACK_BYTES = 1 << 28
#: whether records on the CPU are stacked too: no — there a launch costs nothing and the stacking copy
#: does (3 % of GPT-2 small's forward at 1,024 tokens), so each layer is checked alone, the same formula.
#: ``tests/test_gpu_feel.py`` and ``bench/launches.py`` set it, to count on the CPU what a GPU runs.
STACK_CPU = False
#: the most scores one batched recomputation holds at once (layers are taken a few at a time past it)
SCORE_BUDGET = 1 << 26


@dataclass
class Group:
    """Layers of one part computed alike: their records, and their tensors as ``[layer, ...]`` stacks
    (views of the records' own tensors for a group of one)."""

    part: str
    layers: list[int]
    recs: list[LayerRecord]
    q: Tensor = field(init=False)  # [L, head, query_pos, d_head]
    k: Tensor = field(init=False)  # [L, kv_head, key_pos, d_head]
    v: Tensor = field(init=False)  # [L, kv_head, key_pos, d_head_v]
    out: Tensor = field(init=False)  # [L, head, query_pos, d_head_v]

    def __post_init__(self) -> None:
        if len(self.recs) == 1:
            rec = self.recs[0]
            assert rec.out is not None
            self.q, self.k, self.v, self.out = rec.q[None], rec.k[None], rec.v[None], rec.out[None]
            return
        for name in ("q", "k", "v", "out"):  # one copy per tensor kind; the records become views of it
            stacked = torch.stack([getattr(r, name) for r in self.recs])
            setattr(self, name, stacked)
            for i, rec in enumerate(self.recs):
                setattr(rec, name, stacked[i])

    @property
    def first(self) -> LayerRecord:
        return self.recs[0]


def _key(rec: LayerRecord) -> tuple | None:
    """What layers must share to be computed as one (None: this record goes the per-layer way)."""
    if rec.out is None or any(
        t is not None for t in (rec.mask, rec.bias, rec.relative_bias, rec.sinks, rec.weights, rec.value_dots)
    ):
        return None
    q, k, v = rec.q, rec.k, rec.v
    return (q.shape, k.shape, v.shape, q.dtype, q.device, rec.scaling, rec.causal, rec.window, rec.softcap)


def groups(cap: Capture) -> tuple[list[Group], list[tuple[str, int]]]:
    """(the groups of ``cap``'s records, the (part, layer) of every record left to the per-layer way)."""
    found: dict[tuple, list[tuple[int, LayerRecord]]] = {}
    rest = []
    for (part, layer), rec in cap.records.items():
        key = _key(rec)
        if key is None:
            rest.append((part, layer))
        else:
            found.setdefault((part, *key), []).append((layer, rec))
    made = []
    for (part, *_), members in found.items():
        members.sort(key=lambda m: m[0])
        first = members[0][1]
        per_layer = sum(t.numel() * t.element_size() for t in (first.q, first.k, first.v, first.out) if t is not None)
        alone = per_layer * len(members) > STACK_BYTES or (first.q.device.type == "cpu" and not STACK_CPU)
        size = 1 if alone else len(members)
        for start in range(0, len(members), size):
            chunk = members[start : start + size]
            made.append(Group(part, [m[0] for m in chunk], [m[1] for m in chunk]))
    return made, rest


def _structure(rows: Tensor, n_q: int, n_k: int, causal: bool, window: int | None) -> Tensor | None:
    """[r, key] True where the causal / window structure blocks a key, made on the rows' device (None: nothing)."""
    if not causal and window is None:
        return None
    i = (rows + (n_k - n_q))[:, None]
    j = torch.arange(n_k, device=rows.device)[None, :]
    blocked = j > i if causal else torch.zeros(1, n_k, dtype=torch.bool, device=rows.device)
    if window is not None:
        blocked = blocked | (i - j >= window)
    return blocked


def output_errors(group: Group, rows: Tensor) -> dict[str, Tensor]:  # each [L, head]
    """``output``: max |A·V recomputed − the kernel's output| and ``output_scale``: max |kernel's output|,
    per layer and head over the query ``rows`` (on the records' device), every layer of the group at
    once, in float32; ``weights`` and ``weights_scale`` likewise against the model's own weights at
    those rows, where every record holds them (``sampled_weights``)."""
    rec = group.first
    n_layers, n_heads, n_q, d = group.q.shape
    n_kv, n_k = group.k.shape[1], group.k.shape[2]
    g, r = n_heads // n_kv, rows.shape[0]
    blocked = _structure(rows, n_q, n_k, rec.causal, rec.window)
    per = max(1, SCORE_BUDGET // max(1, n_heads * r * n_k))  # layers at once
    sampled = [rec.sampled_weights for rec in group.recs]
    found: dict[str, list[Tensor]] = {"output": [], "output_scale": []}
    if all(w is not None for w in sampled):
        found.update(weights=[], weights_scale=[])
    for lo in range(0, n_layers, per):
        hi = min(n_layers, lo + per)
        q = group.q[lo:hi].index_select(2, rows).float().reshape((hi - lo) * n_kv, g * r, d)
        k = group.k[lo:hi].float().reshape((hi - lo) * n_kv, n_k, d)
        v = group.v[lo:hi].float().reshape((hi - lo) * n_kv, n_k, -1)
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(rec.scaling).view(hi - lo, n_heads, r, n_k)
        if rec.softcap is not None:
            scores = torch.tanh(scores / rec.softcap).mul_(rec.softcap)
        if blocked is not None:
            scores.masked_fill_(blocked, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if rec.window is not None or (rec.causal and n_q > n_k):
            weights = weights.nan_to_num_(nan=0.0)  # rows with every key blocked
        ours = torch.bmm(weights.view((hi - lo) * n_kv, g * r, n_k), v).view(hi - lo, n_heads, r, -1)
        theirs = group.out[lo:hi].index_select(2, rows).float()
        found["output"].append((ours - theirs).abs_().amax(dim=(2, 3)))
        found["output_scale"].append(theirs.abs().amax(dim=(2, 3)))
        if "weights" in found:
            model_weights = torch.stack(sampled[lo:hi]).to(weights.device, torch.float32)  # type: ignore[arg-type]
            found["weights"].append((weights - model_weights).abs_().amax(dim=(2, 3)))
            found["weights_scale"].append(model_weights.abs().amax(dim=(2, 3)))
    return {name: torch.cat(parts) for name, parts in found.items()}


def _projections(model: nn.Module, group: Group) -> list[OutputProjection] | None:
    found = []
    for rec in group.recs:
        projection = output_projection(model, rec.name, rec.q.shape[0], rec.v.shape[-1])
        if projection is None:
            return None
        found.append(projection)
    return found


@dataclass
class Stacked:
    """Several layers' output projections as ``[layer, ...]`` tensors where their weights are."""

    projections: list[OutputProjection]  # held, so that the ids the cache is keyed by stay theirs
    grams: Tensor  # [L, head, d_v, d_v]
    # [L, head·d_v, hidden]: each projection's head slices W_O^h (the ones the value norms are made of,
    # OutputProjection.heads) side by side, transposed for a batched product — so the check proves them
    weight_t: Tensor
    bias: Tensor | None  # [L, hidden]
    bounds: Tensor  # [L, 2]: OutputProjection.size_bounds


_STACKED: dict[tuple[int, ...], Stacked] = {}  # the last few layer sets, most recent last
_STACKED_KEPT = 8
_STACKED_LOCK = threading.Lock()


def stacked(projections: list[OutputProjection]) -> Stacked:
    """The projections stacked, made once for as long as they are the model's (:func:`output_projection`
    hands out the same objects while the weights are unchanged): a capture launches nothing for them."""
    key = tuple(id(p) for p in projections)
    with _STACKED_LOCK:
        found = _STACKED.pop(key, None)
    if found is None:
        biases = [p.bias for p in projections]
        found = Stacked(
            list(projections),
            torch.stack([p.grams for p in projections]),
            torch.stack([p.heads.transpose(1, 2).reshape(-1, p.heads.shape[1]) for p in projections]),
            torch.stack(biases) if all(b is not None for b in biases) else None,  # type: ignore[arg-type]
            torch.stack([p.size_bounds for p in projections]),
        )
    with _STACKED_LOCK:
        _STACKED[key] = found
        while len(_STACKED) > _STACKED_KEPT:
            _STACKED.pop(next(iter(_STACKED)))
    return found


def value_dots(group: Group, projections: list[OutputProjection], width: int) -> Tensor:  # [L, head, key, width]
    """:meth:`OutputProjection.value_dots` of every layer of the group at once."""
    n_heads = group.q.shape[1]
    vh = group.v.float()
    if vh.shape[1] != n_heads:  # GQA: each query head reads its kv head's values
        vh = vh.repeat_interleave(n_heads // vh.shape[1], dim=1)
    grams = stacked(projections).grams.to(vh.device)  # [L, head, d_v, d_v]
    moved = vh @ grams
    if width <= 1:
        return moved.mul_(vh).sum(-1, keepdim=True).clamp_min_(0)
    n = vh.shape[2]
    dots = vh.new_zeros(*vh.shape[:3], width)
    for t in range(1, min(width, n)):
        dots[:, :, t:, t] = torch.linalg.vecdot(moved[:, :, t:], vh[:, :, :-t])
    dots[..., 0] = moved.mul_(vh).sum(-1).clamp_min_(0)
    return dots


def projection_errors(
    group: Group, projections: list[OutputProjection], watch: ProjectionWatch, b: int
) -> tuple[Tensor, Tensor, int] | None:
    """(max |Σ_h W_O^h o_h + b − the model's projection output| [L], the size bound of its terms [L], rows)
    over the rows the taps kept of every layer of the group at once (:func:`attnviz.workflows.capture.what_moves.projection_errors`
    layer by layer); None when the layers' kept rows differ or reach past the record (a padded batch)."""
    seen = [watch.rows(rec.name, layer) for rec, layer in zip(group.recs, group.layers)]
    if any(s is None for s in seen):
        return None
    positions = seen[0][0]  # type: ignore[index]
    n_q = group.q.shape[2]
    if any(not torch.equal(s[0], positions) for s in seen[1:]) or int(positions.max()) >= n_q:  # type: ignore[index]
        return None  # rows kept of a longer (padded) call, or of calls of different lengths
    device = group.out.device
    one_call = torch.equal(positions, spread_rows(n_q, WATCHED_ROWS))  # one forward's rows: the taps' own index
    index = watch.index(n_q, device)[1] if one_call else positions.to(device)
    model_out = torch.stack([s[1][b] for s in seen]).float()  # type: ignore[index]  # [L, r, hidden]
    per_head = group.out.index_select(2, index).float()  # [L, head, r, d_v]
    facts = stacked(projections)
    n_layers, n_heads, r, d_v = per_head.shape
    # Σ_h W_O^h o_h: the heads' outputs side by side, times the weight, every layer in one product
    ours = torch.bmm(per_head.transpose(1, 2).reshape(n_layers, r, n_heads * d_v), facts.weight_t.to(device))
    if facts.bias is not None:
        ours += facts.bias.to(device)[:, None, :]
    error = (ours - model_out.to(device)).abs_().amax(dim=(1, 2))
    bounds = facts.bounds.to(device)  # [L, 2]
    size = bounds[:, 0] * per_head.abs().amax(dim=(1, 2, 3)) + bounds[:, 1]
    return error, size, len(positions)


def _sampled_weight_errors(rec: LayerRecord, rows: Tensor) -> tuple[Tensor, Tensor]:  # ([head], [head])
    """(max |recomputed − the model's weights|, max |model's weights|) per head at the sample ``rows``
    whose weights the taps kept (``rec.sampled_weights``), the per-layer way."""
    assert rec.sampled_weights is not None
    ours = torch.cat(
        [w for _, _, _, w in attention_output(rec.q, rec.k, rec.v, rows=rows, all_keys=True, **rec.sdpa_arguments())],
        dim=1,
    )
    theirs = rec.sampled_weights.to(ours.device, torch.float32)
    return head_max(ours - theirs), head_max(theirs)


def _rows(part: str, layer: int, rec: LayerRecord, errors: dict, n_rows: int, atol: float, rtol: float) -> list[dict]:
    """:func:`~attnviz.data.validate.layer_rows`, the weights compared at the sample rows counted as such; the
    record keeps their errors (``weight_error`` / ``weight_scale``, as a comparison while capturing does)
    and lets the model's weights go."""
    made = layer_rows(part, layer, rec, errors, n_rows, atol, rtol)
    if rec.sampled_weights is not None and "weights" in errors:
        for row in made:
            if row["quantity"] == "weights":
                row["rows"] = n_rows
        err, scale = errors["weights"]
        rec.weight_error, rec.weight_scale = torch.as_tensor(err).float(), torch.as_tensor(scale).float()
        rec.sampled_weights = None
    return made


def _sample_index(n: int, device: torch.device, watch: ProjectionWatch | None) -> Tensor:
    """:func:`~attnviz.data.validate.sample_rows` of ``n`` rows on ``device`` — the taps' own index of the
    projection rows when it is the same rows (made once per tap)."""
    if watch is not None and WATCHED_ROWS == SAMPLE_ROWS:
        return watch.index(n, device)[1]
    return spread_rows(n, SAMPLE_ROWS, device)


def _widths(cap: Capture) -> dict[str, int]:
    """The longest word of each part's keys, in tokens."""
    return {
        part: max((w.token_stop - w.token_start for w in cap.sequences(part)[1].words), default=1) for part in cap.parts
    }


def check_captures(
    model: nn.Module,
    made: list[Capture],
    watch: ProjectionWatch | None,
    check: str,
    rows: dict[str, Tensor] | None = None,
) -> list[ValidationReport | None]:
    """Fill every record's ``value_dots`` and ``projection_check`` and, unless ``check`` is ``"off"``, make
    each capture's validation report (``"sample"``: :func:`~attnviz.data.validate.sample_rows`, or ``rows``
    per part; ``"full"``: every row, through :func:`~attnviz.data.validate.validate`); item ``b`` of the
    batch is ``made[b]``. What a capture's groups measured comes to the host in one transfer."""
    reports: list[ValidationReport | None] = []
    for b, cap in enumerate(made):
        found, rest = groups(cap)
        widths = _widths(cap)
        pending: list[tuple[Group, dict[str, Tensor], int]] = []  # per group: what it measured, its projection rows
        for group in found:
            measured: dict[str, Tensor] = {}
            projection_rows = 0
            projections = _projections(model, group)
            if projections is not None:
                dots = value_dots(group, projections, widths[group.part])
                for i, rec in enumerate(group.recs):
                    rec.value_dots = dots[i]
                checked = None if watch is None or check == "off" else projection_errors(group, projections, watch, b)
                if checked is not None:
                    measured["projection"], measured["size"], projection_rows = checked
                elif watch is not None and check != "off":  # rows kept of a padded batch's longer call: layer by layer
                    for rec, layer, projection in zip(group.recs, group.layers, projections):
                        check_projection(rec, layer, projection, watch, b)
            if check == "sample":
                chosen = None if rows is None else rows.get(group.part)
                device = group.q.device
                index = _sample_index(group.q.shape[2], device, watch) if chosen is None else chosen.to(device)
                errors = output_errors(group, index)
                if chosen is not None:  # rows of the caller's choosing: not the rows the taps kept weights of
                    errors = {name: t for name, t in errors.items() if name.startswith("output")}
                measured.update(errors)
                if "weights" not in measured and all(r.weight_error is not None for r in group.recs):
                    measured["weights"] = torch.stack([r.weight_error for r in group.recs])  # type: ignore[misc]
                    measured["weights_scale"] = torch.stack([r.weight_scale for r in group.recs])  # type: ignore[misc]
            pending.append((group, measured, projection_rows))
        flat = [t.float().flatten() for _, measured, _ in pending for t in measured.values()]
        values = torch.cat(flat).tolist() if flat else []  # the one transfer
        atol, rtol = tolerance(cap)
        report_rows: dict[tuple[str, int], list[dict]] = {}
        at = 0
        for group, measured, projection_rows in pending:
            read: dict[str, list[float]] = {}
            for name, t in measured.items():
                read[name] = values[at : at + t.numel()]
                at += t.numel()
            n_heads = group.q.shape[1]
            if "projection" in read:
                for i, rec in enumerate(group.recs):
                    rec.projection_check = torch.tensor(
                        [read["projection"][i], read["size"][i], float(projection_rows)]
                    )
            if "output" not in read:
                continue
            chosen = None if rows is None else rows.get(group.part)
            n_rows = min(group.q.shape[2], SAMPLE_ROWS + 2) if chosen is None else len(chosen)
            for i, (rec, layer) in enumerate(zip(group.recs, group.layers)):
                heads = slice(i * n_heads, (i + 1) * n_heads)
                per_head: dict[str, Any] = {"output": (read["output"][heads], read["output_scale"][heads])}
                if "weights" in read:
                    per_head["weights"] = (read["weights"][heads], read["weights_scale"][heads])
                report_rows[(group.part, layer)] = _rows(group.part, layer, rec, per_head, n_rows, atol, rtol)
        if rest:  # the records no group took, the per-layer way
            add_value_terms(model, [cap], watch, check, only=set(rest), item=b)
        if check == "off":
            reports.append(None)
        elif check == "full":
            reports.append(validate(cap))
        else:
            for part, layer in rest:
                rec = cap.records[(part, layer)]
                chosen = None if rows is None else rows.get(part)
                index = sample_rows(rec.n_queries) if chosen is None else chosen
                compared: dict[str, Any] = dict(record_errors(rec, index))
                if rec.sampled_weights is not None and chosen is None:
                    compared["weights"] = _sampled_weight_errors(rec, index)
                report_rows[(part, layer)] = _rows(part, layer, rec, compared, len(index), atol, rtol)
            ordered = sorted(report_rows.items(), key=lambda kv: (cap.parts.index(kv[0][0]), kv[0][1]))
            reports.append(report(cap, [row for _, made_rows in ordered for row in made_rows], atol, rtol, sample=True))
    return reports


def to_host(made: Iterable[Capture]) -> None:
    """Every tensor of the captures' records copied to the host (:class:`~attnviz.engine.transfer.HostCopies`:
    started without waiting, waited for once). Tensors that view one storage — a group's stacks, GPT-2's
    q, k and v of one fused projection — are one copy of that storage, each record a view of it (unless the
    storage is much larger than what views it: then each tensor is copied alone)."""
    copies = HostCopies()
    done: dict[tuple[int, torch.dtype], Tensor] = {}
    for cap in made:
        for rec in cap.records.values():
            for name, value in vars(rec).items():
                if not isinstance(value, Tensor) or value.device.type == "cpu":
                    continue
                storage = value.untyped_storage()
                n = storage.nbytes() // value.element_size()
                if n > 4 * value.numel() or storage.nbytes() % value.element_size():
                    setattr(rec, name, copies.copy(value))
                    continue
                key = (storage.data_ptr(), value.dtype)
                if key not in done:
                    whole = torch.empty(0, dtype=value.dtype, device=value.device).set_(storage, 0, (n,), (1,))
                    done[key] = copies.copy(whole)
                setattr(rec, name, done[key].as_strided(value.shape, value.stride(), value.storage_offset()))
    copies.wait()
