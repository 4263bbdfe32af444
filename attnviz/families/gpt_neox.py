"""GPT-NeoX (Pythia) and GPT-J: captured through the AttentionInterface like any decoder of the sweep;
what they add here is where their residual stream is written and read — attention and MLP side by side
on one normed stream, rotary embeddings on part of each head (:func:`attnviz.qk_attribution`)."""

from __future__ import annotations

from typing import Any

from .facts import Facts, QKWeights, ResidualSpec, heads_of_linear


def _query_key_value(m: Any) -> QKWeights:
    """GPT-NeoX's fused ``query_key_value``: its output read as ``[head, 3·d_head]``, q, k, v per head."""
    w, b, d = m.query_key_value.weight, m.query_key_value.bias, m.head_size
    w = w.view(-1, 3, d, w.shape[-1])
    q, k = w[:, 0].reshape(-1, w.shape[-1]), w[:, 1].reshape(-1, w.shape[-1])
    if b is None:
        return q, None, k, None
    b = b.view(-1, 3, d)
    return q, b[:, 0].reshape(-1), k, b[:, 1].reshape(-1)


FACTS = Facts(
    rank=1000,
    residual={
        # use_parallel_residual=False is the pre layout: the stream is the same sum of writes
        "gpt_neox": ResidualSpec(
            layout="parallel",
            blocks="layers",
            embeddings=(("embed", "embed_in"),),
            attention="attention",
            mlp="mlp",
            qk=_query_key_value,
            norm="input_layernorm",
            rope="half",
        ),
        "gptj": ResidualSpec(
            layout="parallel",
            blocks="h",
            embeddings=(("embed", "wte"),),
            attention="attn",
            mlp="mlp",
            qk=lambda m: heads_of_linear(m.q_proj, m.k_proj),
            norm="ln_1",
            rope="pairs",
            rope_order="sin_cos",
        ),
    },
)
