"""BERT and RoBERTa (and RoBERTa's relatives' position offset): through the AttentionInterface."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, ResidualSpec, Tiny, heads_of_linear

#: post-LayerNorm: the embeddings' norm, then each block's norm after its attention and after its MLP
#: (``BertOutput.dense`` is the MLP's write), each on the whole stream
RESIDUAL = ResidualSpec(
    layout="post",
    blocks="encoder.layer",
    embeddings=(
        ("embed", "embeddings.word_embeddings"),
        ("pos", "embeddings.position_embeddings"),
        ("type", "embeddings.token_type_embeddings"),
    ),
    attention="attention.self",
    mlp="output.dense",
    qk=lambda m: heads_of_linear(m.query, m.key),
    stream_norms=("attention.output.LayerNorm", "output.LayerNorm"),
    embedding_norm="embeddings.LayerNorm",
)

FACTS = Facts(
    rank=10,
    rows=(
        Family("BERT", "interface", "encoder", "learned absolute", "bert"),
        Family("RoBERTa", "interface", "encoder", "learned absolute", "roberta"),
    ),
    # RoBERTa's padding offset: its first positions are reserved from max_position_embeddings
    reserved_positions={"roberta": 2, "xlm-roberta": 2, "camembert": 2},
    residual={"bert": RESIDUAL},
    tiny={
        "bert": Tiny(lambda tf: tf.BertConfig(max_position_embeddings=64, **TINY_COMMON), auto="AutoModel"),
        "roberta": Tiny(
            lambda tf: tf.RobertaConfig(max_position_embeddings=66, pad_token_id=1, **TINY_COMMON), auto="AutoModel"
        ),
    },
)
