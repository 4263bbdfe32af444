"""What the page needs to know of a model name before it runs it, from its config and tokenizer only
(``attnviz.models.describe_model``, no weights): whether the BOS box starts ticked, whether it takes a
target text. A capture file the server was started with is named to the page as ``FILE_PREFIX`` + its name."""

from __future__ import annotations

import attnviz
from attnviz.models import describe_model, writes_text

FILE_PREFIX = "file:"


def wants_bos(model: str) -> bool:
    """Whether the page prepends a BOS by default: for a decoder whose tokenizer starts a text with
    no special token, so that its attention sink is not the text's first word."""
    if model.startswith(FILE_PREFIX):
        return False
    try:  # the config and tokenizer only: the weights load when the page runs the model
        config, tokenizer = describe_model(model)
    except attnviz.AttnvizError:
        return False
    if getattr(config, "is_encoder_decoder", False) or not writes_text(config):
        return False
    return not starts_with_special(tokenizer)


def starts_with_special(tokenizer) -> bool:
    """Whether ``tokenizer`` starts a text with a special token of its own (MiniLM's [CLS]): then a BOS box
    changes nothing; SmolLM2's starts with the text's first word."""
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] in set(getattr(tokenizer, "all_special_ids", []))


def is_encoder_decoder(model: str) -> bool:
    """Whether the page should offer a target text for this model (False when it cannot tell)."""
    if model.startswith(FILE_PREFIX) or model in attnviz.EMBEDDED_MODELS:
        return False
    try:
        return bool(getattr(describe_model(model)[0], "is_encoder_decoder", False))
    except attnviz.AttnvizError:
        return False
