"""One pass over a capture's heads for everything the heavy views need: :func:`summarize`.

The model view's thumbnails, in tokens and in words (:class:`~attnviz.analysis.overview.ThumbnailPool`,
:class:`~attnviz.analysis.overview.WordThumbnailPool`), the head
statistics (:class:`~attnviz.analysis.stats.LayerSums`), rollout's block means
(:class:`~attnviz.analysis.rollout.RolloutStep`) and the validation's errors over every row
(:class:`~attnviz.data.validate.LayerErrors`) are each a consumer of one layer's chunks
``(rows, keys, weights[, out])``. :func:`summarize` recomputes every layer once, a chunk of query rows
at a time (:func:`attnviz.attention.attention_output`, all heads at once, the layer's n×n maps never
whole), and hands each chunk to all of them — instead of a pass per view. The word thumbnails pool the
same chunks into words with scatter-adds (``P_q · A · P_kᵀ`` without the matrices), never a word map
whole: merging each head's whole map with dense pooling matrices took ~40 s a layer of SmolLM2 at
4,096 tokens. Layers are walked
last to first, the order rollout's right-to-left product needs; the other consumers do not mind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from ..attention import Scratch, attention_output
from ..data.validate import LayerErrors, ValidationReport, layer_rows, report, tolerance
from ..data.words import WordIndex
from ..deprecation import renamed
from .overview import MODEL_VIEW_CELLS, ThumbnailPool, WordThumbnailPool
from .rollout import ROLLOUT_CELLS, RolloutStep, block_means, check_residual, missing_layers
from .stats import HeadStatsSums

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture
    from ..data.records import LayerRecord

__all__ = ["Summary", "summarize"]

# weights (floats) recomputed per chunk: 4× attention_output's default (32 MB), since each chunk
# feeds four consumers whose fixed cost per chunk — rollout's product most — then counts 4× less
# (with the consumers' cheaper passes, SmolLM2's pass at 8,192 tokens went from 157 s to 80–97 s; README)
BUDGET = 1 << 23


@dataclass
class Summary:
    """What :func:`summarize` computed for one self-attention part of a capture."""

    part: str
    layers: list[int]  # the part's captured layers, ascending
    thumb_size: tuple[int, int]  # (query rows, key columns) of each thumbnail
    thumbnails: dict[int, Tensor]  # layer -> [head, t_q, t_k]: thumbnails(cap, layer, thumb_size, part=part)
    word_thumb_size: tuple[int, int] | None  # (query words, key words) of each word thumbnail; None: not asked
    # layer -> [head, w_q, w_k]: adaptive_max_pool2d(cap.attention(layer, words=True), word_thumb_size)
    word_thumbnails: dict[int, Tensor] | None
    stats: HeadStatsSums  # the sums behind head_stats(cap, part=part, detectors=…)
    rollout: Tensor | None  # [m, m]: rollout_blocks(cap, rollout_block, residual=…, part=part); None: rollout_error
    rollout_block: int  # tokens per rollout cell per side
    rollout_error: str | None  # why rollout is None (a layer not captured), else None
    validation: ValidationReport  # validate(cap) restricted to this part's rows (every query row)

    def head_stats(self) -> pd.DataFrame:
        """The table of :func:`attnviz.analysis.head_stats` (``head_stats(cap, part=part)``)."""
        return self.stats.frame()

    @property
    def nbytes(self) -> int:
        """The bytes of its tensors (what a bounded cache counts)."""
        tensors = [*self.thumbnails.values(), self.stats.sums, self.stats.counts]
        shared = {id(t) for t in self.thumbnails.values()}  # word thumbnails that are the token ones
        tensors += [t for t in (self.word_thumbnails or {}).values() if id(t) not in shared]
        tensors += [self.rollout] if self.rollout is not None else []
        return sum(t.numel() * t.element_size() for t in tensors)


def summarize(
    cap: Capture,
    *,
    part: str | None = None,
    thumb_size: tuple[int, int] | None = None,
    rollout_block: int | None = None,
    residual: float = 0.5,
    detectors: bool = True,
    words: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    on_layer: Callable[[int, int], None] | None = None,
) -> Summary:
    """Thumbnails, head statistics, rollout block means and the validation of one self-attention part,
    in one pass over its heads (each layer's attention recomputed once, a chunk of rows at a time).

    - ``part``: the encoder or the decoder of an encoder-decoder capture (``cap.select(part)``; the
      cross-attention is refused, as by :func:`head_stats` and :func:`rollout`).
    - ``thumb_size``: ``(rows, cols)`` of the model view's token thumbnails; ``None`` takes at most
      :data:`~attnviz.analysis.overview.MODEL_VIEW_CELLS` per side.
    - ``rollout_block``: tokens per rollout cell per side; ``None`` takes ``ceil(n / 512)``
      (:data:`~attnviz.analysis.rollout.ROLLOUT_CELLS`); 1 gives ``rollout(cap)[-1]``. Rollout needs every layer: without them
      ``rollout`` is None and ``rollout_error`` says why; the rest is computed all the same.
    - ``residual``, ``detectors``: as :func:`rollout_blocks` and :func:`head_stats` take them.
    - ``words``: also the thumbnails of the maps in words (``cap.attention(layer, words=True)``
      max-pooled to at most :data:`~attnviz.analysis.overview.MODEL_VIEW_CELLS` words per side,
      ``word_thumbnails``), pooled from the same chunks; when every word is one token they are the
      token thumbnails themselves (the same tensors, if their sizes agree).
    - ``on_progress(done, total)``: called after each layer (``done`` = 1…total). If it raises, the pass
      stops and the exception propagates — how a caller cancels; nothing half-done is returned
      (``on_layer=``: its old name, deprecated).
    """
    on_progress = renamed("summarize", "on_layer", on_layer, "on_progress", on_progress)
    sub = cap.select(part)
    name = sub.resolve_part(None)
    layers = sub.layer_indices()
    check_residual(residual)
    n = sub.n_tokens
    block = -(-n // ROLLOUT_CELLS) if rollout_block is None else rollout_block
    means = block_means(n, block)  # [m, n]; checks the block
    size = (min(n, MODEL_VIEW_CELLS), min(n, MODEL_VIEW_CELLS)) if thumb_size is None else thumb_size
    stats = HeadStatsSums.like(sub, detectors=detectors)
    text = stats.start(sub)
    rollout_error = missing_layers(sub)
    result = means.float() if rollout_error is None else None
    atol, rtol = tolerance(sub)
    thumbs: dict[int, Tensor] = {}
    word_thumbs: dict[int, Tensor] = {}
    query_seq, key_seq = sub.sequences(name)
    q_words = WordIndex.of_words(query_seq.words, query_seq.n_tokens)
    k_words = WordIndex.of_words(key_seq.words, key_seq.n_tokens)
    word_size = (min(q_words.n_words, MODEL_VIEW_CELLS), min(k_words.n_words, MODEL_VIEW_CELLS))
    one_token_words = (q_words.n_words, k_words.n_words) == (query_seq.n_tokens, key_seq.n_tokens) and q_words.covered
    word_buffer = None
    pool_words = words and not (one_token_words and k_words.covered and word_size == tuple(size))
    rows: dict[int, list[dict]] = {}
    scratch = Scratch()  # each chunk's scores and weights: weights-sized memory allocated once
    for done, layer in enumerate(reversed(layers), start=1):
        rec = sub.layer(layer)
        pool = ThumbnailPool(rec.q.shape[0], rec.n_queries, rec.n_keys, size)
        word_pool = WordThumbnailPool(rec.q.shape[0], q_words, k_words, word_size) if pool_words else None
        if word_pool is not None and word_buffer is not None:
            word_pool.buffer = word_buffer  # its chunks' key sums: memory allocated once for the pass
        sums = text.layer(rec.value_norms, scratch=scratch)  # the _moved statistics read the value norms
        errors = LayerErrors(rec)
        step = None if result is None else RolloutStep(result, residual=residual)
        for r, keys, weights, out in _chunks(rec, with_values=errors.wanted, scratch=scratch):
            w = weights.float().cpu()  # once for the three consumers that read it on the CPU
            pool.add(r, keys, w)
            if word_pool is not None:
                word_pool.add(r, keys, w)
            sums.add(r, keys, w)
            if step is not None:
                step.add(r, keys, w)
            if errors.wanted:
                errors.add(r, keys, weights, out)
        text.finish(layer, sums)
        thumbs[layer] = pool.pooled
        if words:
            word_thumbs[layer] = pool.pooled if word_pool is None else word_pool.pooled
            word_buffer = None if word_pool is None else word_pool.buffer
        rows[layer] = layer_rows(name, layer, rec, errors.errors(), rec.n_queries, atol, rtol)
        if step is not None:
            result = step.result
        if on_progress is not None:
            on_progress(done, len(layers))
    return Summary(
        part=name,
        layers=layers,
        thumb_size=(int(size[0]), int(size[1])),
        thumbnails={layer: thumbs[layer] for layer in layers},
        word_thumb_size=(int(word_size[0]), int(word_size[1])) if words else None,
        word_thumbnails={layer: word_thumbs[layer] for layer in layers} if words else None,
        stats=stats,
        rollout=None if result is None else result @ means.T,
        rollout_block=block,
        rollout_error=rollout_error,
        validation=report(sub, [row for layer in layers for row in rows[layer]], atol, rtol),
    )


def _chunks(
    rec: LayerRecord, *, with_values: bool, scratch: Scratch
) -> Iterator[tuple[Tensor, slice, Tensor, Tensor | None]]:
    """The layer's chunks ``(rows, keys, weights, out)``: with the real V (and every key when the
    record holds the model's weights, as validation compares them) when there is something to
    validate, else the weights only (``out`` None). Each chunk's weights are in ``scratch``'s
    buffers, valid until the next chunk: no consumer keeps them."""
    if with_values:
        every = rec.weights is not None
        args = rec.sdpa_arguments()
        chunks = attention_output(rec.q, rec.k, rec.v, all_keys=every, budget=BUDGET, scratch=scratch, **args)
        for r, keys, out, weights in chunks:
            yield r, keys, weights, out
    else:
        for r, keys, weights in rec.weight_chunks(budget=BUDGET, scratch=scratch):
            yield r, keys, weights, None
