"""What the head atlas needs of each layer beyond the corpus statistics: :class:`HeadTally`.

The statistics of :func:`~attnviz.analysis.layer_reduction.reduce_layer` are sums of attention
*mass*. Two roles of the atlas read where each row's *maximum* falls instead (Voita et al. 2019):
a positional head's maximum sits on one relative offset, a rare-word head's on the rarest token the
row sees. :class:`HeadTally` reads them from the same recomputed weights, chunk by chunk, while the
layer is reduced — no second pass over the corpus — and adds them into float64 sums that add up across
processes (:meth:`HeadTally.vector`), keeping for each head and role the row where the role fires most
(its example: text, position, value), which processes combine by taking the largest
(:meth:`HeadTally.examples_vector`).

What it reads of the weights is small (per row: the maximum, its key, three weights); what it does
with that is some forty small operations, each with a fixed cost that on a short text is most of its
time. So each layer's reading waits (:meth:`HeadTally.take`) and a chunk's layers are added at once,
their heads side by side (:meth:`HeadTally.flush`): the numbers are the same to the bit
(``tests/test_throughput_paths.py``), the fixed costs paid once per batch instead of once per layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["EXAMPLES", "OFFSETS", "PENDING", "HeadTally", "row_max"]

OFFSETS = 8  # relative offsets -8..8 each have a bin; a maximum farther away falls in one more bin
PENDING = 1 << 21  # values HeadTally.take holds at most before it adds them (rows · heads, pair weights)
# the roles whose example is the row where the head's per-row value is largest
EXAMPLES = ("previous", "next", "first", "special", "rare", "broad", "focused", "duplicate_token", "induction")


_LOW = (1 << 32) - 1  # the low half of a packed number: the position, counted down (the first wins a tie)


def _packed(values: Tensor, at: Tensor) -> Tensor:
    """Weights (float32, ≥ +0) and each one's position ``at`` (0 ≤ at < 2³², broadcast to ``values``) as
    one int64 each, whose order is the weights' order and, on a tie, the earlier position first: the
    float's bits (which order as the float does for a non-negative one, as :func:`row_max` reads them) in
    the high half, ``_LOW - at`` in the low half. A scatter maximum of these is each group's largest
    weight and its first position at once (with floats: a maximum, a comparison, a second scatter)."""
    return (values.view(torch.int32).long() << 32) | (_LOW - at)


def _unpacked(packed: Tensor) -> tuple[Tensor, Tensor]:
    """(weights float32, positions int64) of :func:`_packed` numbers."""
    return (packed >> 32).to(torch.int32).view(torch.float32), _LOW - (packed & _LOW)


class _Pending:
    """What :meth:`HeadTally.take` read of one chunk's layers, waiting to be added at once: the layers
    (their numbers in the tally) and, per name, each layer's tensor (heads on dimension 1)."""

    def __init__(
        self, visible: Tensor, start: int, keys: int, pairs: Tensor, columns: Tensor, patterns: dict[str, int]
    ) -> None:
        self.visible, self.start, self.keys = visible, start, keys
        self.pairs, self.columns, self.patterns = pairs, columns, dict(patterns)
        self.layers: list[int] = []
        self.taken: dict[str, list[Tensor]] = {}

    def add(self, li: int, taken: dict[str, Tensor]) -> None:
        self.layers.append(li)
        for name, value in taken.items():
            self.taken.setdefault(name, []).append(value)


