"""One layer of a padded batch reduced to per-head sums: :func:`reduce_layer`.

One recomputation gives the weights of every text and head of the batch, with every padded key
blocked (zero weight, whatever the model's own mask says) and every padded query row set to zero
weights, so that each sum reads the real rows alone:

- where the mask only allows or blocks and no bias, sinks or soft-cap apply (most models),
  :func:`_weights_and_entropy`: the GEMM, the mask and the softmax of
  :func:`~attnviz.attention.scaled_dot_product`, and each row's entropy as ``Σ a (lse - s)`` from
  the scores (``lse`` read at the row's own key) — no logarithm per weight; otherwise
  :func:`~attnviz.attention.scaled_dot_product` itself and ``-Σ a log a``;
- the mass on each key class (``first``, ``special``, ``punctuation``): the weights summed over
  rows, times the texts' key features; ``distance``, ``self``, ``previous``, ``next``: the weights
  summed over texts, times the (row, key) features — each one product, in float64;
- the detectors' (row, key) pairs gathered;
- given the layer's value norms ``‖f_h(x_j)‖`` (``norms``), the same sums — all but the entropy —
  over each row's shares of what is moved, ``α_ij·‖f_h(x_j)‖ / Σ_k α_ik·‖f_h(x_k)‖`` (the
  ``<name>_moved`` statistics; a chunk holds every key its rows see, so each row's total is whole);
- the self-check's numbers: A·V of the sampled rows of each text against the kernel's own output
  (and an eager kernel's weights, compared while capturing).

Memory stays near :data:`BUDGET` floats of weights per step: long texts are cut into chunks of
query rows (a causal chunk computes only the keys its rows may see).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

import torch
from torch import Tensor

from ..attention import query_chunks, row_entropy, scaled_dot_product, weighted_values
from ..engine.taps import AttentionCall
from ..errors import InputError
from .batch_texts import (
    BLOCKED,
    COLUMNS,
    KEYED,
    PATTERNS,
    POSITIONAL,
    STATISTIC_COLUMNS,
    BatchTexts,
    Chunk,
    ScoreMask,
    rows_of,
)
from .head_tally import HeadTally
from .stats import DETECTORS, STATISTICS

__all__ = [
    "BUDGET",
    "PickedRows",
    "add_masses",
    "key_classes",
    "reduce_layer",
    "special_mass",
    "check_statistics",
    "wanted_columns",
]

BUDGET = 1 << 22  # weights (floats) recomputed per step: a chunk of query rows of the whole batch
_TINY = torch.finfo(torch.float32).tiny
_SAFE_REF = 1e-30  # a reference weight above this reads its logarithm to float precision
_SHORT_ROWS = 16  # rows of fewer keys are softmaxed as whole-tensor operations on the CPU (_softmax)
_KEYED_COLUMNS = frozenset(COLUMNS[:KEYED])
_POSITIONAL_COLUMNS = frozenset(COLUMNS[KEYED : KEYED + POSITIONAL])
_PATTERN_COLUMNS = frozenset(PATTERNS)
_ALL_COLUMNS = frozenset(COLUMNS)
_PATTERN_INDEX = {name: COLUMNS.index(name) for name in PATTERNS}
_OFFSET = {"self": 0, "previous": -1, "next": 1}  # the key of each row i that a positional column reads: i + offset


class PickedRows:
    """Some query rows of each text, kept whole from every layer's recomputed weights while the layer is
    reduced (a probe's pronoun): ``positions`` ``[batch, rows]`` (-1: none; a text's list padded with
    -1). After the forward, ``weights[layer]`` is ``[batch, head, rows, key]`` float32 (0 for a -1 row and
    for the padded keys) and ``causal[layer]`` whether no row of that layer sees a later key."""

    def __init__(self, positions: Tensor) -> None:
        self.positions = positions.long()
        self.weights: dict[int, Tensor] = {}
        self.causal: dict[int, bool] = {}

    def take(self, call: AttentionCall, a: Tensor, start: int, stop: int) -> None:
        """Copy the rows in ``start:stop`` out of a chunk's weights ``a`` ``[batch, head, stop - start, keys]``."""
        b, h, _, keys = a.shape
        if call.layer not in self.weights:
            n = call.q.shape[2] if call.q is not None else keys
            self.weights[call.layer] = torch.zeros(b, h, self.positions.shape[1], n)
            self.causal[call.layer] = _keys_after_blocked(call)
        pos = self.positions.to(a.device)
        texts, rows = torch.nonzero((pos >= start) & (pos < stop), as_tuple=True)
        if texts.numel():
            picked = a[texts, :, pos[texts, rows] - start, :].float().cpu()  # [picked, head, keys]
            self.weights[call.layer][texts.cpu(), :, rows.cpu(), :keys] = picked


