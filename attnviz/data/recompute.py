"""The maps a capture recomputes from its records with attnviz's own SDPA (:class:`Recomputation`, a
part of :class:`attnviz.Capture`): the weights, a tile of them from each row's log-sum-exp, a few rows,
the mask, A·V, the scores, and a token map merged into words. Float32, on the records' device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import attention_output, attention_tile, build_mask, online_attention, scaled_dot_product
from ..errors import InputError, OutOfRangeError
from .spans import Span, check_causal, row_index, scale_factor, span_index
from .words import WordIndex, pool_words

if TYPE_CHECKING:
    from .records import LayerRecord
    from .words import TokenSequence

__all__ = ["Recomputation"]


class Recomputation:
    """What :class:`attnviz.Capture` recomputes; it reads the records through the capture's addressing."""

    if TYPE_CHECKING:  # the capture's addressing (attnviz.data.capture), which these methods read

        def resolve_part(self, part: str | None) -> str: ...
        def layer(self, layer: int, part: str | None = None) -> LayerRecord: ...
        def check_head(self, head: int | None, part: str | None = None, layer: int | None = None) -> None: ...
        def sequences(self, part: str | None = None) -> tuple[TokenSequence, TokenSequence]: ...

    def _sdpa_args(self, layer: int, head: int | None, causal: bool | None, scale: bool | float, part: str | None):
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part, layer)
        bias = rec.bias_part()
        sinks = rec.sinks
        index = None if head is None else rec.head_index(head)  # the model's head → its place in the stacks
        if index is None:
            q, k, v = rec.q, rec.k, rec.v
        else:
            q, k, v = rec.head_qkv(index)
            if bias is not None and bias.shape[0] > 1:
                bias = bias[index : index + 1]
            sinks = None if sinks is None else sinks[index : index + 1]
        factor = scale_factor(scale, rec.scaling)
        check_causal(causal, part)
        mask = rec.mask_part()
        if mask is not None and index is not None and mask.shape[0] > 1:
            mask = mask[index : index + 1]
        if causal is None:  # exactly the model's own mask
            kwargs = dict(causal=rec.causal, window=rec.window, mask=None if mask is None else mask[None])
        elif causal is True:
            kwargs = dict(causal=True, window=rec.window if rec.causal else None)
        else:
            kwargs = dict(causal=False)
        return (
            q[None],
            k[None],
            v[None],
            dict(scale=factor, softcap=rec.softcap, bias=None if bias is None else bias[None], sinks=sinks, **kwargs),
        )

    def attention(
        self,
        layer: int,
        head: int | None = None,
        *,
        part: str | None = None,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
        rows: Span = None,
        cols: Span = None,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """Attention weights recomputed by attnviz's own SDPA, in float32.

        - ``head``: the model's number of a query head (``None``: every head the capture kept, stacked
          in the model's order — :meth:`kept_heads` names them); a head ``capture(heads=)`` left out is a
          :class:`~attnviz.errors.HeadNotKeptError`.

        - ``part``: ``"encoder"``, ``"decoder"`` or ``"cross"``; may be left out when the capture has
          one part. Cross-attention is ``[target_pos, source_pos]``.
        - ``causal``: ``None`` uses the model's own mask; ``True`` forces the causal mask (the seeds'
          switch), ``False`` lets every token see every token.
        - ``scale``: ``True`` is the model's own factor (1/√d_k, or GPT-2's per-layer one), ``False``
          switches scaling off (the row collapses toward one-hot), a number sets it.
        - ``temperature``: scores are divided by it before the softmax.
        - ``words``: merge tokens into words — attention *to* a word summed over its tokens, *from*
          a word averaged over its tokens — giving ``[word, word]``.

        - ``rows`` / ``cols``: only this tile of the map, ``[head, r, c]`` (``[r, c]`` for one head) —
          a ``range``, a ``slice``, a sequence of ints or a 1-d tensor of query rows / key columns
          (``None``: all). The tile is ``exp(s − lse)`` from each row's log-sum-exp: O(r · c) once the
          layer's :attr:`LayerRecord.lse` holds the rows (full validation fills it,
          :meth:`log_sum_exp` / ``LayerRecord.fill_lse()`` too), else the rows' log-sum-exp is
          computed first by one pass over their keys in tiles, O(r · key_pos), and — under the model's
          own settings (``causal=None``, ``scale=True``, ``temperature=1``) — kept on the record for
          next time. Other settings compute their rows' log-sum-exp each time; ``words=True`` slices
          the word map (rows and columns are words then). Indices outside the map are an
          :class:`OutOfRangeError`.

        Position biases (T5, ALiBi) are part of the scores; with learned sinks (gpt-oss) each row
        sums to less than 1, the rest being the sink's share (:meth:`sink_share`).
        """
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
            raise InputError(f"temperature must be a number > 0, got {temperature!r}")
        if rows is not None or cols is not None:
            if words:
                return self._word_tile(layer, head, rows, cols, part, causal, scale, float(temperature))
            return self._tile(layer, head, rows, cols, part, causal, scale, float(temperature))
        q, k, v, kwargs = self._sdpa_args(layer, head, causal, scale, part)
        _, weights = scaled_dot_product(q, k, v, temperature=float(temperature), **kwargs)
        weights = weights[0] if head is None else weights[0, 0]
        return self.to_words(weights, part) if words else weights

    def _word_tile(
        self,
        layer: int,
        head: int | None,
        rows: Span,
        cols: Span,
        part: str | None,
        causal: bool | None,
        scale: bool | float,
        temperature: float,
    ) -> Tensor:  # [head, r, c] or [r, c], in words
        """``attention(words=True, rows=, cols=)``: only the token rows of the words asked for (every key),
        merged as :meth:`to_words` merges — O(their tokens × keys), not the whole map."""
        queries, keys = self.sequences(part)
        r = row_index(rows, len(queries.words), "rows", "query words")
        c = span_index(cols, len(keys.words), "cols", "key words")
        spans = [(queries.words[i].token_start, queries.words[i].token_stop) for i in r.tolist()]
        tokens = [t for a, b in spans for t in range(a, b)]
        tile = self._tile(layer, head, tokens, None, part, causal, scale, temperature)  # [.., tokens, keys]
        k_index = WordIndex.of_words(keys.words, keys.n_tokens, tile.device)
        own = [i for i, (a, b) in enumerate(spans) for _ in range(a, b)]  # each token row's place in r
        r_index = WordIndex(
            torch.tensor(own, dtype=torch.long, device=tile.device),
            torch.tensor([b - a for a, b in spans], dtype=torch.float32, device=tile.device),
            len(spans),
            True,
        )
        merged = pool_words(tile, r_index, k_index)
        return merged[..., c] if isinstance(c, slice) else merged.index_select(-1, c.to(merged.device))

    def log_sum_exp(
        self, layer: int, head: int | None = None, *, part: str | None = None, rows: Span = None
    ) -> Tensor:  # [head, r], or [r] for one head
        """Each query row's log-sum-exp ``log Σ_j exp(s_ij)`` (with sinks, their term included) under the
        model's own settings: ``exp(s_ij − lse_i)`` is the weight :meth:`attention` gives. Read from the
        layer's :attr:`LayerRecord.lse`; rows it does not hold yet are computed by one key-tiled pass
        (:func:`attnviz.attention.online_attention`) and kept there."""
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part, layer)
        index = None if head is None else rec.head_index(head)
        lse = rec.log_sum_exp(row_index(rows, rec.n_queries, "rows", "query rows"), index)
        return lse if head is None else lse[0]

    def _tile(
        self,
        layer: int,
        head: int | None,
        rows: Span,
        cols: Span,
        part: str | None,
        causal: bool | None,
        scale: bool | float,
        temperature: float,
    ) -> Tensor:  # [head, r, c] or [r, c]
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part, layer)
        head_at = None if head is None else rec.head_index(head)  # its place in the stacks
        r = row_index(rows, rec.n_queries, "rows", "query rows")
        c = span_index(cols, rec.n_keys, "cols", "key columns")
        check_causal(causal, part)
        args = rec.sdpa_arguments(head_at)
        args["scale"] = scale_factor(scale, rec.scaling)
        if causal is True:
            args.update(causal=True, window=rec.window if rec.causal else None, mask=None)
        elif causal is False:
            args.update(causal=False, window=None, mask=None)
        q, k, v = rec.head_qkv(head_at)
        if causal is None and scale is True and temperature == 1.0:
            lse = rec.log_sum_exp(r, head_at)  # the model's own: kept on the record
        else:
            _, lse = online_attention(q, k, v[..., :0], rows=r, temperature=temperature, **args)
        args.pop("sinks")  # inside lse
        weights = attention_tile(q, k, lse, rows=r, cols=c, temperature=temperature, **args)
        # a row whose every key an additive mask hides (its logits all ≈ float32's min) has a finite lse
        # that float32 cannot tell from its logits: its weights come from the whole map (one wait, rare)
        if bool(((lse < torch.finfo(torch.float32).min / 2) & torch.isfinite(lse)).any()):
            full = self.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature)
            full = full if head is None else full[None]
            full = full.index_select(1, r.to(full.device))
            weights = full[..., c] if isinstance(c, slice) else full.index_select(-1, c.to(full.device))
        return weights if head is None else weights[0]

    def attention_rows(
        self, layer: int, rows: Sequence[int] | Tensor, *, part: str | None = None
    ) -> Tensor:  # [head, len(rows), key_pos]
        """Only these query rows of every head's weights, with the model's own mask, bias and sinks —
        computing just those rows (a pronoun's row, a generation step) instead of the n×n maps."""
        rec = self.layer(layer, part)
        index = torch.as_tensor(rows, dtype=torch.long).flatten()
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < rec.n_queries):
            raise OutOfRangeError(f"rows must lie in 0..{rec.n_queries - 1}, got {index.tolist()[:8]}")
        chunks = [
            weights
            for _, _, _, weights in attention_output(
                rec.q, rec.k, rec.v, rows=index, all_keys=True, **rec.sdpa_arguments()
            )
        ]
        return torch.cat(chunks, dim=1).float() if chunks else torch.zeros(rec.q.shape[0], 0, rec.n_keys)

    def sink_share(self, layer: int, head: int | None = None, *, part: str | None = None) -> Tensor | None:
        """The share of each query row that a learned sink takes (``1 - row sum``), or None without sinks."""
        if self.layer(layer, part).sinks is None:
            return None
        return 1.0 - self.attention(layer, head, part=part).sum(-1)

    def allowed(
        self, layer: int, *, part: str | None = None, causal: bool | None = None
    ) -> Tensor:  # [query_pos, key_pos] bool
        """Which (query, key) pairs the mask lets through (``causal`` as in :meth:`attention`)."""
        _, _, _, kwargs = self._sdpa_args(layer, None, causal, True, part)
        rec = self.layer(layer, part)
        n_q, n_k = rec.n_queries, rec.n_keys
        allowed = build_mask(n_q, n_k, causal=kwargs.get("causal", False), window=kwargs.get("window"))
        allowed = torch.ones(n_q, n_k, dtype=torch.bool) if allowed is None else allowed[0, 0].cpu()
        mask = kwargs.get("mask")
        if mask is not None:
            mask = mask[0].cpu()
            mask = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
            allowed = allowed & mask.all(0)
        return allowed

    def output(
        self, layer: int, head: int | None = None, *, part: str | None = None
    ) -> Tensor:  # [head, pos, d_head_v] or [pos, d_head_v]
        """A·V recomputed by attnviz's own SDPA with the model's mask, bias and scaling, in float32."""
        q, k, v, kwargs = self._sdpa_args(layer, head, None, True, part)
        out, _ = scaled_dot_product(q, k, v, **kwargs)
        return out[0] if head is None else out[0, 0]

    def scores(
        self, layer: int, head: int | None = None, *, part: str | None = None, scale: bool | float = True
    ) -> Tensor:
        """Pre-softmax scores Q·Kᵀ·scale + bias (no mask), float32: ``[head, q, k]`` or ``[q, k]``."""
        q, k, _, kwargs = self._sdpa_args(layer, head, None, scale, part)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        s = (q.float() @ k.float().transpose(-2, -1)) * kwargs["scale"]
        if kwargs["softcap"] is not None:
            s = torch.tanh(s / kwargs["softcap"]) * kwargs["softcap"]
        if kwargs["bias"] is not None:
            s = s + kwargs["bias"].float()
        return s[0] if head is None else s[0, 0]

    def to_words(
        self, weights: Tensor, part: str | None = None
    ) -> Tensor:  # [..., query_pos, key_pos] -> [..., word, word]
        """Merge a token × token matrix into word × word (to a word summed, from a word averaged)."""
        queries, keys = self.sequences(part)
        q_index = WordIndex.of_words(queries.words, queries.n_tokens, weights.device)
        k_index = WordIndex.of_words(keys.words, keys.n_tokens, weights.device)
        return pool_words(weights, q_index, k_index)  # P_q · A · P_kᵀ as scatter-adds: O(n²), not O(n³)
