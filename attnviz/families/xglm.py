"""XGLM: computed inline, tapped through projection hooks; the query is multiplied by ``scaling`` after ``q_proj``."""

from __future__ import annotations

from .facts import Facts, Family, ProjectionSpec, Tiny

FACTS = Facts(
    rank=140,
    rows=(Family("XGLM", "projection hooks", "decoder", "sinusoidal", "xglm", "", ("eager",)),),
    projection_specs={"xglm": ProjectionSpec("XGLMAttention", scaling=lambda m: m.scaling)},
    tiny={
        "xglm": Tiny(
            lambda tf: tf.XGLMConfig(
                d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, vocab_size=128, max_position_embeddings=64
            )
        )
    },
)
