"""Models before and around a capture: what a name is, what it accepts, its text as the capture reads it.

The public face of what a caller (the dashboard, the command line, a script) checks before a long
load or a long run — without reaching into :mod:`attnviz.workflows`:

>>> from attnviz import models
>>> config, tokenizer = models.describe_model("minilm")     # config and tokenizer, no weights
>>> models.max_positions(config)                            # 512: the longest text it reads
>>> models.model_kind(config), models.writes_text(config)   # ("text", False)
>>> encoded = models.tokenize(tokenizer, ["The cat sat."], None, None, "minilm")
>>> cap = attnviz.capture("minilm", "The cat sat.", tokenized=encoded)   # not tokenized again

- :func:`describe_model`: a name's ``(config, tokenizer)`` before its weights load (cached with the name);
  :func:`describe_quickly`: the same facts of a local folder (an embedded alias, a folder) without importing
  transformers' model classes — the config's JSON as a namespace — where that reads alike (else None): what
  the command line checks its arguments against.
- :func:`load_model`: the model (eval mode) and its tokenizer, ``with_processor=True`` its processor too.
- :func:`load_processor`: the processor of a model with pictures (None for a text model).
- :func:`max_positions`: the most tokens a config's model reads (None: it states no limit).
- :func:`model_kind`: ``"vlm"``, ``"joint"``, ``"vision"`` or ``"text"``; :func:`writes_text`: whether it generates;
  :func:`is_vlm` / :func:`is_joint`: the two kinds of two towers attnviz captures; :func:`vlm_refusal`:
  why a vision-language model is not captured with a picture.
- :func:`tokenize`: texts encoded once, as :func:`attnviz.capture` reads them (its ``tokenized=``),
  each an :data:`Encoded` ``(ids, offsets, tokens)``; :func:`words_from_offsets`: its tokens grouped into
  the words of the text, as a capture groups them (``attnviz.TokenSequence``'s words).
- The checks :func:`attnviz.capture` makes of its arguments, to make them before a long load:
  :func:`check_supported` (a family attnviz captures), :func:`check_texts` (a text or a non-empty list of
  them), :func:`n_layers` and :func:`check_layers` (its ``layers=`` against them), :func:`check_keep`
  (its ``keep=``), :func:`n_heads` and :func:`check_heads` (its ``heads=`` against them).

Importing this module loads no model.
"""

from .data.words import words_from_offsets
from .engine.specs import check_supported
from .workflows.capture.inputs import Encoded, check_texts, tokenize
from .workflows.capture.joint import is_joint
from .workflows.capture.kept import check_heads, check_keep, n_heads
from .workflows.capture.models import (
    EMBEDDED_MODELS,
    describe_model,
    load_model,
    load_processor,
    model_kind,
    writes_text,
)
from .workflows.capture.pipeline import check_layers, max_positions, n_layers
from .workflows.capture.quick_description import describe_quickly
from .workflows.capture.vlm import is_vlm, vlm_refusal

__all__ = [
    "EMBEDDED_MODELS",
    "Encoded",
    "check_heads",
    "check_keep",
    "check_layers",
    "check_supported",
    "check_texts",
    "describe_model",
    "describe_quickly",
    "is_joint",
    "is_vlm",
    "load_model",
    "load_processor",
    "max_positions",
    "model_kind",
    "n_heads",
    "n_layers",
    "tokenize",
    "vlm_refusal",
    "words_from_offsets",
    "writes_text",
]
