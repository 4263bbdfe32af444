"""GPT-2: through the AttentionInterface (fused ``c_attn``, split by its own module)."""

from __future__ import annotations

from typing import Any

from .facts import Facts, Family, QKWeights, ResidualSpec, Tiny


def _c_attn(m: Any) -> QKWeights:
    """GPT-2's fused ``c_attn`` (a Conv1D, ``x @ W + b`` with W ``[hidden, 3·hidden]``): its q and k thirds."""
    w, b, d = m.c_attn.weight, m.c_attn.bias, m.embed_dim
    return w[:, :d].t(), b[:d], w[:, d : 2 * d].t(), b[d : 2 * d]


#: pre-LayerNorm, learned positions added to the token embedding
RESIDUAL = ResidualSpec(
    layout="pre",
    blocks="h",
    embeddings=(("embed", "wte"), ("pos", "wpe")),
    attention="attn",
    mlp="mlp",
    qk=_c_attn,
    norm="ln_1",
)

FACTS = Facts(
    rank=30,
    rows=(Family("GPT-2", "interface", "decoder", "learned absolute", "gpt2", "fused c_attn; per-layer scaling"),),
    causal_lm_types=frozenset({"gpt2"}),
    residual={"gpt2": RESIDUAL},
    tiny={
        "gpt2": Tiny(
            lambda tf: tf.GPT2Config(
                n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=0
            )
        )
    },
)
