"""Head statistics (after Clark et al. 2019, "What does BERT look at?") and pattern detectors.

The detectors and the token classes they count are in :mod:`attnviz.analysis.patterns` (re-exported
here); this module holds the statistics' names and the sums that make them, over captures or a corpus.

All numbers are averages of attention *mass* over query positions, so each lies in [0, 1] except
``distance`` (in tokens) and ``entropy`` (in nats). They are computed from attnviz's recomputed
weights with the model's own mask, at token level.

Each mass (and ``distance`` and every detector) has a moved twin, named ``<statistic>_moved``
(:data:`MOVED_STATISTICS`): the same average taken over the *share of what the head moves* into
the query instead of its weights — for row *i*, ``c_ij / Σ_k c_ik`` with ``c_ij = α_ij·‖f_h(x_j)‖``
(Kobayashi et al. 2020; :meth:`attnviz.Capture.moved`). A head whose weight goes to the
first token but whose values there are near zero has a high ``first`` and a low ``first_moved``.
Layers whose capture holds no value norms (no output projection found, a capture saved before
attnviz 0.20) get NaN there, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import Scratch, row_entropy
from ..errors import InputError
from .patterns import DETECTORS, detect_heads, pattern_matrix, pattern_rows, selected, text_positions
from .patterns import is_punct as is_punct  # its old import path (workflows.batch_texts reads it here)

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture

__all__ = [
    "DETECTORS",
    "MOVED_STATISTICS",
    "STATISTICS",
    "HeadStatsSums",
    "LayerSums",
    "TextSums",
    "detect_heads",
    "head_stats",
    "pattern_matrix",
    "moved_name",
    "pattern_rows",
    "statistic_keys",
    "text_positions",
]

STATISTICS = {
    "first": "mass on the first token ([CLS] in BERT; the attention sink of decoders)",
    "special": "mass on special tokens after the first ([SEP], </s>); NaN if the text has none",
    "punctuation": "mass on punctuation tokens",
    "self": "mass on the query token itself",
    "previous": "mass on the token just before the query",
    "next": "mass on the token just after the query (0 under a causal mask)",
    "distance": "mean |query - key| in tokens, weighted by attention",
    "entropy": "mean entropy of a query's row, in nats (0 = one key, log n = uniform)",
}


# the statistics that gain a moved twin (<name>_moved); every detector does too. The entropy does
# not: the entropy of the moved shares needs a logarithm per weight, twice the pass's cost
MOVED_OF = ("first", "special", "punctuation", "self", "previous", "next", "distance")


def moved_name(statistic: str) -> str:
    """The name of a statistic's moved twin: ``first`` -> ``first_moved``."""
    return f"{statistic}_moved"


MOVED_STATISTICS = {
    moved_name(name): f"{name}, moved: the share of what the head moves into the query (α·‖f(x)‖ normalised per row)"
    + (" instead of its weight" if name != "distance" else ", as the weights of the mean distance")
    for name in (*MOVED_OF, "previous_token", "duplicate_token", "induction")
}


