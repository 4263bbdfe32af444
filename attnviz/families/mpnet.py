"""MPNet: computed inline, tapped through projection hooks; a T5-style bucketed relative position
bias, computed once by the encoder and passed to every layer as ``position_bias`` ``[b, h, q, k]``;
scores = qkᵀ/√d + position_bias + additive mask."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, ProjectionSpec, Tiny

FACTS = Facts(
    rank=190,
    rows=(
        Family(
            "MPNet",
            "projection hooks",
            "encoder",
            "relative position bias",
            "mpnet",
            "one bucketed bias, computed once, for every layer",
            ("eager",),
        ),
    ),
    projection_specs={
        "mpnet": ProjectionSpec(
            "MPNetSelfAttention",
            q="q",
            k="k",
            v="v",
            out="o",
            heads="num_attention_heads",
            scaling=lambda m: m.attention_head_size**-0.5,
            causal=False,
            mask="attention_mask",
            bias=lambda m, inputs, batch: inputs.get("position_bias"),
        )
    },
    tiny={
        "mpnet": Tiny(
            lambda tf: tf.MPNetConfig(max_position_embeddings=66, pad_token_id=1, **TINY_COMMON), auto="AutoModel"
        )
    },
)
