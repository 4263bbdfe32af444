"""MPT: computed inline, tapped through projection hooks; fused ``[q | k | v]``, optionally clamped;
ALiBi as ``position_bias`` ``[h, 1, max_len]``; a bool mask where True blocks."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .facts import Facts, Family, ProjectionSpec, Tiny, inputs_view


def _per_head(module: Any, bias: Tensor, batch: int) -> Tensor:  # [h, 1, max_len] -> [1, h, 1, max_len]
    return bias[None]


FACTS = Facts(
    rank=170,
    rows=(Family("MPT", "projection hooks", "decoder", "ALiBi", "mpt", "", ("eager",)),),
    projection_specs={
        "mpt": ProjectionSpec(
            "MptAttention",
            q=None,
            k=None,
            v=None,
            fused="Wqkv",
            heads="n_heads",
            scaling=lambda m: m.softmax_scale,
            clip=lambda m: m.clip_qkv,
            bias=inputs_view("position_bias", _per_head),
            mask="attention_mask",
            mask_true_means_masked=True,
        )
    },
    causal_lm_types=frozenset({"mpt"}),
    tiny={
        "mpt": Tiny(
            lambda tf: tf.MptConfig(
                d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=64, vocab_size=128
            )
        )
    },
)