class LayerSums:
    """A consumer of one layer's weight chunks (``rows, keys, weights [head, r, keys]``) that adds up
    the per-head sums behind :func:`head_stats` over its query rows ([head] float64 each, in
    :attr:`sums`): the mass on the ``columns`` keys, on the diagonals (self, previous, next) and on
    each detector's ``targets`` cells, the distance and the entropy — and, given the layer's value
    ``norms`` ``[head, key]`` (``LayerRecord.value_norms``), the same masses and distance over each
    row's shares of what the head moves (``<name>_moved``, :data:`MOVED_STATISTICS`): ``c_ij / Σ_k
    c_ik``, ``c_ij = α_ij·‖f_h(x_j)‖``. Without norms those sums are NaN.

    Chunks may come in any order and may hold only the keys their rows see (the keys a causal
    chunk leaves out have weight 0 and add nothing), but each chunk must hold *every* key its rows
    see — a row's moved total ``Σ_k c_ik`` is taken within its chunk — as the chunks of
    :func:`attnviz.attention.attention_output` and ``LayerRecord.weight_chunks`` do (they cut the
    query rows, never a row's keys)."""

    def __init__(
        self,
        n_heads: int,
        columns: dict[str, Tensor],
        targets: dict[str, Tensor],
        norms: Tensor | None = None,
        scratch: Scratch | None = None,
    ) -> None:
        names = [*columns, "self", "previous", "next", "distance", "entropy", *targets]
        moved = [moved_name(name) for name in names if name != "entropy"]
        self.sums = {name: torch.zeros(n_heads, dtype=torch.float64) for name in names}
        self.sums.update(
            {
                name: torch.full((n_heads,), 0.0 if norms is not None else float("nan"), dtype=torch.float64)
                for name in moved
            }
        )
        if norms is not None and norms.shape[0] != n_heads:
            raise InputError(f"value norms of {norms.shape[0]} heads given for a layer of {n_heads} heads")
        self.norms = None if norms is None else norms.float().cpu()  # [head, key]
        self.columns = columns
        self._scratch = Scratch() if scratch is None else scratch  # the entropy's a·log a, reused by each chunk
        # [cells, 2] (query, key) in row order: a chunk's cells are one slice of them
        self.targets = {name: (cells[:, 0].contiguous(), cells[:, 1].contiguous()) for name, cells in targets.items()}

    def _add(self, name: str, values: Tensor) -> None:  # [head, rows or cells] -> summed in float64
        self.sums[name] += values.sum(-1, dtype=torch.float64)

    def add(self, rows: Tensor, keys: slice, weights: Tensor, out: Tensor | None = None) -> None:
        """Add one chunk: ``rows`` [r] consecutive query rows, their ``keys``, ``weights`` [head, r, keys].

        However many statistics, the chunk's weights are read by one batched product with a few
        features per key — each key class, and the distance's parts left and right of the chunk's
        rows; with value norms each also times the norms, and the norms themselves for each row's
        moved total — and by the entropy's ``a·log a``. The band of keys among the chunk's own rows,
        where ``|i − k|`` changes sign, is taken as it is: every term is ≥ 0, nothing cancels. The
        diagonals and the detectors gather their cells once for both the weights and the shares."""
        a = weights.float().cpu().contiguous()  # [head, chunk rows, keys of the chunk] (sinks' are a slice)
        rows = rows.cpu()
        h, lo, hi = a.shape[0], keys.start, keys.stop
        first, last = int(rows[0]), int(rows[-1])  # a chunk's rows are consecutive
        f = self._key_features(lo, hi, first, last)  # [keys, F]
        norms = None if self.norms is None else self.norms[:, lo:hi]  # [head, keys]
        total = None
        if norms is None:
            per = (a.view(-1, hi - lo) @ f).view(h, -1, f.shape[1])  # [head, r, F]
        else:
            g = torch.cat([f.expand(h, -1, -1), norms[..., None] * f, norms[..., None]], -1)  # [head, keys, 2F + 1]
            both = torch.bmm(a, g)
            per, moved = both[..., : f.shape[1]], both[..., f.shape[1] : -1]
            total = both[..., -1].clamp_min(torch.finfo(torch.float32).tiny)  # [head, r]: Σ_k c_ik (0 rows: 0 / tiny)
        # the band of keys among the chunk's rows, where |i − k| is taken as it is
        b0, b1 = max(lo, first), min(hi, last + 1)
        band = a[:, :, b0 - lo : b1 - lo]  # [head, r, w]
        gap = (rows[:, None] - torch.arange(b0, b1)[None, :]).abs().float()  # [r, w]
        self._features(per, band, gap, rows, name_of=lambda name: name)
        if norms is not None and total is not None:
            shares = band * norms[:, None, b0 - lo : b1 - lo] / total[..., None]
            self._features(moved / total[..., None], shares, gap, rows, name_of=moved_name)
        self._cells(a, rows, keys, norms, total)
        # −Σ_k a·log a in a buffer kept across chunks and layers
        self._add("entropy", row_entropy(a, self._scratch("entropy", a.shape, a.device)))

    def _key_features(self, lo: int, hi: int, first: int, last: int) -> Tensor:
        """``[keys lo:hi, F]``: one column per key class (0/1), then whether the key lies left of the
        chunk's rows ``first..last``, right of them, and its distance from the nearer end on each side."""
        key = torch.arange(lo, hi, dtype=torch.float32)
        c = len(self.columns)
        f = torch.zeros(hi - lo, c + 4)
        for j, index in enumerate(self.columns.values()):
            f[index[(index >= lo) & (index < hi)] - lo, j] = 1.0
        f[: max(0, first - lo), c] = 1.0
        f[max(0, last + 1 - lo) :, c + 1] = 1.0
        f[:, c + 2] = (first - key).clamp_min_(0)
        f[:, c + 3] = (key - last).clamp_min_(0)
        return f

    def _features(self, per: Tensor, band: Tensor, gap: Tensor, rows: Tensor, *, name_of: Callable[[str], str]) -> None:
        """The key classes' masses and the distance from a chunk's ``per`` [head, r, F] (the products
        with :meth:`_key_features`: of the weights, or of the shares of what is moved, into the
        ``_moved`` names) and the ``band`` [head, r, w] of keys among its rows (``gap`` = |i − k|)."""
        c = len(self.columns)
        for j, name in enumerate(self.columns):
            self._add(name_of(name), per[..., j])
        offset = (rows - rows[0]).float()  # i − first; last − i = (last − first) − offset
        distance = offset * per[..., c] + per[..., c + 2] + (offset[-1] - offset) * per[..., c + 1] + per[..., c + 3]
        self._add(name_of("distance"), distance + torch.einsum("hrk,rk->hr", band, gap))

    def _cells(self, a: Tensor, rows: Tensor, keys: slice, norms: Tensor | None, total: Tensor | None) -> None:
        """The diagonals' and detectors' masses: ``a`` gathered at their (query, key) cells once, summed
        as weights and — given the layer's ``norms`` [head, keys] and each row's ``total`` [head, r] —
        as shares of what is moved."""
        first, last, lo, hi = int(rows[0]), int(rows[-1]), keys.start, keys.stop
        flat = a.view(a.shape[0], -1)  # [head, r·keys]: one index_select of columns, much faster than a[:, q, k]

        def add(name: str, query: Tensor, key: Tensor) -> None:
            inside = (key >= lo) & (key < hi)
            query, key = query[inside] - first, key[inside] - lo
            value = flat.index_select(1, query * (hi - lo) + key)  # [head, cells]
            self._add(name, value)
            if norms is not None and total is not None:
                self._add(moved_name(name), value.mul_(norms.index_select(1, key)).div_(total.index_select(1, query)))

        for name, step in (("self", 0), ("previous", -1), ("next", 1)):
            add(name, rows, rows + step)
        for name, (queries, keys_of) in self.targets.items():
            start, stop = torch.searchsorted(queries, torch.tensor([first, last + 1])).tolist()
            add(name, queries[start:stop], keys_of[start:stop])