@torch.inference_mode()
def reduce_layer(
    call: AttentionCall,
    batch: BatchTexts,
    budget: int = BUDGET,
    norms: Tensor | None = None,
    picked: PickedRows | None = None,
    statistics: bool | Collection[str] = True,
    tally: HeadTally | None = None,
    patterns: bool = False,
) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """One layer of a padded batch: ``[column, head]`` float64 sums over every real query row of
    every text — COLUMNS over the weights, then COLUMNS over the shares of what is moved given the
    layer's value norms ``norms`` ``[batch, head, key]`` (NaN without them) — and the self-check's
    ``{quantity: (max error, max |model|)}``, each ``[batch, head]``. ``picked``: rows of each text
    whose weights are also kept whole (:class:`PickedRows`), from the same recomputation.
    ``statistics=False``: the weights, the picked rows and the check only — no entropy, no sums (NaN);
    with ``patterns``, the detectors' pair sums (``duplicate_token``, ``induction``) are still added, as
    ``statistics=True`` adds them. ``statistics`` as names (:func:`wanted_columns`): those sums alone, the
    others NaN, and no moved one — without ``punctuation`` and ``distance``, no product over every weight
    (:func:`add_masses`).
    ``tally``: where each row's maximum falls, and each role's example rows, added from the same
    weights (:class:`~attnviz.analysis.head_tally.HeadTally`, what the head atlas reads)."""
    q, k, v, out = call.q, call.k, call.v, call.out
    assert q is not None and k is not None and v is not None
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    device = q.device
    want = wanted_columns(statistics, patterns)
    if statistics is not True:
        norms = None  # the moved sums: with every statistic alone
    if norms is not None:
        norms = norms.to(device, torch.float32)
    sums = _zeroed(want, norms is not None, h, device)  # [by weight, moved]: 0 where added to, else NaN
    tallied = tally is not None and tally.full  # the tally reads each row's entropy and special-key mass
    with_entropy = "entropy" in want or tallied
    found: list[Tensor] = []  # per chunk: the check's [2, b, h] (max error, max |model|)
    chunks = list(query_chunks(n, n, b * h, budget=budget))
    causal = len(chunks) > 1 and _keys_after_blocked(call)
    plain = call.bias is None and call.sinks is None and call.softcap is None
    for start, stop in chunks:
        hi = stop if causal else n  # a causal chunk's rows see no key after its last row
        part = batch.chunk(start, stop, hi, device)
        mask = batch.score_mask(call, start, stop, hi) if plain else None
        if mask is not None:
            a, entropy = _weights_and_entropy(call, start, stop, hi, mask, batch.scratch, with_entropy)
        else:
            a, entropy = _weights_then_entropy(
                call, start, stop, hi, batch.additive_mask(call, start, stop, hi), batch.scratch, with_entropy
            )
        # a [b, h, r, hi]: the padded rows and keys 0, so each sum reads the real rows alone
        if picked is not None:
            picked.take(call, a, start, stop)
        # each row's mass on each key class [b, h, r, KEYED] where a sum reads the punctuation (one product
        # over every weight); else each row's mass on its text's special keys alone, gathered
        classes = key_classes(a, part) if "punctuation" in want else None
        special = None
        if classes is not None:
            special = classes[..., 1]
        elif "special" in want or tallied:
            special = special_mass(a, part)
        # [pairs, h]: the detectors' single keys, gathered once for the sums and the tally
        paired = _at_pairs(a, part.pairs) if want & _PATTERN_COLUMNS or tally is not None else None
        if tally is not None:
            visible = batch.visible(call, start, stop, hi, mask)  # [b, r, hi]
            tally.take(
                call.part,
                call.layer,
                a,
                start,
                visible,
                part.keyed[..., 1],
                part.pairs,
                part.columns,
                _PATTERN_INDEX,
                entropy,
                special_mass=special,
                pair_weights=paired,
            )
        if want:
            entropy_sum = None
            if "entropy" in want:
                assert entropy is not None
                entropy_sum = entropy.masked_fill_(part.padded, 0).sum((0, 2))  # padded rows: NaN or not, 0
            add_masses(sums[0], a, part, entropy_sum, classes, paired, start=start, want=want, special=special)
        if norms is not None:  # the shares of what is moved: c_ij = α_ij·‖f_h(x_j)‖ over the row's Σ_k c_ik
            moved = torch.mul(a, norms[:, :, None, :hi], out=batch.scratch("moved", a.shape, a.device))
            total = moved.sum(-1, keepdim=True).clamp_min_(_TINY)  # padded rows: 0 / tiny = 0
            add_masses(sums[1], moved.div_(total), part, None)
        if out is not None and part.checks:  # the self-check: A·V of the sampled rows against the kernel's
            theirs = out[:, start:stop]  # [b, r, h, d]
            if part.checked is not None:  # each text's own sampled rows, picked as whole rows of memory
                u = part.checked.shape[1]
                a = a.reshape(-1, hi).index_select(0, part.picked(h)).view(b, h, u, hi)
                theirs = theirs.reshape(-1, theirs[0, 0].numel()).index_select(0, part.picked(1))
                theirs = theirs.view(b, u, *out.shape[2:])
            theirs = theirs.float()  # [b, rows, h, d]
            mine = weighted_values(a, v[:, :, :hi])  # [b, h, rows, d]
            now = torch.stack([(mine - theirs.transpose(1, 2)).abs_().amax((2, 3)), theirs.abs().amax((1, 3))])
            found.append(now if part.unchecked is None else now.masked_fill_(part.unchecked[:, None], 0))
    errors = {}
    if found:
        err, scale = (found[0] if len(found) == 1 else torch.stack(found).amax(0)).cpu()
        errors["output"] = (err, scale)
    if call.weight_error is not None and call.weight_scale is not None:  # eager: measured while capturing
        errors["weights"] = (call.weight_error.float().cpu(), call.weight_scale.float().cpu())
    return sums.view(-1, h).cpu(), errors


