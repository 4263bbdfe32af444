"""gpt-oss: through the AttentionInterface, with one learned sink logit per head (``s_aux``)."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, Tiny

FACTS = Facts(
    rank=70,
    rows=(
        Family(
            "gpt-oss",
            "interface",
            "decoder",
            "RoPE, GQA, learned sinks",
            "gpt_oss",
            "the sink's share of each row is shown",
            ("eager",),
        ),
    ),
    tiny={
        "gpt_oss": Tiny(
            lambda tf: tf.GptOssConfig(
                num_key_value_heads=2,
                head_dim=8,
                num_local_experts=2,
                num_experts_per_tok=1,
                sliding_window=4,
                **TINY_COMMON,
            )
        )
    },
)
