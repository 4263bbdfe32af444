"""Bloom: computed inline, tapped through projection hooks; fused ``[head, 3, d]``, ALiBi passed in as
``alibi`` ``[b·h, 1, k]``; scores = alibi + qkᵀ/√d."""

from __future__ import annotations

from .facts import Facts, Family, ProjectionSpec, Tiny, alibi_per_item, inputs_view


def refusal(config) -> str | None:
    """Bloom with ``pretraining_tp > 1`` and ``slow_but_exact`` bypasses its output projection."""
    if getattr(config, "pretraining_tp", 1) > 1 and getattr(config, "slow_but_exact", False):
        return "Bloom with pretraining_tp > 1 and slow_but_exact=True bypasses its output projection"
    return None


FACTS = Facts(
    rank=160,
    rows=(Family("Bloom", "projection hooks", "decoder", "ALiBi", "bloom", "", ("eager",)),),
    projection_specs={
        "bloom": ProjectionSpec(
            "BloomAttention",
            q=None,
            k=None,
            v=None,
            fused="query_key_value",
            layout="interleaved",
            out="dense",
            scaling=lambda m: m.inv_norm_factor,
            bias=inputs_view("alibi", alibi_per_item),
            mask="attention_mask",
            refuse=refusal,
        )
    },
    causal_lm_types=frozenset({"bloom"}),
    tiny={"bloom": Tiny(lambda tf: tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=128))},
)