@functools.lru_cache(maxsize=64)
def _template(want: frozenset[str], moved: bool, heads: int, device: str) -> Tensor:
    sums = torch.full((2, len(COLUMNS), heads), float("nan"), dtype=torch.float64, device=device)
    sums[0, [COLUMNS.index(name) for name in want]] = 0.0
    if moved:
        sums[1] = 0.0
    return sums


def _zeroed(want: frozenset[str], moved: bool, heads: int, device: torch.device) -> Tensor:
    """A layer's fresh ``[2, column, head]`` float64 sums: 0 in the wanted columns by weight (and in every
    moved one where ``moved``), NaN in the others (a copy of a template made once per kind)."""
    return _template(want, moved, heads, str(device)).clone()


def wanted_columns(statistics: bool | Collection[str], patterns: bool = False) -> frozenset[str]:
    """The COLUMNS a reduction fills by weight: every one (``statistics=True``), none — or the detectors'
    alone with ``patterns`` — (``False``), or those of the named statistics (:data:`~attnviz.analysis.stats.
    STATISTICS` and :data:`~attnviz.analysis.stats.DETECTORS` names; the detectors' too with ``patterns``)."""
    if statistics is True:
        return _ALL_COLUMNS
    names = set(PATTERNS) if patterns else set()
    if statistics is False:
        return frozenset(names)
    for name in [statistics] if isinstance(statistics, str) else statistics:
        column = STATISTIC_COLUMNS.get(name)
        if column is None or column >= len(COLUMNS):
            known = ", ".join([*STATISTICS, *DETECTORS])
            raise InputError(f"no statistic {name!r} to compute; choose from {known}")
        names.add(COLUMNS[column])
    return frozenset(names)


def check_statistics(statistics: str | Collection[str]) -> None:
    """Refuse, before any model loads, a name that :func:`attnviz.analysis.corpus_stats`' ``statistics=``
    cannot compute: each must be one of :data:`~attnviz.analysis.STATISTICS` or
    :data:`~attnviz.analysis.DETECTORS` (an :class:`~attnviz.errors.InputError` listing them)."""
    wanted_columns(statistics)


def key_classes(a: Tensor, part: Chunk) -> Tensor:
    """Each row's mass on each key class ``[b, h, r, KEYED]`` (float32): one batched product of the
    weights ``a`` ``[b, h, r, keys]`` with the texts' key features (first, special, punctuation) —
    the statistics' sums and the atlas' per-row values read the same product."""
    b, h, r, keys = a.shape
    return torch.bmm(a.view(b, h * r, keys), part.keyed).view(b, h, r, KEYED)