class _Rows:
    """A chunk's rows, whatever the layer: which are scored ``[b, r]`` (they see ≥ 2 keys), how many
    (``seen``), ``Σ log(keys seen)`` over the real rows (``log_seen``), each key's corpus count ``count``
    ``[b, keys]``, the lowest each row sees ``lowest`` ``[b, r]``, the scored rows whose keys of that count
    hold one token alone ``rare_ok`` ``[b, r]`` (a rarest token to point at: two tokens tied at the lowest
    count leave the row out of the rare-word role) and how many (``rare_seen``); :meth:`shaped` what the
    tally's operations index with, for ``h`` heads, and :meth:`near` the keys each layer's weights are read
    at."""

    def __init__(
        self, scored: Tensor, seen: float, log_seen: float, count: Tensor, lowest: Tensor, rare_ok: Tensor
    ) -> None:
        self.scored, self.seen, self.log_seen, self.count, self.lowest = scored, seen, log_seen, count, lowest
        self.rare_ok, self.rare_seen = rare_ok, float(rare_ok.sum())
        self._shaped: dict[tuple[int, int, int], _Shaped] = {}
        self._near: dict[tuple[int, int, int], Tensor] = {}

    def shaped(self, h: int, start: int, keys: int) -> _Shaped:
        key = (h, start, keys)
        if key not in self._shaped:
            self._shaped[key] = _Shaped(self.scored, h, start, keys)
        return self._shaped[key]

    def near(self, h: int, start: int, keys: int) -> Tensor:
        """``[b, h, r, 3]``: the keys before and after each row and the first key (clamped to the keys)."""
        key = (h, start, keys)
        if key not in self._near:
            b, r = self.scored.shape
            i = torch.arange(start, start + r, device=self.scored.device)
            near = torch.stack([(i - 1).clamp_min(0), (i + 1).clamp_max(keys - 1), torch.zeros_like(i)], -1)
            self._near[key] = near[None, None].expand(b, h, r, 3)
        return self._near[key]


class _Shaped:
    """Index tensors of a chunk of ``[b, h, r, keys]`` weights (rows ``start:start + r``): ``rows``
    ``[r]`` their positions; ``ok`` ``[b, h, r]`` the scored rows; ``base`` ``[b, h, r]`` each row's
    first offset bin (``head · bins``; ``h · bins``, a bin dropped, for a row not scored); ``blocked`` ``[role, h, b, r]`` where each example role of :data:`EXAMPLES` reads no value (not
    scored; no previous key for the first row, no next key for the last); ``at`` ``[b, h, r]`` each
    row's ``text · r + row``."""

    def __init__(self, scored: Tensor, h: int, start: int, keys: int) -> None:
        b, r = scored.shape
        device = scored.device
        n_bins = 2 * OFFSETS + 2
        self.rows = torch.arange(start, start + r, device=device)
        self.ok = scored[:, None, :].expand(b, h, r)
        heads = torch.arange(h, device=device)[None, :, None] * n_bins
        self.base = torch.where(self.ok, heads, h * n_bins)  # [b, h, r] long
        i = self.rows
        blocked = ~self.ok.transpose(0, 1)  # [h, b, r]
        previous, following = blocked | (i < 1), blocked | (i + 1 >= keys)
        self.blocked = torch.stack([previous, following, blocked, blocked, blocked, blocked, blocked])
        assert len(self.blocked) == EXAMPLES.index("duplicate_token")  # the per-row roles, in EXAMPLES' order
        at = torch.arange(b, device=device)[:, None] * r + torch.arange(r, device=device)[None, :]  # [b, r]
        self.at = at[:, None, :].expand(b, h, r)


