"""What the head atlas needs of each layer beyond the corpus statistics: :class:`HeadTally`.

The statistics of :func:`~attnviz.workflows.layer_reduction.reduce_layer` are sums of attention
*mass*. Two roles of the atlas read where each row's *maximum* falls instead (Voita et al. 2019):
a positional head's maximum sits on one relative offset, a rare-word head's on the rarest token the
row sees. :class:`HeadTally` adds them from the same recomputed weights, chunk by chunk, while the
layer is reduced — no second pass over the corpus — into float64 sums that add up across processes
(:meth:`HeadTally.vector`), and keeps for each head and role the row where the role fires most (its
example: text, position, value), which processes combine by taking the largest
(:meth:`HeadTally.examples_vector`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["EXAMPLES", "OFFSETS", "HeadTally"]

OFFSETS = 8  # relative offsets -8..8 each have a bin; a maximum farther away falls in one more bin
# the roles whose example is the row where the head's per-row value is largest
EXAMPLES = ("previous", "next", "first", "special", "rare", "broad", "focused", "duplicate_token", "induction")


class HeadTally:
    """Per layer and head, over every real query row that sees at least two keys: how often the row's
    maximum falls on each relative offset (``offsets`` ``[layer, head, 2·OFFSETS + 2]``: bins for -8..8,
    then "farther"), how often on a token of the lowest corpus count among the keys the row sees
    (``rare`` ``[layer, head]``; the counts are ``counts[token id]``), how many rows were scored
    (``rows`` ``[layer]``) and ``Σ log(keys the row sees)`` over every real row (``log_keys`` ``[layer]``,
    the entropy of uniform attention, which the broad and focused roles compare with).

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
        self.log_keys = torch.zeros(n, dtype=torch.float64)
        self.best = torch.full((n, len(EXAMPLES), h), float("-inf"), dtype=torch.float64)
        self.where = torch.full((n, len(EXAMPLES), h, 2), -1.0, dtype=torch.float64)
        self.offset_best = torch.full((n, bins, h), float("-inf"), dtype=torch.float64)
        self.offset_where = torch.full((n, bins, h, 2), -1.0, dtype=torch.float64)
        self._ids = torch.zeros(0, dtype=torch.float64)  # the batch's texts' numbers
        self._tokens = torch.zeros(0, 0, dtype=torch.long)  # the batch's token ids [batch, n]
        self._per_mask: dict[int, tuple] = {}  # the batch's rows per chunk and mask (_rows_of)

    def batch(self, ids: Tensor, texts: Sequence[str]) -> None:
        """The batch whose layers come next: its padded token ids ``[batch, n]`` and its texts."""
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
        features, :func:`~attnviz.workflows.layer_reduction.key_classes`); else made from ``special``.
        ``pair_weights`` ``[pairs, head]``: the weights at ``pairs`` where the caller has gathered them."""
        self.part = part
        li = self.layers.index(layer)
        if not self.full:
            self._pattern_examples(li, a, start, pairs, columns, patterns, pair_weights)
            return
        b, h, r, keys = a.shape
        device = a.device
        scored, rows_seen, log_seen, count, lowest = self._rows_of(visible, start, keys, device)
        self.rows[li] += rows_seen
        self.log_keys[li] += log_seen
        rows = torch.arange(start, start + r, device=device)
        top, arg = a.max(-1)  # [b, h, r]: each row's maximum weight and its key
        offset = arg - rows[None, None, :]
        bins = torch.where(offset.abs() <= OFFSETS, offset + OFFSETS, torch.full_like(offset, 2 * OFFSETS + 1))
        n_bins = 2 * OFFSETS + 2
        heads = torch.arange(h, device=device)[None, :, None].expand(b, h, r)
        ok = scored[:, None, :].expand(b, h, r)
        flat = (heads * n_bins + bins)[ok]
        self.offsets[li] += torch.bincount(flat, minlength=h * n_bins).view(h, n_bins).double().cpu()
        # rare: the key of the row's maximum holds a token of the lowest corpus count the row sees
        hit = (count.gather(1, arg.view(b, -1)).view(b, h, r) == lowest[:, None, :]) & ok
        self.rare[li] += hit.sum((0, 2)).double().cpu()
        # examples: the row where each role's per-row value is largest
        neg = torch.tensor(float("-inf"), device=device)
        i = rows[None, None, :]
        previous = a.gather(-1, (i - 1).clamp_min(0).expand(b, h, r)[..., None])[..., 0]
        following = a.gather(-1, (i + 1).clamp_max(keys - 1).expand(b, h, r)[..., None])[..., 0]
        values = {
            "previous": torch.where(ok & (i >= 1), previous, neg),
            "next": torch.where(ok & (i + 1 < keys), following, neg),
            "first": torch.where(ok, a[..., 0], neg),
            "special": torch.where(
                ok, special_mass if special_mass is not None else torch.einsum("bhrk,bk->bhr", a, special.to(a)), neg
            ),
            "rare": torch.where(hit, top, neg),
        }
        if entropy is not None:
            e = entropy.to(device, torch.float32)
            values["broad"] = torch.where(ok, e, neg)
            values["focused"] = torch.where(ok, -e, neg)
        kept = EXAMPLES[: len(values)]  # the first roles of EXAMPLES, in its order: one maximum for all
        assert tuple(values) == kept
        self._keep(self.best[li, : len(kept)], self.where[li, : len(kept)], torch.stack(list(values.values())), start)
        self._pattern_examples(li, a, start, pairs, columns, patterns, pair_weights)
        # per offset bin: the row of highest maximum weight among those whose maximum falls there
        self._keep_binned(li, torch.where(ok, top, neg), heads * n_bins + bins, start)

    def _pattern_examples(
        self,
        li: int,
        a: Tensor,
        start: int,
        pairs: Tensor,
        columns: Tensor,
        patterns: dict[str, int],
        pair_weights: Tensor | None = None,
    ) -> None:
        """The detectors' examples: of each pattern's (text, row, key) pairs, the one of most weight per head
        (``pair_weights`` ``[pairs, head]``: the weights at ``pairs``, gathered once; else gathered here)."""
        for name, column in patterns.items():
            chosen = columns == column
            if not bool(chosen.any()):
                continue
            t, qi, kj = pairs[:, chosen]
            weights = a[t, :, qi, kj] if pair_weights is None else pair_weights[chosen]  # [pairs, head]
            top_pair, at = weights.max(0)
            k = EXAMPLES.index(name)
            better = top_pair.double().cpu() > self.best[li, k]
            self.best[li, k] = torch.where(better, top_pair.double().cpu(), self.best[li, k])
            text = self._ids[t[at].cpu()]
            position = (qi[at] + start).double().cpu()
            self.where[li, k, :, 0] = torch.where(better, text, self.where[li, k, :, 0])
            self.where[li, k, :, 1] = torch.where(better, position, self.where[li, k, :, 1])

    def _rows_of(
        self, visible: Tensor, start: int, keys: int, device: torch.device
    ) -> tuple[Tensor, float, float, Tensor, Tensor]:
        """What a chunk's rows are, whatever the layer: which are scored ``[b, r]``, how many, ``Σ log(keys
        seen)``, each key's corpus count ``[b, keys]`` and the lowest each row sees ``[b, r]``. Made once per
        batch and ``visible`` (the batch's own tensor for a chunk and mask: layers that share the mask share it)."""
        found = self._per_mask.get(id(visible))
        if found is None:
            seen = visible.sum(-1)  # [b, r]
            scored = seen >= 2
            real = seen >= 1
            tokens = self._tokens[:, :keys].to(device)
            count = self.counts.to(device)[tokens]  # [b, keys]
            inf = torch.full_like(count[:, None, :], float("inf"))
            lowest = torch.where(visible, count[:, None, :], inf).amin(-1)  # [b, r]
            numbers = (scored, float(scored.sum()), float(seen[real].double().log().sum()), count, lowest)
            found = self._per_mask[id(visible)] = (visible, *numbers)  # visible kept: its id stays its own
        return found[1:]

    def _keep_binned(self, li: int, top: Tensor, groups: Tensor, start: int) -> None:
        """:meth:`_keep` of each offset bin's examples without a tensor per bin: ``top`` ``[b, h, r]`` each
        row's maximum weight (-inf: a row not scored), ``groups`` ``[b, h, r]`` its head's and bin's number
        ``head · bins + bin``. Per group the largest value (a scatter maximum) and its first (text, row), as
        :meth:`_keep` picks it; a group no row falls in stays -inf, which beats nothing."""
        b, h, r = top.shape
        n_bins = self.offset_best.shape[1]
        values = top.permute(1, 0, 2).reshape(-1)  # head by head, each in (text, row) order
        groups = groups.permute(1, 0, 2).reshape(-1)
        at = torch.arange(b * r, device=top.device).repeat(h)  # each value's (text, row) as text · r + row
        best = torch.full((h * n_bins,), float("-inf"), dtype=top.dtype, device=top.device)
        best = best.scatter_reduce(0, groups, values, "amax")
        tops = (values == best[groups]) & (values > float("-inf"))  # each group's largest, on every tie
        first = torch.full((h * n_bins,), b * r, dtype=torch.long, device=top.device)
        first = first.scatter_reduce(0, groups[tops], at[tops], "amin").clamp_max_(b * r - 1)
        top_by_bin = best.view(h, n_bins).T.double().cpu()  # [bin, head]
        first = first.view(h, n_bins).T.cpu()
        better = top_by_bin > self.offset_best[li]
        self.offset_best[li] = torch.where(better, top_by_bin, self.offset_best[li])
        where = self.offset_where[li]
        where[..., 0] = torch.where(better, self._ids[first // r], where[..., 0])
        where[..., 1] = torch.where(better, (first % r + start).double(), where[..., 1])

    def _keep(self, best: Tensor, where: Tensor, values: Tensor, start: int) -> None:
        """Keep, per role and head, the largest of ``values`` ``[role, batch, head, rows]`` (its first row on
        a tie, texts before rows) if it beats ``best`` ``[role, head]``; ``where`` ``[role, head, 2]``."""
        roles, b, h, r = values.shape
        top, at = values.permute(0, 2, 1, 3).reshape(roles, h, -1).max(-1)  # [role, head]
        top = top.double().cpu()
        at = at.cpu()
        better = top > best
        best.copy_(torch.where(better, top, best))
        where[..., 0] = torch.where(better, self._ids[at // r], where[..., 0])
        where[..., 1] = torch.where(better, (at % r + start).double(), where[..., 1])

    def vector(self) -> Tensor:  # float64: what an all-reduce sums
        """The sums, flat (:meth:`load_vector` takes them back, added over processes)."""
        return torch.cat([self.offsets.flatten(), self.rare.flatten(), self.rows, self.log_keys])

    def load_vector(self, vector: Tensor) -> None:
        vector = vector.to("cpu", torch.float64)
        sizes = [self.offsets.numel(), self.rare.numel(), self.rows.numel(), self.log_keys.numel()]
        parts = torch.split(vector, sizes)
        self.offsets = parts[0].view_as(self.offsets).clone()
        self.rare = parts[1].view_as(self.rare).clone()
        self.rows = parts[2].clone()
        self.log_keys = parts[3].clone()

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