def add_masses(
    sums: Tensor,
    a: Tensor,
    part: Chunk,
    entropy: Tensor | None,
    classes: Tensor | None = None,
    paired: Tensor | None = None,
    *,
    start: int = 0,
    want: frozenset[str] = _ALL_COLUMNS,
    special: Tensor | None = None,
) -> None:
    """Add a chunk's ``a`` [b, h, r, keys] (its weights, or its shares of what is moved; rows
    ``start:start + r``) to the ``[column, head]`` ``sums`` of the COLUMNS in ``want``: the key classes
    (each row's, :func:`key_classes`, summed over rows in float64; ``classes`` where already made), the
    positional features (``a`` summed over the texts in float32, then a product in float64) and the
    detectors' pairs (``paired`` ``[pairs, h]``: ``a`` at them, where already gathered; and the rows'
    ``entropy`` [h] where given). Without ``punctuation`` in ``want`` the key classes need no product
    over every weight: ``first`` is the first key's column and ``special`` each row's mass on its special
    keys (``special`` [b, h, r] where already gathered, :func:`special_mass`); without ``distance``,
    ``self``, ``previous`` and ``next`` are diagonals of ``a`` — each summed in float64."""
    h = a.shape[1]
    f64 = torch.float64
    keyed_wanted = want & _KEYED_COLUMNS
    if keyed_wanted and ("punctuation" in want or classes is not None):
        if classes is None:
            classes = key_classes(a, part)
        sums[:KEYED] += classes.sum((0, 2), dtype=f64).T  # [KEYED, h]: mass on each key class
    elif keyed_wanted:
        if "first" in want:
            sums[COLUMNS.index("first")] += a[..., 0].sum((0, 2), dtype=f64)
        if "special" in want:
            sums[COLUMNS.index("special")] += (special if special is not None else special_mass(a, part)).sum(
                (0, 2), dtype=f64
            )
    positional_wanted = want & _POSITIONAL_COLUMNS
    if "distance" in want:
        by_position = a.sum(0).view(h, -1).double()  # [h, r·hi]: summed over the texts (a handful of terms)
        sums[KEYED : KEYED + POSITIONAL] += torch.mm(part.positional, by_position.T)  # distance, self, previous, next
    else:  # the key i + offset of each row i: a diagonal of each text's and head's [r, keys]
        for name in positional_wanted:
            sums[COLUMNS.index(name)] += a.diagonal(start + _OFFSET[name], -2, -1).sum((0, 2), dtype=f64)
    if entropy is not None:
        sums[KEYED + POSITIONAL] += entropy
    if want & _PATTERN_COLUMNS:
        if paired is None:
            paired = _at_pairs(a, part.pairs)
        sums.index_add_(0, part.columns, paired.double())  # the detectors' single keys


def special_mass(a: Tensor, part: Chunk) -> Tensor:
    """Each row's weight on its text's special keys (after the first) ``[b, h, r]`` float32: the weights at
    ``part.specials`` gathered and summed — the special key class of :func:`key_classes` without a product
    over every key."""
    b, h, r, _ = a.shape
    count = part.specials.shape[1]
    if count == 0:
        return a.new_zeros(b, h, r)
    at = a.gather(-1, part.specials[:, None, None, :].expand(b, h, r, count))
    return at.mul_(part.special_on[:, None, None, :]).sum(-1)


def _at_pairs(a: Tensor, pairs: Tensor) -> Tensor:  # [pairs, h]
    """``a`` ``[b, h, r, keys]`` at each (text, local row, key) of ``pairs`` ``[3, pairs]``, every head."""
    t, i, j = pairs
    return a[t, :, i, j]