def row_max(a: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's maximum over the last dimension and its first key, as ``a.max(-1)`` gives them, for
    weights (float32, ≥ +0): a non-negative float's bits, read as an int32, order as the float does, and
    torch's integer argmax is vectorised where its float max with indices is not (≈ 1.5× faster on the
    weights of short rows). A row holding a NaN (unscored: no key it may see) may differ; other
    tensors go to ``a.max(-1)``."""
    if a.dtype != torch.float32 or not a.is_contiguous() or a.device.type != "cpu":
        values, indices = a.max(-1)
        return values, indices
    arg = a.view(torch.int32).argmax(-1)
    return a.gather(-1, arg[..., None])[..., 0], arg


class HeadTally:
    """Per layer and head, over every real query row that sees at least two keys: how often the row's
    maximum falls on each relative offset (``offsets`` ``[layer, head, 2·OFFSETS + 2]``: bins for -8..8,
    then "farther"), how often on the token of the lowest corpus count among the keys the row sees
    (``rare`` ``[layer, head]``, over the ``rare_rows`` ``[layer]`` whose keys hold one token of that count
    alone — two tokens tied there give no rarest token to point at; the counts are ``counts[token id]``),
    how many rows were scored (``rows`` ``[layer]``) and ``Σ log(keys the row sees)`` over every real row
    (``log_keys`` ``[layer]``, the entropy of uniform attention, which the broad and focused roles compare with).

    ``index`` maps a text to its number in the corpus (examples name texts by it; an unknown text
    is -1). Examples: ``best[layer]`` ``[role, head]`` the largest per-row value of each
    :data:`EXAMPLES` role and ``where[layer]`` ``[role, head, 2]`` its (text, position); the same per
    offset bin in ``offset_best`` / ``offset_where`` (the row's maximum weight)."""

    def __init__(
        self, layers: Sequence[int], n_heads: int, counts: Tensor, index: dict[str, int], *, full: bool = True
    ) -> None:
        self.full = full  # False: the detectors' examples alone (what the random sequences' induction reads)
        self.layers = list(layers)
        self.n_heads = n_heads
        self.counts = counts.to(torch.float64)  # [vocab]
        self.index = index
        self.part: str | None = None
        n, h, bins = len(self.layers), n_heads, 2 * OFFSETS + 2
        self.offsets = torch.zeros(n, h, bins, dtype=torch.float64)
        self.rare = torch.zeros(n, h, dtype=torch.float64)
        self.rows = torch.zeros(n, dtype=torch.float64)
        self.rare_rows = torch.zeros(n, dtype=torch.float64)
        self.log_keys = torch.zeros(n, dtype=torch.float64)
        self.best = torch.full((n, len(EXAMPLES), h), float("-inf"), dtype=torch.float64)
        self.where = torch.full((n, len(EXAMPLES), h, 2), -1.0, dtype=torch.float64)
        self.offset_best = torch.full((n, bins, h), float("-inf"), dtype=torch.float64)
        self.offset_where = torch.full((n, bins, h, 2), -1.0, dtype=torch.float64)
        self._ids = torch.zeros(0, dtype=torch.float64)  # the batch's texts' numbers
        self._tokens = torch.zeros(0, 0, dtype=torch.long)  # the batch's token ids [batch, n]
        self._per_mask: dict[int, tuple] = {}  # the batch's rows per chunk and mask (_rows_of)
        self._pending: dict[tuple, _Pending] = {}  # per chunk: what take read of each layer, not yet added
        self._held = 0  # the pending values (rows · heads and pair weights)

    def batch(self, ids: Tensor, texts: Sequence[str]) -> None:
        """The batch whose layers come next: its padded token ids ``[batch, n]`` and its texts (what the
        last batch left pending is added first: :meth:`flush`)."""
        self.flush()
        self._tokens = ids.long()
        self._per_mask = {}
        self._ids = torch.tensor([float(self.index.get(t, -1)) for t in texts], dtype=torch.float64)

    @torch.inference_mode()
    def take(
        self,
        part: str,
        layer: int,
        a: Tensor,
        start: int,
        visible: Tensor,
        special: Tensor,
        pairs: Tensor,
        columns: Tensor,
        patterns: dict[str, int],
        entropy: Tensor | None,
        *,
        special_mass: Tensor | None = None,
        pair_weights: Tensor | None = None,
    ) -> None:
        """Add one chunk of a layer: ``a`` ``[batch, head, rows, keys]`` the weights of rows
        ``start:start + rows`` (0 on padded rows and keys), ``visible`` ``[batch, rows, keys]`` the keys
        each row may see (:meth:`BatchTexts.visible`: one tensor per batch, chunk and mask), ``special``
        ``[batch, keys]`` 1 on special keys after the first, the detectors' (text, local row, key) ``pairs``
        with each pair's column and the columns of
        ``patterns`` (``duplicate_token``, ``induction``), and each row's ``entropy`` ``[batch, head,
        rows]`` (None: no broad / focused examples). ``special_mass`` ``[batch, head, rows]``: each row's
        weight on the special keys where the caller has it already (the statistics' product with the key
        features, :func:`~attnviz.analysis.layer_reduction.key_classes`); else made from ``special``.
        ``pair_weights`` ``[pairs, head]``: the weights at ``pairs`` where the caller has gathered them.

        Here each row's maximum and the few weights the examples read are taken from ``a``; the rest
        (offset bins, rare keys, examples) waits for the chunk's other layers and is added for all of
        them at once — the same operations over their heads side by side, each paying its fixed cost
        once per batch instead of once per layer — by :meth:`flush` (at the next :meth:`batch`, when
        the pending rows pass :data:`PENDING`, and by :class:`~attnviz.workflows.corpus.batched.BatchReducer`
        after each batch). Read the sums after a flush."""
        self.part = part
        li = self.layers.index(layer)
        b, h, r, keys = a.shape
        key = (id(visible), start, keys, id(pairs))
        pending = self._pending.get(key)
        if pending is not None and li in pending.layers:  # the same layer and chunk again: add the first now
            self.flush()
            pending = None
        if pending is None:
            pending = self._pending[key] = _Pending(visible, start, keys, pairs, columns, patterns)
        weights = a[pairs[0], :, pairs[1], pairs[2]] if pair_weights is None else pair_weights  # [pairs, head]
        if not self.full:
            pending.add(li, {"pairs": weights})
        else:
            near = self._rows_of(visible, start, keys, a.device).near(h, start, keys)
            top, arg = row_max(a)  # [b, h, r]: each row's maximum weight and its key
            taken = {"pairs": weights, "top": top, "arg": arg, "near": a.gather(-1, near)}  # near [b, h, r, 3]
            taken["special"] = (
                special_mass if special_mass is not None else torch.einsum("bhrk,bk->bhr", a, special.to(a))
            )
            if entropy is not None:
                taken["entropy"] = entropy.to(a.device, torch.float32)
            pending.add(li, taken)
        self._held += b * h * r + weights.numel()
        if self._held > PENDING:
            self.flush()

    @torch.inference_mode()
    def flush(self) -> None:
        """Add what :meth:`take` left pending, chunk by chunk in the order they came."""
        for pending in self._pending.values():
            self._add(pending)
        self._pending = {}
        self._held = 0

    def _add(self, pending: _Pending) -> None:
        """A chunk's pending layers ``li`` added at once: their heads side by side (``L · h``), then each
        sum and example split back into its layer's."""
        li = pending.layers
        got = {name: torch.cat(parts, 1) for name, parts in pending.taken.items()}  # the head dimension
        start, keys = pending.start, pending.keys
        if self.full:
            top, arg = got["top"], got["arg"]
            b, h, r = top.shape  # h: every pending layer's heads
            rows = self._rows_of(pending.visible, start, keys, top.device)
            shape = rows.shaped(h, start, keys)
            self.rows[li] += rows.seen
            self.rare_rows[li] += rows.rare_seen
            self.log_keys[li] += rows.log_seen
            # each row's maximum's relative offset's bin: -8..8 → 0..16, farther (either side) → 17; rows
            # not scored → a bin dropped
            n_bins = 2 * OFFSETS + 2
            bins = (arg - shape.rows).clamp_(-OFFSETS - 1, OFFSETS + 1).add_(OFFSETS).remainder_(n_bins)
            flat = bins.add_(shape.base).view(-1)  # head · bins + bin; h · bins + bin for a row not scored
            counted = torch.bincount(flat, minlength=(h + 1) * n_bins)[: h * n_bins]
            self.offsets[li] += counted.view(len(li), -1, n_bins).double().cpu()
            # rare: the key of the row's maximum holds the row's one token of the lowest corpus count it sees
            hit = rows.count.gather(1, arg.view(b, -1)).view(b, h, r) == rows.lowest[:, None, :]
            hit = hit.logical_and_(rows.rare_ok[:, None, :])
            self.rare[li] += hit.sum((0, 2)).view(len(li), -1).double().cpu()
            # examples: the row where each role's per-row value is largest (roles in EXAMPLES' order)
            near = got["near"]
            values = [near[..., 0], near[..., 1], near[..., 2], got["special"], top]
            if "entropy" in got:
                values += [got["entropy"], -got["entropy"]]
            # [role, h, b, r]: each head's rows in (text, row) order, one contiguous run per role and head
            stacked = torch.stack([v.transpose(0, 1) for v in values])
            stacked.masked_fill_(shape.blocked[: len(values)], float("-inf"))
            stacked[EXAMPLES.index("rare")].masked_fill_(~hit.transpose(0, 1), float("-inf"))
            self._keep(li, stacked.view(len(values), h, b * r), start, r)
            # per offset bin: the row of highest maximum weight among those whose maximum falls there
            self._keep_binned(li, top, flat, shape.at, start, r)
        self._pattern_examples(li, got["pairs"], start, pending)

    def _pattern_examples(self, li: list[int], weights: Tensor, start: int, pending: _Pending) -> None:
        """The detectors' examples: of each pattern's (text, row, key) pairs, the one of most weight per head
        (``weights`` ``[pairs, layers · head]``: the weights at the chunk's pairs)."""
        for name, column in pending.patterns.items():
            chosen = torch.nonzero(pending.columns == column)[:, 0]
            if not chosen.numel():
                continue
            t, qi, _ = pending.pairs[:, chosen]
            top_pair, at = weights.index_select(0, chosen).max(0)  # [layers · head]
            k = EXAMPLES.index(name)
            top_pair = top_pair.double().cpu().view(len(li), -1)  # [layer, head]
            best, where = self.best[li, k], self.where[li, k]  # copies: [layer, head], [layer, head, 2]
            better = top_pair > best
            self.best[li, k] = torch.where(better, top_pair, best)
            where[..., 0] = torch.where(better, self._ids[t[at].cpu()].view_as(best), where[..., 0])
            where[..., 1] = torch.where(better, (qi[at] + start).double().cpu().view_as(best), where[..., 1])
            self.where[li, k] = where

    def _rows_of(self, visible: Tensor, start: int, keys: int, device: torch.device) -> _Rows:
        """What a chunk's rows are, whatever the layer (:class:`_Rows`). Made once per batch and ``visible``
        (the batch's own tensor for a chunk and mask: layers that share the mask share it)."""
        found = self._per_mask.get(id(visible))
        if found is None:
            seen = visible.sum(-1)  # [b, r]
            scored = seen >= 2
            real = seen >= 1
            tokens = self._tokens[:, :keys].to(device)
            count = self.counts.to(device)[tokens]  # [b, keys]
            inf = torch.full_like(count[:, None, :], float("inf"))
            lowest = torch.where(visible, count[:, None, :], inf).amin(-1)  # [b, r]
            # the tokens at that count among the keys each row sees: one alone, or a tie (the row left out)
            at_lowest = visible & (count[:, None, :] == lowest[..., None])  # [b, r, keys]
            ids = tokens[:, None, :].expand_as(at_lowest)
            alone = torch.where(at_lowest, ids, -1).amax(-1) == torch.where(at_lowest, ids, ids.max() + 1).amin(-1)
            rows = _Rows(
                scored, float(scored.sum()), float(seen[real].double().log().sum()), count, lowest, alone & scored
            )
            found = self._per_mask[id(visible)] = (visible, rows)  # visible kept: its id stays its own
        return found[1]

    def _keep_binned(self, li: list[int], top: Tensor, groups: Tensor, at: Tensor, start: int, r: int) -> None:
        """:meth:`_keep` of each offset bin's examples without a tensor per bin: ``top`` ``[b, layers · h, r]``
        each row's maximum weight, ``groups`` (flat, as ``top``) its head's and bin's number ``head · bins +
        bin`` (``heads · bins`` and over: a row not scored, dropped), ``at`` each row's (text, row) as ``text ·
        r + row``. Per group the largest value and its first (text, row), as :meth:`_keep` picks it, in one
        scatter maximum of :func:`_packed` numbers; a group no row falls in stays -inf, which beats nothing."""
        h = top.shape[1]
        n_bins = self.offset_best.shape[1]
        lowest = torch.iinfo(torch.int64).min
        packed = torch.full(((h + 1) * n_bins,), lowest, dtype=torch.long, device=top.device)
        packed = packed.scatter_reduce_(0, groups, _packed(top, at).view(-1), "amax")[: h * n_bins]
        value, first = _unpacked(packed)
        empty = packed == lowest  # no row of the group in this chunk
        value, first = value.masked_fill_(empty, float("-inf")), first.masked_fill_(empty, 0)
        top_by_bin = value.view(len(li), -1, n_bins).transpose(1, 2).double().cpu()  # [layer, bin, head]
        first = first.view(len(li), -1, n_bins).transpose(1, 2).cpu()
        kept, where = self.offset_best[li], self.offset_where[li]  # copies
        better = top_by_bin > kept
        self.offset_best[li] = torch.where(better, top_by_bin, kept)
        where[..., 0] = torch.where(better, self._ids[first // r], where[..., 0])
        where[..., 1] = torch.where(better, (first % r + start).double(), where[..., 1])
        self.offset_where[li] = where

    def _keep(self, li: list[int], values: Tensor, start: int, r: int) -> None:
        """Keep, per role and head, the largest of ``values`` ``[role, layers · head, batch · rows]`` (its first
        row on a tie: texts before rows) where it beats ``best`` of the layers ``li`` and the first roles of
        :data:`EXAMPLES`."""
        roles = values.shape[0]
        top, at = values.max(-1)  # [role, layers · head]: each run is contiguous, as torch's max reads fastest
        top = top.double().cpu().view(roles, len(li), -1).transpose(0, 1)  # [layer, role, head]
        at = at.cpu().view(roles, len(li), -1).transpose(0, 1)
        best, where = self.best[li, :roles], self.where[li, :roles]  # copies
        better = top > best
        self.best[li, :roles] = torch.where(better, top, best)
        where[..., 0] = torch.where(better, self._ids[at // r], where[..., 0])
        where[..., 1] = torch.where(better, (at % r + start).double(), where[..., 1])
        self.where[li, :roles] = where

    def vector(self) -> Tensor:  # float64: what an all-reduce sums
        """The sums, flat (:meth:`load_vector` takes them back, added over processes)."""
        return torch.cat([self.offsets.flatten(), self.rare.flatten(), self.rows, self.log_keys, self.rare_rows])

    def load_vector(self, vector: Tensor) -> None:
        vector = vector.to("cpu", torch.float64)
        sizes = [t.numel() for t in (self.offsets, self.rare, self.rows, self.log_keys, self.rare_rows)]
        parts = torch.split(vector, sizes)
        self.offsets = parts[0].view_as(self.offsets).clone()
        self.rare = parts[1].view_as(self.rare).clone()
        self.rows = parts[2].clone()
        self.log_keys = parts[3].clone()
        self.rare_rows = parts[4].clone()

    def examples_vector(self) -> Tensor:  # [row, 3] float64: (value, text, position) per role, layer and head
        """The examples, one (value, text, position) row each; :meth:`load_examples` takes the rows of
        every process gathered ``[process, row, 3]`` and keeps the largest value of each."""
        values = torch.cat([self.best.flatten(), self.offset_best.flatten()])
        where = torch.cat([self.where.reshape(-1, 2), self.offset_where.reshape(-1, 2)])
        return torch.cat([values[:, None], where], 1)

    def load_examples(self, gathered: Tensor) -> None:
        gathered = gathered.to("cpu", torch.float64)
        chosen = gathered[..., 0].argmax(0)  # [row]: the process of the largest value
        rows = gathered[chosen, torch.arange(gathered.shape[1])]  # [row, 3]
        n = self.best.numel()
        self.best = rows[:n, 0].view_as(self.best).clone()
        self.where = rows[:n, 1:].reshape(self.where.shape).clone()
        self.offset_best = rows[n:, 0].view_as(self.offset_best).clone()
        self.offset_where = rows[n:, 1:].reshape(self.offset_where.shape).clone()
