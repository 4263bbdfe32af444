"""T5, mT5 and UMT5: encoder-decoders through the AttentionInterface, the relative position bias
arriving as the call's ``position_bias``."""

from __future__ import annotations

from .facts import TINY_T5, Facts, Family, Tiny

FACTS = Facts(
    rank=100,
    rows=(
        Family("T5", "interface", "encoder, decoder, cross", "relative position bias", "t5"),
        Family("mT5", "interface", "encoder, decoder, cross", "relative position bias", "mt5"),
        Family("UMT5", "interface", "encoder, decoder, cross", "relative position bias per layer", "umt5"),
    ),
    tiny={
        "t5": Tiny(lambda tf: tf.T5Config(**TINY_T5)),
        "mt5": Tiny(lambda tf: tf.MT5Config(**TINY_T5)),
        "umt5": Tiny(lambda tf: tf.UMT5Config(**TINY_T5)),
    },
)