class TextSums:
    """One text being added to :class:`HeadStatsSums` (:meth:`HeadStatsSums.start`): a
    :class:`LayerSums` per layer (:meth:`layer`), each added to the statistics by :meth:`finish`."""

    def __init__(self, owner: HeadStatsSums, columns: dict[str, Tensor], targets: dict[str, Tensor]) -> None:
        self.owner, self.columns, self.targets = owner, columns, targets

    def layer(self, norms: Tensor | None = None, *, scratch: Scratch | None = None) -> LayerSums:
        """A fresh consumer for one layer's chunks; ``norms`` ``[head, key]``: the layer's value norms
        (``LayerRecord.value_norms``), which the ``_moved`` statistics read (None: they are NaN);
        ``scratch``: a :class:`~attnviz.attention.Scratch` to keep its working buffer in across layers."""
        return LayerSums(self.owner.n_heads, self.columns, self.targets, norms, scratch)

    def finish(self, layer: int, sums: LayerSums) -> None:
        """Add a layer's consumer, fed every chunk of that layer, to the statistics."""
        li = self.owner.layers.index(layer)
        self.owner.sums[:, li] += torch.stack([sums.sums[k] for k in self.owner.keys])


class HeadStatsSums:
    """Per-head sums behind :func:`head_stats`, in float64, that texts are added to one at a time
    and that add up across processes (:meth:`vector` / :meth:`load_vector`): a corpus never has to
    be in memory, and N processes' sums give the one-process numbers."""

    def __init__(
        self, layers: Sequence[int], n_heads: int, *, detectors: bool = True, heads: Sequence[int] | None = None
    ) -> None:
        self.layers = list(layers)
        self.n_heads = n_heads
        # the model's numbers of the n_heads heads summed (capture(heads=) keeps some), None: 0..n_heads - 1
        self.heads = None if heads is None else list(heads)
        if self.heads is not None and len(self.heads) != n_heads:
            raise InputError(f"heads names {len(self.heads)} heads for statistics of {n_heads}")
        self.keys = statistic_keys(detectors=detectors)
        self.sums = torch.zeros(len(self.keys), len(self.layers), n_heads, dtype=torch.float64)
        self.counts = torch.zeros(len(self.keys), dtype=torch.float64)  # scored query rows per statistic
        self.texts = 0
        self.tokens = 0

    @classmethod
    def like(cls, cap: Capture, *, detectors: bool = True) -> HeadStatsSums:
        heads = _stacked_heads(cap)
        return cls(cap.layer_indices(), len(heads), detectors=detectors, heads=heads)

    def add(self, cap: Capture) -> None:
        """Add one text's rows (its capture's one self-attention part)."""
        text = self.start(cap)
        for layer in self.layers:
            rec = cap.layer(layer)
            sums = text.layer(rec.value_norms)
            for rows, keys, weights in rec.weight_chunks():
                sums.add(rows, keys, weights)
            text.finish(layer, sums)

    def start(self, cap: Capture) -> TextSums:
        """Count one text's scored rows and return what its layers' chunks are added through: for
        each layer, :meth:`TextSums.layer` fed every chunk, then :meth:`TextSums.finish` (:meth:`add`
        does just that; :func:`attnviz.analysis.summarize` feeds the chunks from its one pass)."""
        heads = _stacked_heads(cap)
        if cap.layer_indices() != self.layers or heads != (self.heads or list(range(self.n_heads))):
            raise InputError(
                f"a capture with layers {cap.layer_indices()} × heads {_span(heads)} cannot be added to statistics "
                f"of layers {self.layers} × heads {_span(self.heads or list(range(self.n_heads)))}: use one model, "
                "the same layers and the same heads (capture(heads=))"
            )
        detectors = [k for k in self.keys if k in DETECTORS]
        masks = {name: pattern_matrix(cap, name) for name in detectors}
        n = cap.n_tokens
        special, punct = text_positions(cap.text, cap.offsets)
        rows = {
            "first": n,
            "special": n if special else 0,
            "punctuation": n,
            "self": n,
            "previous": n - 1,
            "next": n - 1,
            "distance": n,
            "entropy": n,
        }
        rows.update({name: int(mask.any(-1).sum()) for name, mask in masks.items()})
        rows.update({moved_name(name): rows[name] for name in [*MOVED_OF, *masks]})  # the same rows, moved
        self.counts += torch.tensor([rows[k] for k in self.keys], dtype=torch.float64)
        self.texts += 1
        self.tokens += n
        columns = {
            name: torch.tensor(index, dtype=torch.long)
            for name, index in (("first", [0]), ("special", special), ("punctuation", punct))
        }
        targets = {name: mask.nonzero() for name, mask in masks.items()}  # [cells, 2] (query, key), row-major
        return TextSums(self, columns, targets)

    def add_reduced(self, sums: Tensor, rows: Tensor, *, texts: int, tokens: int) -> None:
        """Add several texts already reduced: ``sums`` ``[statistic, layer, head]`` and ``rows``
        ``[statistic]`` (scored query rows), in :attr:`keys` order (a batch of
        :class:`~attnviz.workflows.corpus.batched.BatchReducer`)."""
        if sums.shape != self.sums.shape or rows.shape != self.counts.shape:
            raise InputError(
                f"reduced sums {tuple(sums.shape)} do not fit statistics of shape {tuple(self.sums.shape)}: "
                "use one model and the same layers"
            )
        self.sums += sums.to(self.sums)
        self.counts += rows.to(self.counts)
        self.texts += texts
        self.tokens += tokens

    def state(self) -> dict:
        """Everything needed to continue adding (a checkpoint)."""
        state = {"layers": self.layers, "n_heads": self.n_heads, "keys": self.keys, "vector": self.vector()}
        return state if self.heads is None else {**state, "heads": self.heads}

    @classmethod
    def from_state(cls, state: dict) -> HeadStatsSums:
        """The sums :meth:`state` saved. A state of other statistics — one saved by an attnviz before
        the ``_moved`` columns, whose sums lack them — is refused (its moved sums were never taken)."""
        detectors = any(k in DETECTORS for k in state["keys"])
        expected = statistic_keys(detectors=detectors)
        if list(state["keys"]) != expected:
            lacking = [k for k in expected if k not in state["keys"]]
            raise InputError(
                "these saved statistics were summed by another attnviz: they hold "
                + (
                    f"no {', '.join(lacking[:3])}{'…' if len(lacking) > 3 else ''} column"
                    if lacking
                    else "other columns"
                )
                + " (a checkpoint from before the moved columns *_moved), so they cannot be continued; start the "
                "run again without --resume (resume=False)"
            )
        sums = cls(state["layers"], state["n_heads"], detectors=detectors, heads=state.get("heads"))
        sums.load_vector(state["vector"])
        return sums

    def clear(self) -> None:
        self.sums.zero_()
        self.counts.zero_()
        self.texts = self.tokens = 0

    def vector(self) -> Tensor:  # float64, what an all-reduce sums
        return torch.cat(
            [self.sums.flatten(), self.counts, torch.tensor([self.texts, self.tokens], dtype=torch.float64)]
        )

    def load_vector(self, vector: Tensor) -> None:
        """Take summed sums (:meth:`vector` of every process, added)."""
        vector = vector.to("cpu", torch.float64)
        n = self.sums.numel()
        self.sums = vector[:n].view_as(self.sums).clone()
        self.counts = vector[n : n + len(self.keys)].clone()
        self.texts, self.tokens = (int(round(float(x))) for x in vector[n + len(self.keys) :])

    def frame(self) -> pd.DataFrame:
        """One row per layer and head: each statistic's mean over its scored rows, and the counts."""
        import pandas as pd

        means = self.sums / self.counts.clamp_min(1)[:, None, None]
        means[self.counts == 0] = float("nan")
        by_head = means.permute(1, 2, 0).reshape(-1, len(self.keys)).tolist()  # [layer · head][statistic]
        rows = []
        for li, layer in enumerate(self.layers):
            for i, head in enumerate(self.heads or range(self.n_heads)):  # the model's numbers
                row: dict[str, float | int] = {"layer": layer, "head": head}
                row.update(zip(self.keys, by_head[li * self.n_heads + i]))
                rows.append(row)
        return pd.DataFrame(rows)


