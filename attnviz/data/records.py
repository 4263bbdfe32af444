"""What one attention layer's kernel saw and produced (:class:`LayerRecord`): the data model of a
Capture's layers. How the calls a tap records become records is the workflows' business
(:mod:`attnviz.workflows.call_records`); this module imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention import Scratch, attention_output

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

    def bias_part(self, rows: Tensor | None = None, keys: slice = slice(None)) -> Tensor | None:  # [head or 1, r, k]
        """The additive score bias for these query rows and keys (dense), or None."""
        if self.relative_bias is not None:
            n_q = self.n_queries
            i = torch.arange(n_q) if rows is None else rows.cpu()
            j = torch.arange(self.n_keys)[keys]
            index = (j[None, :] - i[:, None] + n_q - 1).to(self.relative_bias.device)
            return self.relative_bias[:, index]
        if self.bias is None:
            return None
        b = (
            self.bias
            if rows is None or self.bias.shape[-2] == 1
            else self.bias.index_select(-2, rows.to(self.bias.device))
        )
        return b[..., keys]

    def sdpa_arguments(self) -> dict:
        """The keyword arguments of :func:`attnviz.attention.attention_output` that recompute this
        layer as the model computed it (scaling, mask, window, bias, sinks, soft-cap)."""
        return dict(
            scale=self.scaling,
            causal=self.causal,
            window=self.window,
            mask=self.mask_part if self.mask is not None else None,
            bias=self.bias_part if self.bias is not None or self.relative_bias is not None else None,
            sinks=self.sinks,
            softcap=self.softcap,
        )

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

    def mask_part(self, rows: Tensor | None = None, keys: slice = slice(None)) -> Tensor | None:  # [head or 1, r, k]
        if self.mask is None:
            return None
        m = self.mask if self.mask.dim() == 3 else self.mask[None]
        m = m if rows is None else m.index_select(-2, rows.to(m.device))
        return m[..., keys]
