"""Llama (SmolLM2), Qwen2 and Mistral — and their relatives loaded as causal LMs: through the AttentionInterface."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, ResidualSpec, Tiny, heads_of_linear

#: pre-norm (RMSNorm), RoPE rotate-half, q/k projections of their own (biased in Qwen2)
RESIDUAL = ResidualSpec(
    layout="pre",
    blocks="layers",
    embeddings=(("embed", "embed_tokens"),),
    attention="self_attn",
    mlp="mlp",
    qk=lambda m: heads_of_linear(m.q_proj, m.k_proj),
    norm="input_layernorm",
    norm_kind="rms",
    rope="half",
)

FACTS = Facts(
    rank=40,
    rows=(
        Family("Llama / SmolLM2", "interface", "decoder", "RoPE, GQA", "llama"),
        Family("Qwen2", "interface", "decoder", "RoPE, GQA", "qwen2"),
        Family("Mistral", "interface", "decoder", "RoPE, GQA, sliding window", "mistral"),
    ),
    # hub configs of these may lack `architectures` but are causal language models (Qwen3, Phi-3 and
    # Gemma 2 are Llama's relatives here: no row of their own, the same interface path)
    causal_lm_types=frozenset({"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2"}),
    residual={"llama": RESIDUAL, "qwen2": RESIDUAL, "mistral": RESIDUAL},
    tiny={
        "llama": Tiny(lambda tf: tf.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **TINY_COMMON)),
        "qwen2": Tiny(lambda tf: tf.Qwen2Config(num_key_value_heads=2, max_position_embeddings=64, **TINY_COMMON)),
        "mistral": Tiny(
            lambda tf: tf.MistralConfig(
                num_key_value_heads=2, max_position_embeddings=64, sliding_window=4, **TINY_COMMON
            )
        ),
    },
)
