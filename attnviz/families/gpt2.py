"""GPT-2: through the AttentionInterface (fused ``c_attn``, split by its own module)."""

from __future__ import annotations

from .facts import Facts, Family, Tiny

FACTS = Facts(
    rank=30,
    rows=(Family("GPT-2", "interface", "decoder", "learned absolute", "gpt2", "fused c_attn; per-layer scaling"),),
    causal_lm_types=frozenset({"gpt2"}),
    tiny={
        "gpt2": Tiny(
            lambda tf: tf.GPT2Config(
                n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=0
            )
        )
    },
)
