"""GPT-Neo: computed inline, tapped through projection hooks; no scaling at all, and its "local"
layers see only the last ``window_size`` tokens."""

from __future__ import annotations

from .facts import Facts, Family, ProjectionSpec, Tiny

FACTS = Facts(
    rank=130,
    rows=(
        Family(
            "GPT-Neo",
            "projection hooks",
            "decoder",
            "learned absolute, local windows",
            "gpt_neo",
            "unscaled scores",
            ("eager",),
        ),
    ),
    projection_specs={
        "gpt_neo": ProjectionSpec(
            "GPTNeoSelfAttention",
            scaling=lambda m: 1.0,
            window=lambda m: m.config.window_size if m.attention_type == "local" else None,
        )
    },
    tiny={
        "gpt_neo": Tiny(
            lambda tf: tf.GPTNeoConfig(
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                max_position_embeddings=64,
                vocab_size=128,
                attention_types=[[["global", "local"], 1]],
                window_size=4,
                bos_token_id=0,
                eos_token_id=0,
            )
        )
    },
)