def _weights_and_entropy(
    call: AttentionCall,
    start: int,
    stop: int,
    hi: int,
    mask: ScoreMask,
    scratch: Callable[..., Tensor],
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The weights ``softmax(Q·Kᵀ·scale + mask)`` ``[b, h, r, hi]`` of rows ``start:stop`` (as
    :func:`~attnviz.attention.scaled_dot_product` computes them: one GEMM, the mask, a softmax; the
    padded rows then set to 0) and each row's entropy ``[b, h, r]`` (float64; NaN on padded rows)
    without a logarithm per weight. The mask adds nothing to an allowed score, so
    ``-log a_j = lse - s_j`` for every key with weight and the entropy is ``Σ a_j (lse - s_j)``:
    terms ≥ 0, summed without cancellation. ``lse = s_i - log a_ii`` is read at the row's own key
    (its diagonal), in float64; its float32 rounding is added back afterwards. A real row whose own
    key weighs under ``_SAFE_REF`` (its logarithm imprecise) sends the chunk to ``-Σ a log a``.
    ``entropy=False``: the weights alone (None for the entropy)."""
    q, k = call.q, call.k
    assert q is not None and k is not None
    b, h, kv, dh = q.shape[0], q.shape[1], k.shape[1], q.shape[-1]
    r, groups = stop - start, h // kv
    shape = torch.Size((b, h, r, hi))
    q3 = q[:, :, start:stop].float().reshape(b * kv, groups * r, dh)  # GQA: a key/value head's queries at once
    k3 = k[:, :, :hi].float().reshape(b * kv, hi, dh)
    scores = scratch("scores", shape, q.device).view(b * kv, groups * r, hi)
    torch.baddbmm(scores, q3, k3.transpose(1, 2), beta=0, alpha=call.scaling, out=scores)
    scores = scores.view(shape)
    if mask.columns is None:
        scores.add_(mask.scores)
    else:  # the padding alone: its key columns blocked, a slice per padded text
        for t, first in mask.columns:
            scores[t, ..., first:] = BLOCKED
    a = _softmax(scores, scratch("weights", shape, q.device))
    own = a.diagonal(start, -2, -1)  # [b, h, r]: each row's weight on its own key
    for t, first in mask.tails:  # a padded row's scores are all BLOCKED: its weights, even, become 0
        a[t, :, first:].zero_()
    if not entropy:
        return a, None
    if int(torch.count_nonzero(own < _SAFE_REF)) > mask.padded_rows * h:  # padded rows' are 0: a real one is tiny
        return a, _row_entropy(a, scratch)
    lse = scores.diagonal(start, -2, -1).double().sub_(own.double().log_())  # padded rows: inf
    lse32 = lse.float()
    rows = torch.sub(lse32[..., None], scores, out=scores).mul_(a).sum(-1)  # blocked: (lse - BLOCKED)·0
    return a, rows.double().add_(lse.sub_(lse32))  # each real row's weights sum to 1


def _softmax(scores: Tensor, out: Tensor) -> Tensor:
    """``softmax(scores, -1)`` into ``out``. On the CPU, rows of fewer than :data:`_SHORT_ROWS` keys go
    through ``exp(s - max) / Σ`` as four whole-tensor operations: aten's softmax takes a path of its
    own per row there, about five times slower on a batch of 12-token texts."""
    if scores.shape[-1] >= _SHORT_ROWS or scores.device.type != "cpu":
        return torch.ops.aten._softmax.out(scores, -1, False, out=out)
    torch.sub(scores, scores.amax(-1, keepdim=True), out=out).exp_()
    return out.div_(out.sum(-1, keepdim=True))


def _weights_then_entropy(
    call: AttentionCall,
    start: int,
    stop: int,
    hi: int,
    mask: Tensor,
    scratch: Callable[..., Tensor],
    entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The weights by :func:`~attnviz.attention.scaled_dot_product` (any bias, sinks, soft-cap or
    mask) and each row's entropy from them (``-Σ a log a``, :func:`~attnviz.attention.row_entropy`)."""
    q, k, v = call.q, call.k, call.v
    assert q is not None and k is not None and v is not None
    _, a = scaled_dot_product(
        q[:, :, start:stop],
        k[:, :, :hi],
        v[:, :, :hi, :0],  # the weights only
        scale=call.scaling,
        mask=mask,  # with the causal / window structure
        bias=rows_of(call.bias, start, stop, hi),
        sinks=call.sinks,
        softcap=call.softcap,
    )  # [b, h, r, hi]; padded rows and keys 0
    return a, _row_entropy(a, scratch) if entropy else None


def _row_entropy(a: Tensor, scratch: Callable[..., Tensor]) -> Tensor:  # [b, h, r] float64
    return row_entropy(a, scratch("work", a.shape, a.device)).double()


def _keys_after_blocked(call: AttentionCall) -> bool:
    """Whether no query row sees a key after itself (then a chunk of rows needs no later key)."""
    if call.causal:
        return True
    mask = call.mask
    if mask is None or mask.shape[-2] != mask.shape[-1]:
        return False
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    later = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
    return not bool((allowed & later).any())
