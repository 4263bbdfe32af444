"""LongT5: its local attention's encoder computed inline, tapped through projection hooks — blocks of
``local_radius + 1`` tokens attending to the keys at most ``local_radius`` away, unscaled, plus a
bucketed relative bias over the blocks, drawn dense (:func:`unblock`); its decoder and
cross-attention are T5's, through the interface. Transient-global attention is refused."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .facts import TINY_T5, Facts, Family, ProjectionSpec, Tiny

__all__ = ["FACTS", "unblock"]


def unblock(blocked: Tensor, n: int) -> tuple[Tensor, Tensor]:  # [B, blocks, H, L, 3L] -> [B, H, n, n], [n, n]
    """LongT5's local attention layout made dense: query ``i`` (block ``i // L``, row ``i % L``) sees
    the 3L keys of the blocks before, at and after its own, key ``j`` in slot ``j - (i // L - 1)·L``.
    Returns the dense values (0 where ``j`` is not in those blocks) and where it is."""
    length = blocked.shape[-2]
    i = torch.arange(n, device=blocked.device)
    block, row = i // length, i % length
    slot = i[None, :] - (block[:, None] - 1) * length  # [q, k]
    inside = (slot >= 0) & (slot < 3 * length)
    values = blocked[:, block[:, None], :, row[:, None], slot.clamp(0, 3 * length - 1)]  # [q, k, B, H]
    return values.permute(2, 3, 0, 1).masked_fill(~inside, 0), inside


def _longt5_mask(module: Any, inputs: dict, n: int) -> Tensor:  # [b, 1, n, n] bool
    """LongT5's local mask [b, 1, blocks, L, 3L] (the locality and the padding), dense."""
    allowed, inside = unblock(inputs["mask"].transpose(1, 2) > 0, n)
    return allowed & inside


def _longt5_bias(module: Any, inputs: dict, q: Tensor, k: Tensor) -> Tensor:  # [b|1, head, n, n]
    """LongT5's relative position bias over its local blocks, dense: the first layer's from its own
    ``compute_bias``, a later layer's from the ``position_bias`` the first passed on (which carries
    the mask as -1e10: those keys are masked anyway, so they are zeroed here)."""
    blocked = inputs.get("position_bias")
    if blocked is None:
        blocked = module.compute_bias(module.block_len) if module.has_relative_attention_bias else None
        if blocked is None:
            return q.new_zeros(1, q.shape[1], q.shape[-2], q.shape[-2])
        blocked = blocked[0]  # [1, 1, h, L, 3L] -> [1, h, L, 3L] per block: one for every block
        blocked = blocked[:, None].expand(1, -(-q.shape[-2] // module.block_len), *blocked.shape[1:])
    dense, _ = unblock(blocked, q.shape[-2])
    return dense.masked_fill(~_longt5_mask(module, inputs, q.shape[-2]), 0)


def _longt5_refusal(config) -> str | None:
    if getattr(config, "encoder_attention_type", "local") != "local":
        return (
            "LongT5 with transient-global attention: its encoder's keys include one aggregate per block "
            "of the text (a sum of token states, not a token), which a token × token map cannot show"
        )
    return None


FACTS = Facts(
    rank=200,
    rows=(
        Family(
            "LongT5 (local)",
            "projection hooks",
            "encoder, decoder, cross",
            "relative position bias in local blocks",
            "longt5",
            "the encoder by projection hooks (its blocks drawn dense), the decoder through the interface",
            ("eager",),
        ),
        Family(
            "LongT5 (transient-global)",
            "refused",
            "—",
            "local blocks and per-block aggregates",
            None,
            "its encoder's keys include one aggregate per block of the text, not a token",
        ),
    ),
    projection_specs={
        "longt5": ProjectionSpec(
            "LongT5LocalAttention",
            q="q",
            k="k",
            v="v",
            out="o",
            heads="n_heads",
            scaling=lambda m: 1.0,
            causal=False,
            qk_bias=_longt5_bias,
            mask_from=_longt5_mask,
            interface_too=True,
            refuse=_longt5_refusal,
        )
    },
    tiny={"longt5": Tiny(lambda tf: tf.LongT5Config(**TINY_T5, local_radius=2))},
)
