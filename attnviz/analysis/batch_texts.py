"""What the corpus reduction reads of a padded batch's texts: :class:`BatchTexts`.

The real tokens and each key's features (first, special, punctuation), the scored rows of each
statistic, the rows the self-check samples (as ``capture(check="sample")``), and per chunk of query
rows what its reduction reads (:class:`Chunk`) and the mask it adds (:class:`ScoreMask`), made once
per batch and shared by every layer. The columns of a layer's sums (:data:`COLUMNS`) are laid out
here; :func:`~attnviz.analysis.layer_reduction.reduce_layer` fills them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..attention import Scratch, build_mask
from ..data.validate import SAMPLE_ROWS, sample_rows
from ..engine.taps import AttentionCall
from .stats import DETECTORS, MOVED_OF, moved_name, pattern_rows
from .stats import is_punct as stats_is_punct

__all__ = [
    "BLOCKED",
    "COLUMNS",
    "KEYED",
    "PATTERNS",
    "POSITIONAL",
    "STATISTIC_COLUMNS",
    "BatchTexts",
    "Chunk",
    "ScoreMask",
    "rows_of",
]

# detectors summed over their (row, key) pairs; previous_token is the "previous" statistic
PATTERNS = ("duplicate_token", "induction")
BLOCKED = -1e30  # a blocked score in the plain reduction: finite (its weight × its score is 0, not NaN)

# The columns of reduce_layer's [column, head] sums: COLUMNS over the weights, then the same COLUMNS
# over the shares of what is moved (the moved statistics, <name>_moved; that half's entropy is never
# read), and the column each statistic reads.
COLUMNS = ("first", "special", "punctuation", "distance", "self", "previous", "next", "entropy") + PATTERNS
_BY_WEIGHT = {**{name: COLUMNS.index(name) for name in COLUMNS}, "previous_token": COLUMNS.index("previous")}
STATISTIC_COLUMNS = {
    **_BY_WEIGHT,
    **{moved_name(name): len(COLUMNS) + i for name, i in _BY_WEIGHT.items() if name in MOVED_OF or name in DETECTORS},
}
assert set(STATISTIC_COLUMNS) >= set(DETECTORS)
KEYED = 3  # the first COLUMNS depend on the key alone (its features): a product with the weights' column sums
POSITIONAL = 4  # the next depend on the query and key positions alone: a product with the weights summed over texts


class BatchTexts:
    """What the statistics read of a padded batch's texts: the real tokens, each key's features
    (first, special, punctuation), the scored rows of each statistic, the rows the self-check samples,
    and per chunk of query rows what its reduction reads (:class:`Chunk`) and its mask."""

    def __init__(self, encoded: list, texts: list[str], *, detectors: bool, scratch: Scratch | None = None) -> None:
        self.lengths = [len(ids) for ids, _, _ in encoded]
        self.detectors = detectors
        b, n = len(encoded), max(self.lengths)
        self.ids = torch.tensor([list(ids) + [0] * (n - len(ids)) for ids, _, _ in encoded], dtype=torch.long)
        self.valid = torch.arange(n)[None, :] < torch.tensor(self.lengths)[:, None]  # real tokens (keys and rows)
        where: list[list[int]] = [[], [], []]  # (text, key, feature) of every key feature that is 1
        has_special = []
        for i, ((_, offsets, _), text) in enumerate(zip(encoded, texts)):
            special, punct = _text_positions(text, offsets)
            for feature, keys in enumerate(([0], special, punct)):
                where[0] += [i] * len(keys)
                where[1] += keys
                where[2] += [feature] * len(keys)
            has_special.append(bool(special))
        # per key: first, special (after the first), punctuation
        self.keyed = torch.zeros(b, n, KEYED, dtype=torch.float64)
        self.keyed[where[0], where[1], where[2]] = 1.0
        self.has_special = torch.tensor(has_special)
        self.samples = [_sample_rows(m) for m in self.lengths]  # the rows the self-check compares, per text
        self._cache: dict[tuple, Any] = {}
        self._scratch = scratch if scratch is not None else Scratch()

    def rows(self, keys: list[str]) -> Tensor:  # [statistic] float64: scored query rows over the batch
        n = torch.tensor(self.lengths, dtype=torch.float64)
        counts = {
            "first": n.sum(),
            "special": (n * self.has_special).sum(),
            "punctuation": n.sum(),
            "self": n.sum(),
            "previous": (n - 1).sum(),
            "next": (n - 1).sum(),
            "distance": n.sum(),
            "entropy": n.sum(),
            "previous_token": (n - 1).sum(),
        }
        if self.detectors:
            found = [pattern_rows(self.ids[i, :m].tolist()) for i, m in enumerate(self.lengths)]
            for p, name in enumerate(PATTERNS):
                counts[name] = torch.tensor(float(sum(f[p] for f in found)), dtype=torch.float64)
        counts.update({moved_name(name): count for name, count in list(counts.items())})  # the same rows, moved
        return torch.stack([counts[k].double() for k in keys])

    def chunk(self, start: int, stop: int, keys: int, device: torch.device) -> Chunk:
        """What query rows ``start:stop`` over keys ``:keys`` read (:class:`Chunk`), made once per
        batch and shape: every layer shares it."""
        key = ("chunk", start, stop, keys, str(device))
        found = self._cache.get(key)
        if found is None:
            i = torch.arange(start, stop)[:, None]
            j = torch.arange(keys)[None, :]
            pairs, columns = torch.zeros(3, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
            if self.detectors:
                rows = self.ids[:, start:stop, None]
                shifted = torch.zeros_like(self.ids[:, :keys])  # token j - 1 at key j
                shifted[:, 1:] = self.ids[:, : keys - 1]
                before = (j < i)[None] & self.valid[:, start:stop, None] & self.valid[:, None, :keys]
                patterns = [
                    (rows == self.ids[:, None, :keys]) & before,  # duplicate_token
                    (rows == shifted[:, None, :]) & before & (j >= 1)[None],  # induction
                ]
                each = [torch.stack(torch.nonzero(m, as_tuple=True)) for m in patterns]
                pairs = torch.cat(each, 1)
                columns = torch.cat([torch.full((f.shape[1],), COLUMNS.index(p)) for p, f in zip(PATTERNS, each)])
            r = stop - start
            local = [[row - start for row in rows if start <= row < stop] for rows in self.samples]
            checked = None  # every text samples every row of the chunk: the check reads the weights as they are
            if any(len(rows) < r for rows in local):  # each text's own rows, its last repeated to the longest list
                width = max(1, max(len(rows) for rows in local))
                checked = torch.tensor([rows + [rows[-1] if rows else 0] * (width - len(rows)) for rows in local])
            # each text's special keys (after the first) among the chunk's keys, its list padded with key 0 at 0
            flags = self.keyed[:, :keys, 1] > 0
            specials = torch.zeros(flags.shape[0], int(flags.sum(1).max()) if flags.numel() else 0, dtype=torch.long)
            special_on = torch.zeros(specials.shape)
            for t, row in enumerate(flags):
                where_special = torch.nonzero(row)[:, 0]
                specials[t, : len(where_special)] = where_special
                special_on[t, : len(where_special)] = 1.0
            found = self._cache[key] = Chunk(
                span=(start, stop, keys, device),
                keyed=self.keyed[:, :keys].to(device, torch.float32),  # 0 or 1: exact
                specials=specials.to(device),
                special_on=special_on.to(device),
                padded=~self.valid[:, None, start:stop].to(device),
                pairs=pairs.to(device),
                columns=columns.to(device),
                checked=None if checked is None else checked.to(device),
                checks=any(local),
                unchecked=None if all(local) else torch.tensor([not rows for rows in local]).to(device),
            )
        return found

    def scratch(self, name: str, shape: torch.Size, device: torch.device) -> Tensor:
        """A float32 buffer of this shape (:class:`attnviz.attention.Scratch`): one per name, as large as
        the largest chunk asked of it, that each layer writes into instead of allocating weights-sized
        memory again (the ``scratch`` given, which a caller keeps from batch to batch, or the batch's own)."""
        return self._scratch(name, shape, device)

    def additive_mask(self, call: AttentionCall, start: int, stop: int, keys: int) -> Tensor:
        """The model's mask for a chunk as added scores ``[batch, 1, rows, keys]`` (0 / -inf, or the
        model's own additive values), with every padded key and every padded query row blocked: a
        text sees only its own tokens, and a padded row gets zero weights (its softmax is NaN, set
        to 0). With ``call``'s causal and window structure folded in. Layers that share the model's
        mask share this too."""
        mask, padding = call.mask, call.key_padding
        key = ("mask", _identity(mask), _identity(padding), call.causal, call.window, start, stop, keys)
        found = self._cache.get(key)
        if found is None:
            device = call.q.device if call.q is not None else torch.device("cpu")
            valid = self.on("valid", device)
            real = valid[:, :keys]
            if padding is not None:
                real = real & padding[:, :keys].to(real.device).bool()
            blocked = ~(real[:, None, None, :] & valid[:, None, start:stop, None])  # [b, 1, r, keys]
            if call.causal or call.window is not None:
                allowed = build_mask(
                    stop - start,
                    keys,
                    causal=call.causal,
                    window=call.window,
                    query_positions=torch.arange(start, stop),
                    key_positions=torch.arange(keys),
                    device=device,
                )
                assert allowed is not None
                blocked = blocked | ~allowed
            part = rows_of(mask, start, stop, keys)
            if part is None:
                added = torch.zeros(blocked.shape, device=device).masked_fill_(blocked, float("-inf"))
            elif part.dtype == torch.bool:
                added = torch.zeros(torch.broadcast_shapes(part.shape, blocked.shape), device=device)
                added.masked_fill_(~part.to(device) | blocked, float("-inf"))
            else:
                shape = torch.broadcast_shapes(part.shape, blocked.shape)
                added = part.to(device, torch.float32).expand(shape).masked_fill(blocked, float("-inf"))
            found = self._cache[key] = (mask, padding, added)  # the mask kept: its id stays its own
        return found[2]

    def score_mask(self, call: AttentionCall, start: int, stop: int, keys: int) -> ScoreMask | None:
        """:meth:`additive_mask` for :func:`_weights_and_entropy` when it only allows or blocks (0, or
        at most half the float's lowest) and every real row may see some key; else None. Blocked
        scores become ``BLOCKED``, a finite number."""
        mask, padding = _identity(call.mask), _identity(call.key_padding)
        key = ("score mask", mask, padding, call.causal, call.window, start, stop, keys)
        if key not in self._cache:
            added = self.additive_mask(call, start, stop, keys)
            allowed = added == 0
            blocked = added <= torch.finfo(torch.float32).min / 2
            rows = self.on("valid", added.device)[:, None, start:stop]  # [b, 1, r]
            plain = bool((allowed | blocked).all()) and bool((allowed.any(-1) | ~rows).all())
            found = None
            if plain:
                scores = torch.zeros(added.shape, device=added.device).masked_fill_(blocked, BLOCKED)
                padded = int((~rows).sum())
                # right padding: each padded text's padded rows are the chunk's rows from its length on
                lengths = torch.tensor(self.lengths) - start
                tails = [(t, max(0, int(m))) for t, m in enumerate(lengths.tolist()) if m < stop - start]
                # a mask that blocks the padding alone (an encoder's): each padded text's keys from its length on
                columns = [(t, m) for t, m in enumerate(self.lengths) if m < keys]
                padded_keys = torch.zeros(scores.shape[0], 1, 1, keys, dtype=torch.bool, device=scores.device)
                for t, m in columns:
                    padded_keys[t, ..., m:] = True
                only = torch.equal(blocked | ~rows[..., None], padded_keys | ~rows[..., None])
                found = ScoreMask(scores, tails, padded, columns if only else None)
            self._cache[key] = (call.mask, call.key_padding, found)
        return self._cache[key][2]

    def visible(self, call: AttentionCall, start: int, stop: int, keys: int, mask: ScoreMask | None) -> Tensor:
        """The keys each real row of a chunk may see ``[batch, rows, keys]`` (bool): those ``mask`` (the
        chunk's :meth:`score_mask`) allows, or, without one, where :meth:`additive_mask` is finite. Made once
        per batch and mask: layers that share the model's mask share this tensor."""
        ident = (_identity(call.mask), _identity(call.key_padding), call.causal, call.window)
        key = ("visible", *ident, start, stop, keys, mask is None)
        if key not in self._cache:
            seen = mask.scores == 0 if mask is not None else torch.isfinite(self.additive_mask(call, start, stop, keys))
            visible = seen.any(1) & self.on("valid", seen.device)[:, None, :keys]
            self._cache[key] = (call.mask, call.key_padding, visible)  # the masks kept: their ids stay their own
        return self._cache[key][2]

    def on(self, name: str, device: torch.device) -> Tensor:
        """A per-batch tensor (``valid``) on ``device``, moved once."""
        key = (name, str(device))
        if key not in self._cache:
            self._cache[key] = getattr(self, name).to(device)
        return self._cache[key]


@dataclass
class ScoreMask:
    """The mask :func:`_weights_and_entropy` adds: ``scores`` 0 or ``BLOCKED`` ``[b, 1, r, keys]``;
    ``tails`` the padded query rows as (text, first padded local row) — the texts are right-padded, so
    a text's padded rows are the chunk's rows from there on — whose weights are set to 0 (a slice each,
    not a product over the whole chunk), and how many rows are padded. ``columns``: where the mask
    blocks nothing but the padding (besides the padded rows, which ``tails`` sets to 0), each padded
    text's first padded key (text, key): its scores from there on are set to ``BLOCKED`` (a slice each)
    instead of adding ``scores`` to every score — the same numbers, as ``s + BLOCKED`` is ``BLOCKED``
    in float32 for any score; None: ``scores`` is added."""

    scores: Tensor
    tails: list[tuple[int, int]]
    padded_rows: int
    columns: list[tuple[int, int]] | None = None


@dataclass
class Chunk:
    """What a chunk of query rows reads of its batch, on the layers' device: its ``span`` (first and
    last + 1 row, keys, device), whose :attr:`positional` features are made when first read (a sum of
    the distance); ``keyed`` the key features ``[batch, keys, KEYED]``
    (float32, 0 or 1) and each text's special keys ``specials`` ``[batch, S]`` (those after the first,
    below ``keys``; a shorter list padded with key 0, whose ``special_on`` ``[batch, S]`` is 0 where a
    real one's is 1); ``padded`` the padded query rows ``[batch, 1, rows]``; ``pairs`` the detectors'
    (text, local row, key) ``[3, pairs]`` with each pair's column of COLUMNS; ``checked`` the local
    rows each text's self-check reads ``[batch, rows]`` (None: every row of every text), ``checks``
    whether any text samples a row of the chunk and ``unchecked`` the texts that sample none (None:
    none)."""

    span: tuple[int, int, int, torch.device]
    keyed: Tensor
    specials: Tensor
    special_on: Tensor
    padded: Tensor
    pairs: Tensor
    columns: Tensor
    checked: Tensor | None
    checks: bool
    unchecked: Tensor | None
    _picked: dict[int, Tensor] = field(default_factory=dict)

    @functools.cached_property
    def positional(self) -> Tensor:
        """The POSITIONAL features of each (row, key) ``[feature, rows·keys]`` (float64: ``|i - j|`` and
        whether ``j`` is ``i``, ``i - 1``, ``i + 1``)."""
        start, stop, keys, device = self.span
        i, j = torch.arange(start, stop)[:, None], torch.arange(keys)[None, :]
        features = torch.stack([(i - j).abs(), j == i, j == i - 1, j == i + 1]).to(torch.float64)
        return features.view(POSITIONAL, -1).to(device)

    def picked(self, heads: int) -> Tensor:
        """The ``checked`` rows as indices into ``[batch·heads·rows]`` (each text's rows in each head)."""
        found = self._picked.get(heads)
        if found is None:
            assert self.checked is not None
            b, rows = self.checked.shape[0], self.padded.shape[-1]
            first = torch.arange(b * heads, device=self.checked.device).view(b, heads, 1) * rows
            found = self._picked[heads] = (first + self.checked[:, None]).view(-1)
        return found


@functools.lru_cache(maxsize=1 << 16)
def _is_punct(text: str) -> bool:  # stats' own test, remembered: a corpus repeats its punctuation
    return stats_is_punct(text)


def _text_positions(text: str, offsets: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """:func:`~attnviz.analysis.stats.text_positions`, with the punctuation test remembered."""
    special = [i for i, (start, end) in enumerate(offsets) if start == end and i != 0]
    punct = [i for i, (s, e) in enumerate(offsets) if e > s and _is_punct(text[s:e])]
    return special, punct


@functools.lru_cache(maxsize=4096)
def _sample_rows(n: int) -> list[int]:
    return sample_rows(n, SAMPLE_ROWS).tolist()


def _identity(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, str(t.device))


def rows_of(t: Tensor | None, start: int, stop: int, keys: int) -> Tensor | None:
    """Rows ``start:stop`` and keys ``:keys`` of a ``[batch|1, head|1, query|1, key]`` mask or bias."""
    if t is None:
        return None
    return t[..., start:stop, :keys] if t.shape[-2] > 1 else t[..., :keys]
