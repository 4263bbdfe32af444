"""attnviz's own scaled-dot-product attention: ``softmax(Q·Kᵀ·scale + M)·V``.

Every attention map attnviz shows is recomputed here, from the Q, K and V the model's attention
kernel received. The function reads like the formula; model quirks (GPT-2's per-layer scaling,
sliding windows, soft-capping) arrive as arguments, never as model-specific branches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["build_mask", "scaled_dot_product"]


def build_mask(
    query_len: int,
    key_len: int,
    *,
    causal: bool,
    window: int | None = None,
    key_padding: Tensor | None = None,  # [batch, key_pos] bool, True = a real token
    device: torch.device | str | None = None,
) -> Tensor | None:  # [batch or 1, 1, query_pos, key_pos] bool, True = may attend; None = all allowed
    """The boolean "may attend" mask for a causal flag, a sliding window and key padding.

    Causal masking aligns the last query with the last key (query i sees keys ≤ i + key_len -
    query_len), as a decoder with a cache does. ``window`` keeps keys with ``i - j < window``.
    """
    if not causal and window is None and key_padding is None:
        return None
    offset = key_len - query_len
    i = torch.arange(query_len, device=device)[:, None] + offset
    j = torch.arange(key_len, device=device)[None, :]
    allowed = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j) < window
    allowed = allowed[None, None]
    if key_padding is not None:
        allowed = allowed & key_padding.to(device=allowed.device, dtype=torch.bool)[:, None, None, :]
    return allowed


def scaled_dot_product(
    q: Tensor,  # [batch, head, query_pos, d_head]
    k: Tensor,  # [batch, kv_head, key_pos, d_head]
    v: Tensor,  # [batch, kv_head, key_pos, d_head_v]
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
    window: int | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    dtype: torch.dtype | None = torch.float32,
) -> tuple[Tensor, Tensor]:  # out [batch, head, query_pos, d_head_v], weights [batch, head, query_pos, key_pos]
    """Scaled dot-product attention, returning the output and the attention weights.

    - ``scale``: the factor on Q·Kᵀ; ``None`` means ``1/√d_head``. Pass ``1.0`` to switch scaling off.
    - ``causal``: query i sees only keys ≤ i (aligned at the end when key_pos > query_pos).
    - ``mask``: bool (True = may attend) or additive float, broadcastable to
      ``[batch, head, query_pos, key_pos]``; combined with ``causal`` and ``window``.
    - ``window``: sliding-window size (query i sees keys with ``i - j < window``).
    - ``temperature``: scores are divided by it before the softmax (1.0 = the model's own).
    - ``softcap``: ``tanh(s / softcap) · softcap`` on the scaled scores (Gemma-2 style).
    - GQA: query head h uses key/value head ``h // (head / kv_head)``, as ``repeat_kv`` does.
    - ``dtype``: the precision of the computation (fp32 by default); ``None`` keeps q's dtype.

    A query row with every key masked gets all-zero weights (not NaN).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"expected 4-d tensors [batch, head, pos, d_head], got q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    n_head, n_kv = q.shape[1], k.shape[1]
    if n_head % n_kv:
        raise ValueError(f"{n_head} query heads cannot share {n_kv} key/value heads evenly")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    groups = n_head // n_kv
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)

    scores = (q @ k.transpose(-2, -1)) * scale  # [batch, head, query_pos, key_pos]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if temperature != 1.0:
        scores = scores / temperature

    allowed = build_mask(q.shape[-2], k.shape[-2], causal=causal, window=window, device=q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = mask if allowed is None else allowed & mask
        else:
            scores = scores + mask.to(scores.dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))

    weights = torch.softmax(scores, dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # rows with every key masked
    return weights @ v, weights
