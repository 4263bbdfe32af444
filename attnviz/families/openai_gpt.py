"""GPT-1 (``openai-gpt``): computed inline, tapped through projection hooks; a fused Conv1D ``c_attn``
split three ways, ÷√d only when the module's ``scale`` is set."""

from __future__ import annotations

from .facts import Facts, Family, ProjectionSpec, Tiny

FACTS = Facts(
    rank=150,
    rows=(Family("GPT-1", "projection hooks", "decoder", "learned absolute", "openai-gpt", "", ("eager",)),),
    projection_specs={
        "openai-gpt": ProjectionSpec(
            "Attention",
            q=None,
            k=None,
            v=None,
            fused="c_attn",
            out="c_proj",
            heads="n_head",
            scaling=lambda m: (m.split_size // m.n_head) ** -0.5 if m.scale else 1.0,
        )
    },
    tiny={
        "openai-gpt": Tiny(
            lambda tf: tf.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128)
        )
    },
)
