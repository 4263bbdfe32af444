"""What one attention layer's kernel saw and produced (:class:`LayerRecord`): the data model of a
Capture's layers. How the calls a tap records become records is the workflows' business
(:mod:`attnviz.workflows.capture.call_records`); this module imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import Scratch, attention_output, online_attention
from ..errors import HeadNotKeptError

__all__ = ["LayerRecord"]


@dataclass
class LayerRecord:
    """What one attention layer's kernel saw and produced, for one input."""

    name: str  # the module's name in the model, e.g. "model.layers.3.self_attn"
    q: Tensor  # [head, query_pos, d_head], after RoPE
    k: Tensor  # [kv_head, key_pos, d_head], after RoPE, before GQA expansion
    v: Tensor  # [kv_head, key_pos, d_head_v]
    out: Tensor | None  # [head, query_pos, d_head_v], the model's own attention output (A·V)
    weights: Tensor | None  # [head, query_pos, key_pos], the model's own weights (eager, keep_weights=True)
    scaling: float  # the factor on Q·Kᵀ the model used
    causal: bool
    window: int | None = None  # sliding window, when the model used one
    softcap: float | None = None
    mask: Tensor | None = (
        None  # [query_pos, key_pos] or [head, q, k]: bool / additive, only when causal+window do not describe it
    )
    bias: Tensor | None = None  # [head or 1, query_pos or 1, key_pos] added to the scores (ALiBi, position bias)
    relative_bias: Tensor | None = (
        None  # [head, query_pos + key_pos - 1]: bias[h, i, j] = relative_bias[h, j - i + query_pos - 1]
    )
    sinks: Tensor | None = None  # [head] learned sink logits: one more entry in each row's softmax
    weight_error: Tensor | None = None  # [head] max |recomputed - model's weights|, measured while capturing
    weight_scale: Tensor | None = None  # [head] max |model's weights|
    # what each head moves (Kobayashi et al. 2020): f_h(x_j) = W_O^h v_j, the head's slice of the
    # output projection applied to the value; [h, j, t] = f_h(x_j)·f_h(x_{j-t}) for t < the longest
    # word of the keys (0 where j - t < 0), so [..., 0] is ‖f_h(x_j)‖². None: no output projection found
    value_dots: Tensor | None = None  # [head, key_pos, width]
    # Σ_h Σ_j α_ij f_h(x_j) + b against the model's own projection output over a sample of rows,
    # measured while capturing: (max |error|, a bound on the size of the terms summed, rows compared)
    projection_check: Tensor | None = None  # [3]
    # transient, while capturing: the model's own weights at the rows the self-check samples
    # (:func:`attnviz.attention.spread_rows`), compared there and dropped (only their errors are kept)
    sampled_weights: Tensor | None = None  # [head, sample rows, key_pos]
    # each query row's log-sum-exp of its logits under the model's own settings, sinks included, so that
    # any tile of weights is exp(s - lse) in O(tile) (Capture.attention(rows=, cols=)); filled by full
    # validation and by fill_lse(), a row at a time as tiles ask for them: NaN where not computed yet,
    # -inf for a row whose every key is masked
    lse: Tensor | None = None  # [head, query_pos]
    # the model's numbers of the query heads stacked in q (and every [head, …] tensor), in order, when a
    # capture kept some heads only (capture(heads=)); None: every head, stacked in the model's order
    heads: list[int] | None = None
    # the model's key/value head each of ``heads`` reads; k and v stack these, once each, in order
    kv_heads: list[int] | None = None

    @property
    def head_numbers(self) -> list[int]:
        """The model's numbers of the query heads this record stacks (:attr:`heads`, or every head)."""
        return list(range(self.q.shape[0])) if self.heads is None else list(self.heads)

    def head_index(self, head: int) -> int:
        """Where the model's query head ``head`` sits in this record's stacks (``q[index]``); a head the
        capture did not keep is a :class:`~attnviz.errors.HeadNotKeptError` naming those it kept."""
        if self.heads is None:
            if not 0 <= head < self.q.shape[0]:
                raise HeadNotKeptError(f"head {head} is out of range: this layer has heads 0..{self.q.shape[0] - 1}")
            return head
        try:
            return self.heads.index(head)
        except ValueError:
            kept = ", ".join(str(h) for h in self.heads)
            raise HeadNotKeptError(
                f"head {head} was not kept: this capture kept heads {kept} of {self.name!r} "
                f"(capture(..., heads=) / --heads); capture again with heads=None or including {head}"
            ) from None

    def kv_index(self, index: int) -> int:
        """Where the key/value head that the query head at stack position ``index`` reads sits in k and v."""
        if self.kv_heads is None:
            return index // (self.q.shape[0] // self.k.shape[0])
        return sorted(set(self.kv_heads)).index(self.kv_heads[index])

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    @property
    def value_norms(self) -> Tensor | None:  # [head, key_pos]
        """‖f_h(x_j)‖ = ‖W_O^h v_j‖ per head and key, float32, or None without an output projection."""
        return None if self.value_dots is None else self.value_dots[..., 0].clamp_min(0).sqrt()

    def bias_part(
        self, rows: Tensor | None = None, keys: slice | Tensor = slice(None)
    ) -> Tensor | None:  # [head or 1, r, k]
        """The additive score bias for these query rows and keys (a slice or indices; dense), or None.
        A relative bias is gathered on its own device: no transfer, no wait."""
        if self.relative_bias is not None:
            n_q = self.n_queries
            device = self.relative_bias.device
            i = torch.arange(n_q, device=device) if rows is None else rows.to(device)
            j = torch.arange(self.n_keys, device=device)[keys if isinstance(keys, slice) else keys.to(device)]
            return self.relative_bias[:, j[None, :] - i[:, None] + n_q - 1]
        if self.bias is None:
            return None
        b = (
            self.bias
            if rows is None or self.bias.shape[-2] == 1
            else self.bias.index_select(-2, rows.to(self.bias.device))
        )
        return b[..., keys]

    def sdpa_arguments(self, head: int | None = None) -> dict:
        """The keyword arguments of :func:`attnviz.attention.attention_output` (and
        :func:`~attnviz.attention.online_attention`) that recompute this layer as the model computed it
        (scaling, mask, window, bias, sinks, soft-cap); of one query ``head`` alone when given (with
        :meth:`head_qkv`'s tensors)."""
        mask, bias = self.mask_part, self.bias_part
        if head is not None:

            def pick(t: Tensor | None) -> Tensor | None:
                return t if t is None or t.shape[0] == 1 else t[head : head + 1]

            def mask(rows: Tensor | None = None, keys: slice | Tensor = slice(None)) -> Tensor | None:
                return pick(self.mask_part(rows, keys))

            def bias(rows: Tensor | None = None, keys: slice | Tensor = slice(None)) -> Tensor | None:
                return pick(self.bias_part(rows, keys))

        return dict(
            scale=self.scaling,
            causal=self.causal,
            window=self.window,
            mask=mask if self.mask is not None else None,
            bias=bias if self.bias is not None or self.relative_bias is not None else None,
            sinks=self.sinks if self.sinks is None or head is None else self.sinks[head : head + 1],
            softcap=self.softcap,
        )

    def head_qkv(self, head: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(q [h, query_pos, d], k [kv, key_pos, d], v [kv, key_pos, d_v])``: every head's, or one query
        head's with the key/value head it reads (GQA groups consecutive query heads). ``head`` is a
        position in the stacks (:meth:`head_index` of the model's number)."""
        if head is None:
            return self.q, self.k, self.v
        kv = self.kv_index(head)
        return self.q[head : head + 1], self.k[kv : kv + 1], self.v[kv : kv + 1]

    def log_sum_exp(self, rows: Tensor | None = None, head: int | None = None) -> Tensor:  # [head or 1, r]
        """Each row's log-sum-exp under the model's own settings (:attr:`lse`), for ``rows`` (default all)
        of every head or of one ``head`` (a position in the stacks, :meth:`head_index`): what :attr:`lse` holds already is read, the rest computed by one
        pass over the keys in tiles (:func:`attnviz.attention.online_attention`, O(r · key_pos)) and kept
        in :attr:`lse` for next time. One wait for the device per call (which rows are missing)."""
        n_head, n_q = self.q.shape[0], self.n_queries
        rows = torch.arange(n_q, device=self.q.device) if rows is None else rows.to(self.q.device)
        heads = slice(None) if head is None else slice(head, head + 1)
        if self.lse is None:
            self.lse = torch.full((n_head, n_q), float("nan"), device=self.q.device)
        known = self.lse[heads].index_select(1, rows.to(self.lse.device))
        missing = torch.isnan(known).any(0).cpu()
        if bool(missing.any()):
            todo = rows.cpu()[missing]
            q, k, v = self.head_qkv(head)
            _, lse = online_attention(q, k, v[..., :0], rows=todo, **self.sdpa_arguments(head))
            self.lse[heads, todo.to(self.lse.device)] = lse.to(self.lse.device)
            known = self.lse[heads].index_select(1, rows.to(self.lse.device))
        return known

    def keep_lse(self, rows: Tensor, lse: Tensor, head: int | None = None) -> None:
        """Keep ``lse`` ``[head or 1, r]`` — these ``rows``' log-sum-exp under the model's own settings, of
        every head or of one ``head`` (a position in the stacks) — in :attr:`lse`, where it holds no value
        yet (a pass that computed them anyway: the dashboard's overview)."""
        if self.lse is None:
            self.lse = torch.full((self.q.shape[0], self.n_queries), float("nan"), device=self.q.device)
        heads = slice(None) if head is None else slice(head, head + 1)
        index = rows.to(self.lse.device)
        known = self.lse[heads].index_select(1, index)
        self.lse[heads, index] = torch.where(torch.isnan(known), lse.to(known), known)

    def fill_lse(self) -> Tensor:  # [head, query_pos]
        """:attr:`lse` complete, every row of every head (the rows not yet known computed in one
        key-tiled pass), and returned."""
        self.log_sum_exp()
        assert self.lse is not None  # log_sum_exp made it
        return self.lse

    def weight_chunks(
        self, *, budget: int = 1 << 21, scratch: Scratch | None = None
    ) -> Iterator[tuple[Tensor, slice, Tensor]]:
        """This layer's weights ``(rows [r], keys, weights [head, r, keys])`` a chunk of query rows at a
        time (about ``budget`` weights each), as the model computed them: no head's n×n map exists
        whole, no A·V is computed (values of width 0), and under a causal mask a chunk holds only the
        keys its rows may see (every other key's weight is 0). With a ``scratch``, each chunk's
        weights live in its buffers until the next chunk."""
        values = self.v[..., :0]
        chunks = attention_output(self.q, self.k, values, budget=budget, scratch=scratch, **self.sdpa_arguments())
        for rows, keys, _, weights in chunks:
            yield rows, keys, weights

    def mask_part(
        self, rows: Tensor | None = None, keys: slice | Tensor = slice(None)
    ) -> Tensor | None:  # [head or 1, r, k]
        """The mask (bool, or additive) for these query rows and keys (a slice or indices), or None."""
        if self.mask is None:
            return None
        m = self.mask if self.mask.dim() == 3 else self.mask[None]
        m = m[..., keys] if isinstance(keys, slice) else m.index_select(-1, keys.to(m.device))
        return m if rows is None or m.shape[-2] == 1 else m.index_select(-2, rows.to(m.device))
