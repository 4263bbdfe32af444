"""BERT and RoBERTa (and RoBERTa's relatives' position offset): through the AttentionInterface."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, Tiny

FACTS = Facts(
    rank=10,
    rows=(
        Family("BERT", "interface", "encoder", "learned absolute", "bert"),
        Family("RoBERTa", "interface", "encoder", "learned absolute", "roberta"),
    ),
    # RoBERTa's padding offset: its first positions are reserved from max_position_embeddings
    reserved_positions={"roberta": 2, "xlm-roberta": 2, "camembert": 2},
    tiny={
        "bert": Tiny(lambda tf: tf.BertConfig(max_position_embeddings=64, **TINY_COMMON), auto="AutoModel"),
        "roberta": Tiny(
            lambda tf: tf.RobertaConfig(max_position_embeddings=66, pad_token_id=1, **TINY_COMMON), auto="AutoModel"
        ),
    },
)
