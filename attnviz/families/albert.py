"""ALBERT: through the AttentionInterface, one attention module running for every layer of a forward."""

from __future__ import annotations

from .facts import TINY_COMMON, Facts, Family, Tiny

FACTS = Facts(
    rank=230,
    rows=(
        Family(
            "ALBERT",
            "interface",
            "encoder",
            "learned absolute",
            "albert",
            "one attention module runs for every layer: a call's layer is its index in the forward",
        ),
    ),
    # one layer's weights shared by the whole stack, ``num_hidden_groups`` groups of ``inner_group_num``
    # layers: a call's layer is its index among the model's attention calls in the forward, and this is
    # how many attention calls one forward makes (the count runs on, modulo it, over several forwards)
    shared_layers={"albert": lambda config: config.num_hidden_layers * config.inner_group_num},
    tiny={"albert": Tiny(lambda tf: tf.AlbertConfig(embedding_size=16, **TINY_COMMON), auto="AutoModel")},
)
