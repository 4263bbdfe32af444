"""Attention rollout (Abnar & Zuidema 2020).

Per layer, average the heads, mix in the identity for the residual connection
(``Â = r·I + (1 - r)·A``, rows renormalised), and multiply through the layers:
``R_l = Â_l · R_{l-1}``. Row i of ``R_L`` estimates how much of token i's final representation
flows, through attention alone, from each input token.

What it is not: an attribution of the model's prediction. It ignores the MLPs, the values' norms
and the output projection, assumes every head matters equally, and for decoders it piles mass on
early tokens because they are visible to every later one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import attention_output
from ..errors import InputError

if TYPE_CHECKING:
    from ..capture import Capture

__all__ = ["rollout"]


def rollout(
    cap: Capture,
    *,
    residual: float = 0.5,
    head_fusion: str = "mean",
    part: str | None = None,
) -> Tensor:  # [layer, query_pos, key_pos]
    """Cumulative rollout after each captured layer (all layers must be captured).

    ``head_fusion``: ``"mean"`` (the paper's), ``"max"`` or ``"min"`` over heads. ``part`` picks the
    encoder or the decoder of an encoder-decoder capture (its self-attention only).
    """
    cap = cap.select(part)
    layers = cap.layer_indices()
    if layers != list(range(cap.n_layers)):
        raise InputError(
            f"rollout needs every layer; this capture has {layers} of {cap.n_layers}: capture with layers=None"
        )
    if not 0.0 <= residual <= 1.0:
        raise InputError(f"residual must be in [0, 1], got {residual}")
    fuse = {"mean": lambda a: a.mean(0), "max": lambda a: a.max(0).values, "min": lambda a: a.min(0).values}
    if head_fusion not in fuse:
        raise InputError(f"head_fusion must be one of {', '.join(fuse)}, got {head_fusion!r}")
    n = cap.n_tokens
    eye = torch.eye(n)
    result = eye
    out = []
    for layer in layers:
        a = _fused(cap, layer, fuse[head_fusion])
        a = residual * eye + (1 - residual) * a
        a = a / a.sum(-1, keepdim=True)
        result = a @ result
        out.append(result)
    return torch.stack(out)


def _fused(cap: Capture, layer: int, fuse) -> Tensor:  # [query_pos, key_pos]
    """The layer's heads fused into one map, a chunk of query rows at a time: the heads' n×n maps never
    exist whole, no A·V is computed (values of width 0), and under a causal mask only the keys a chunk's
    rows may see (the rest is 0 in every head, so also in the fused map)."""
    rec = cap.layer(layer)
    fused = torch.zeros(rec.n_queries, rec.n_keys)
    for rows, keys, _, weights in attention_output(rec.q, rec.k, rec.v[..., :0], **rec.sdpa_arguments()):
        fused[rows, keys] = fuse(weights.float().cpu())
    return fused