def _stacked_heads(cap: Capture) -> list[int]:
    """The model's numbers of the heads every layer of ``cap`` stacks (all of them, or those
    ``capture(heads=)`` kept); heads that differ from layer to layer are refused: a table has one set."""
    stacks = {tuple(cap.layer(layer).head_numbers) for layer in cap.layer_indices()}
    if len(stacks) > 1:
        raise InputError(
            "this capture keeps different heads in different layers (capture(heads={layer: …})); head statistics "
            "need the same heads in every layer: capture with one list of heads, or pick layers with layers="
        )
    return list(stacks.pop()) if stacks else list(range(cap.n_heads))


def _span(heads: list[int]) -> str:
    return f"0..{heads[-1]}" if heads == list(range(len(heads))) and heads else ",".join(map(str, heads))


def statistic_keys(*, detectors: bool = True) -> list[str]:
    """The columns of :func:`head_stats` after ``layer, head``, in order: :data:`STATISTICS`, the
    :data:`DETECTORS` (with ``detectors``), then their moved twins (:data:`MOVED_STATISTICS`)."""
    base = list(STATISTICS) + (list(DETECTORS) if detectors else [])
    return base + [moved_name(k) for k in base if k in MOVED_OF or k in DETECTORS]


def head_stats(caps: Capture | Sequence[Capture], *, detectors: bool = True, part: str | None = None) -> pd.DataFrame:
    """Per layer and head, the statistics of :data:`STATISTICS`, averaged over every query of every text.

    With ``detectors=True`` the :data:`DETECTORS` scores are added as columns. Then each mass, the
    distance and each detector again, moved: ``<name>_moved`` (:data:`MOVED_STATISTICS`): averaged
    over each row's shares of what the head moves, ``α_ij·‖f_h(x_j)‖ / Σ_k α_ik·‖f_h(x_k)‖``, where
    ``<name>`` averages the weights ``α_ij`` (NaN for a layer the capture holds no value norms of). ``part`` picks the
    encoder or the decoder of an encoder-decoder capture. (Over a corpus too large for memory:
    :func:`attnviz.analysis.corpus_stats`.)
    """
    caps = selected(caps, part)
    if not caps:
        raise InputError("head_stats needs at least one capture")
    sums = HeadStatsSums.like(caps[0], detectors=detectors)
    for cap in caps:
        sums.add(cap)
    return sums.frame()
