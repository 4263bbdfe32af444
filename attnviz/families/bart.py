"""BART and Marian: encoder-decoders through the AttentionInterface."""

from __future__ import annotations

from .facts import TINY_SEQ2SEQ, Facts, Family, Tiny

FACTS = Facts(
    rank=80,
    rows=(
        Family("BART", "interface", "encoder, decoder, cross", "learned absolute", "bart"),
        Family("Marian", "interface", "encoder, decoder, cross", "sinusoidal", "marian"),
    ),
    tiny={
        "bart": Tiny(lambda tf: tf.BartConfig(**TINY_SEQ2SEQ)),
        "marian": Tiny(lambda tf: tf.MarianConfig(**TINY_SEQ2SEQ, decoder_start_token_id=0, pad_token_id=0)),
    },
)
