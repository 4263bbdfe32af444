"""Long texts on a screen: one head's map pooled to what a screen shows, and a window of it at full resolution.

At 8,192 tokens one head's map has 67 million cells — more than a browser draws or a response
should carry. :func:`overview` pools it into at most ``size × size`` blocks of whole tokens (``max``
shows where any strong cell is, ``mean`` where the mass is), computed in chunks of query rows so
the n×n map never exists whole; :func:`window` recomputes just the rows a zoom shows, at full
resolution (a tile from each row's log-sum-exp, :meth:`Capture.attention`'s ``rows=`` / ``cols=``); :func:`thumbnails` pools every head of a layer to a few cells (a model view's mosaic),
again a chunk of rows at a time. Both use the model's own mask, bias, sinks and scaling, as :meth:`Capture.attention` does.

Each takes a ``measure`` (:data:`MEASURES`): ``"weights"``, the weights α, or ``"moved"``, what the head
moves, ``‖α_ij · f_h(x_j)‖ = α_ij · ‖f_h(x_j)‖`` (:meth:`Capture.moved`): every chunk of weights
is multiplied by the layer's value norms (:meth:`Capture.value_norms`) before it is pooled, so a pooled
cell of "moved" is the max (or mean) of what the block's keys move into its queries, as a pooled cell of weights is the
max (or mean) of its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import attention_output, lse_from_weights
from ..data.words import WordIndex
from ..errors import ArgumentTypeError, InputError, OutOfRangeError

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = [
    "MEASURES",
    "MODEL_VIEW_CELLS",
    "MODES",
    "Overview",
    "ThumbnailPool",
    "WordThumbnailPool",
    "block_edges",
    "check_measure",
    "measure_norms",
    "overview",
    "thumbnails",
    "window",
]

MODES = ("max", "mean")
MEASURES = ("weights", "moved")  # the weights α, or what each head moves: ‖α_ij · f_h(x_j)‖


def check_measure(measure: object) -> str:
    """``measure`` itself when it is one of :data:`MEASURES`, else an :class:`InputError` naming them."""
    if not isinstance(measure, str) or measure not in MEASURES:
        raise InputError(
            f"measure must be 'weights' (the attention weights α) or 'moved' (what each head moves, "
            f"‖α·f(x)‖), got {measure!r}"
        )
    return measure


def measure_norms(cap: Capture, layer: int, measure: str, part: str | None = None) -> Tensor | None:  # [head, key]
    """What a chunk of weights is multiplied by to give ``measure``: None for ``"weights"``, the layer's
    value norms ‖f_h(x_j)‖ for ``"moved"`` (the :class:`InputError` of :meth:`Capture.value_norms` for
    a layer that has none)."""
    if check_measure(measure) == "weights":
        return None
    return cap.value_norms(layer, part=part).float()


@dataclass
class Overview:
    """A head's map pooled into blocks: ``values[i, j]`` covers queries ``row_edges[i]:row_edges[i+1]``
    and keys ``col_edges[j]:col_edges[j+1]``."""

    values: Tensor  # [row blocks, column blocks], float32
    row_edges: list[int]
    col_edges: list[int]
    mode: str

    @property
    def block(self) -> tuple[int, int]:
        """Tokens per block (rows, columns); (1, 1) when nothing is pooled."""
        return self.row_edges[1] - self.row_edges[0], self.col_edges[1] - self.col_edges[0]


def block_edges(n: int, size: int) -> list[int]:
    """Edges of at most ``size`` blocks of equal whole-token width covering ``0..n``."""
    width = -(-n // size)
    return list(range(0, n, width)) + [n]


def _one_head(cap: Capture, layer: int, head: int, part: str | None):
    part = cap.resolve_part(part)
    rec = cap.layer(layer, part)
    index = cap.head_index(layer, head, part)  # the model's head → its place in the record's stacks
    kv = rec.kv_index(index)

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[index : index + 1] if t.shape[0] > 1 else t

    def mask(rows: Tensor, keys: slice) -> Tensor | None:
        return pick(rec.mask_part(rows, keys))

    def bias(rows: Tensor, keys: slice) -> Tensor | None:
        return pick(rec.bias_part(rows, keys))

    return (
        rec,
        index,
        dict(
            q=rec.q[index : index + 1],
            k=rec.k[kv : kv + 1],
            v=rec.v[kv : kv + 1],
            scale=rec.scaling,
            causal=rec.causal,
            window=rec.window,
            mask=mask if rec.mask is not None else None,
            bias=bias if rec.bias is not None or rec.relative_bias is not None else None,
            sinks=None if rec.sinks is None else rec.sinks[index : index + 1],
            softcap=rec.softcap,
        ),
    )


def overview(
    cap: Capture,
    layer: int,
    head: int,
    *,
    part: str | None = None,
    size: int = 512,
    mode: str = "max",
    measure: str = "weights",
) -> Overview:
    """One head's map pooled into at most ``size × size`` blocks (``mode`` ``"max"`` or ``"mean"``).

    ``measure="moved"`` pools what the head moves, α_ij·‖f_h(x_j)‖, instead of its weights: a cell
    is the most (or the mean) a key of the block moves into a query of the block.
    Masked cells count as 0 in a mean. Memory stays at one chunk of rows whatever the length."""
    norms = measure_norms(cap, layer, measure, part)
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise InputError(f"size must be a whole number ≥ 1, got {size!r}")
    rec, at, args = _one_head(cap, layer, head, part)
    n_q, n_k = rec.n_queries, rec.n_keys
    rows, cols = block_edges(n_q, size), block_edges(n_k, size)
    width_r, width_c = rows[1] - rows[0], cols[1] - cols[0]
    n_r, n_c = len(rows) - 1, len(cols) - 1
    device = rec.q.device
    pooled = torch.zeros(n_r, n_c, device=device)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    lse_args = {name: args[name] for name in ("scale", "mask", "bias", "softcap")}
    pad = n_c * width_c - n_k
    for r, keys, _, weights in attention_output(q, k, v, all_keys=True, **args):
        raw = weights[0].float()  # [chunk rows, keys]
        blocks = (torch.nn.functional.pad(raw, (0, pad)) if pad else raw).view(len(r), n_c, width_c)
        block_max = blocks.amax(-1)  # [r, column blocks]: the max-pooled weights, and where each row peaks
        top, block = block_max.max(-1)
        inside = blocks[torch.arange(len(r), device=blocks.device), block].argmax(-1)
        # every key of these rows is here: their log-sum-exp for nothing, kept for the first zoom (O(tile))
        largest = (top[None], (block * width_c + inside)[None])
        rec.keep_lse(r, lse_from_weights(q, k, weights, rows=r, keys=keys, largest=largest, **lse_args), at)
        if norms is None and mode == "max":
            w = block_max
        else:
            w = raw if norms is None else raw * norms[at].to(raw.device)[None, :]
            w = (torch.nn.functional.pad(w, (0, pad)) if pad else w).view(len(r), n_c, width_c)
            w = w.amax(-1) if mode == "max" else w.sum(-1)
        index = (r // width_r).to(device)
        if mode == "max":
            pooled.scatter_reduce_(0, index[:, None].expand_as(w), w, reduce="amax", include_self=True)
        else:
            pooled.index_add_(0, index, w)
    if mode == "mean":
        counts = torch.tensor([b - a for a, b in zip(rows, rows[1:])], device=device, dtype=torch.float32)[:, None]
        counts = counts * torch.tensor([b - a for a, b in zip(cols, cols[1:])], device=device, dtype=torch.float32)
        pooled = pooled / counts
    return Overview(pooled.cpu(), rows, cols, mode)


def window(
    cap: Capture,
    layer: int,
    head: int,
    rows: tuple[int, int],
    keys: tuple[int, int],
    *,
    part: str | None = None,
    measure: str = "weights",
) -> Tensor:  # [rows, keys]
    """The head's exact weights for queries ``rows[0]:rows[1]`` and keys ``keys[0]:keys[1]``,
    computing only that tile from the rows' log-sum-exp (``cap.attention(..., rows=, cols=)``: O(rows ×
    keys) once the layer's log-sum-exp holds the rows, else one pass over their keys first, kept for the
    next zoom); ``measure="moved"``: what it moves there, α_ij·‖f_h(x_j)‖."""
    norms = measure_norms(cap, layer, measure, part)
    rec, at, _ = _one_head(cap, layer, head, part)
    spans = {"rows": (rows, rec.n_queries), "keys": (keys, rec.n_keys)}
    for what, (span, n) in spans.items():
        if not isinstance(span, (tuple, list)) or len(span) != 2 or not all(isinstance(x, int) for x in span):
            raise ArgumentTypeError(f"{what} must be a (start, stop) pair of ints, got {span!r}")
        if not 0 <= span[0] < span[1] <= n:
            raise OutOfRangeError(f"{what} {tuple(span)} is outside 0..{n} (start < stop)")
    out = cap.attention(layer, head, part=part, rows=range(*rows), cols=range(*keys))
    return out if norms is None else out * norms[at, keys[0] : keys[1]].to(out.device)[None, :]


MODEL_VIEW_CELLS = 24  # a model-view thumbnail's cells per side at most (the model view's and summarize's default)


class ThumbnailPool:
    """A consumer of one layer's weight chunks (``rows, keys, weights [head, r, keys]``) that max-pools
    every head's map to ``size = (rows, cols)`` cells, binned exactly as
    ``torch.nn.functional.adaptive_max_pool2d`` bins it; :attr:`pooled` is ``[head, rows, cols]``.
    Chunks may come in any order; under a causal mask a chunk may hold only the keys its rows see
    (the rest of the row is 0, which a max over weights ≥ 0 never picks).

    ``value_norms`` ([head, n_keys], :meth:`Capture.value_norms`): each chunk's weights are multiplied
    by them before pooling, so :attr:`pooled` holds the most the head moves in each cell,
    α_ij·‖f_h(x_j)‖, instead of the largest weight."""

    def __init__(
        self, n_heads: int, n_queries: int, n_keys: int, size: tuple[int, int], value_norms: Tensor | None = None
    ) -> None:
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in size)
        ):
            raise ArgumentTypeError(f"size must be a (rows, cols) pair of ints, got {size!r}")
        t_q, t_k = size
        if not (1 <= t_q <= n_queries and 1 <= t_k <= n_keys):
            raise OutOfRangeError(f"size {tuple(size)} must lie within 1..{n_queries} rows and 1..{n_keys} columns")
        self.n_keys = n_keys
        self.size = (t_q, t_k)
        self.starts = [i * n_queries // t_q for i in range(t_q)]  # adaptive pooling's bins: they may overlap by a row
        self.stops = [-(-(i + 1) * n_queries // t_q) for i in range(t_q)]
        self.key_bins = [(j * n_keys // t_k, -(-(j + 1) * n_keys // t_k)) for j in range(t_k)]
        self.pooled = torch.zeros(n_heads, t_q, t_k)
        if value_norms is not None and tuple(value_norms.shape) != (n_heads, n_keys):
            raise ArgumentTypeError(
                f"value_norms must be [head, key] = ({n_heads}, {n_keys}), got {tuple(value_norms.shape)}"
            )
        self.value_norms = None if value_norms is None else value_norms.float().cpu()

    def add(self, rows: Tensor, keys: slice, weights: Tensor, out: Tensor | None = None) -> None:
        """Pool one chunk: ``rows`` [r] consecutive query rows, their ``keys``, ``weights`` [head, r, keys]."""
        t_q, _ = self.size
        weights = weights.float().cpu()
        k0, k1 = keys.start or 0, keys.stop if keys.stop is not None else self.n_keys
        if self.value_norms is not None:
            weights = weights * self.value_norms[:, None, k0:k1]
        # rows first: each row bin's max down the chunk's rows in it, one vectorised max over whole
        # rows ([head, keys]); then each key bin's max along that small result (0 for a bin the chunk
        # holds no key of: what adaptive_max_pool1d gives for the whole row, whose other keys are 0).
        # Max is exact in any order; the other order (key bins first) took 3× longer on short bins.
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        for i in range(t_q):
            a, b = max(self.starts[i], lo), min(self.stops[i], hi)
            if a < b:
                down = weights[:, a - lo : b - lo].amax(1)  # [head, keys of the chunk]
                across = down.new_zeros(down.shape[0], len(self.key_bins))  # [head, cols]
                for j, (c, d) in enumerate(self.key_bins):
                    c, d = max(c, k0), min(d, k1)
                    if c < d:
                        across[:, j] = down[:, c - k0 : d - k0].amax(-1)
                self.pooled[:, i] = torch.maximum(self.pooled[:, i], across)


class WordThumbnailPool:
    """A consumer of one layer's token chunks (as :class:`ThumbnailPool`) that max-pools every head's map
    *in words* — ``cap.attention(layer, words=True)``, each word's key columns added, its query rows
    averaged — to ``size`` cells, without the word map ever whole: each chunk's key columns are added
    into their words (a scatter-add, :class:`~attnviz.data.words.WordIndex`), the rows of the words the
    chunk holds whole are averaged and pooled at once, and a word cut by the chunk's edge is summed
    until its last row arrives (chunks in any order, each of consecutive rows). O(the chunk) per chunk:
    as costly as the token thumbnails beside it. :attr:`pooled` is ``[head, rows, cols]`` over words,
    binned as ``adaptive_max_pool2d`` bins the word map."""

    def __init__(self, n_heads: int, queries: WordIndex, keys: WordIndex, size: tuple[int, int]) -> None:
        self.queries, self.keys = queries.to("cpu"), keys.to("cpu")
        self.pool = ThumbnailPool(n_heads, queries.n_words, keys.n_words, size)
        of = self.queries.of.tolist()  # once per layer: each word's first and last token
        self.starts: list[int] = [0] * queries.n_words
        self.stops: list[int] = [0] * queries.n_words
        for token in reversed(range(len(of))):
            if of[token] < queries.n_words:
                self.starts[of[token]] = token
        for token, word in enumerate(of):
            if word < queries.n_words:
                self.stops[word] = token + 1
        self.of = of
        self.partial: dict[int, tuple[Tensor, int]] = {}  # a word cut by a chunk's edge: its rows' sum, rows seen
        self.buffer = torch.empty(0)

    @property
    def pooled(self) -> Tensor:
        return self.pool.pooled

    def add(self, rows: Tensor, keys: slice, weights: Tensor, out: Tensor | None = None) -> None:
        """One chunk: ``rows`` [r] consecutive query tokens, their ``keys`` (a slice of the tokens),
        ``weights`` [head, r, keys]."""
        weights = weights.float().cpu()
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        # [head, r, key word]: each word's columns added, in one buffer re-used from chunk to chunk
        summed = self.keys.sum_along(weights, -1, keys, buffer=self.buffer)
        if summed.numel() > self.buffer.numel():
            self.buffer = summed
        n = self.queries.n_words  # a token of no word is n: skipped, as group_matrix's zero column skips it
        first = next((w for w in self.of[lo:hi] if w < n), None)
        last = next((w for w in reversed(self.of[lo:hi]) if w < n), None)
        words: list[int] = []
        inside: list[int] = []
        if first is not None and last is not None:
            words = sorted({first, last})
            inside = [w for w in range(first, last + 1) if lo <= self.starts[w] and self.stops[w] <= hi]
        if inside:  # the words whose every row is here: averaged and pooled now
            a, b = inside[0], inside[-1] + 1
            t0, t1 = self.starts[a], self.stops[b - 1]
            index = self.queries.of[t0:t1] - a
            merged = summed.new_zeros(summed.shape[0], b - a, summed.shape[-1])
            merged.index_add_(1, index, summed[:, t0 - lo : t1 - lo])
            self.pool.add(torch.arange(a, b), slice(None), merged.div_(self.queries.sizes[a:b, None]))
        for w in words:  # a word cut by the chunk's edge: its rows here added to what came before
            if w in inside:
                continue
            t0, t1 = max(self.starts[w], lo), min(self.stops[w], hi)
            row_sum = summed[:, t0 - lo : t1 - lo].sum(1)
            before, seen = self.partial.pop(w, (None, 0))
            row_sum, seen = (row_sum if before is None else before + row_sum), seen + t1 - t0
            if seen == self.stops[w] - self.starts[w]:
                self.pool.add(torch.tensor([w]), slice(None), (row_sum / self.queries.sizes[w])[:, None])
            else:
                self.partial[w] = (row_sum, seen)


def thumbnails(
    cap: Capture, layer: int, size: tuple[int, int], *, part: str | None = None, measure: str = "weights"
) -> Tensor:
    """Every head of one layer, its map max-pooled to ``size = (rows, cols)`` cells, binned exactly as
    ``torch.nn.functional.adaptive_max_pool2d`` bins it (``[head, rows, cols]``) — the model view's
    thumbnails — computed a chunk of query rows at a time (:class:`ThumbnailPool` fed by the layer's
    ``weight_chunks``), so the layer's n×n maps never exist whole. ``measure="moved"``: each cell is
    the most the head moves in its block, α_ij·‖f_h(x_j)‖."""
    norms = measure_norms(cap, layer, measure, part)
    rec = cap.layer(layer, part)
    pool = ThumbnailPool(rec.q.shape[0], rec.n_queries, rec.n_keys, size, value_norms=norms)
    for rows, keys, weights in rec.weight_chunks():
        pool.add(rows, keys, weights)
    return pool.pooled
