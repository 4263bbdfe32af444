"""A local model's description read quickly (:func:`describe_quickly`): its config's JSON as a namespace and the
generic fast tokenizer, for the command line's checks before the weights load — without importing a family's
config class, which pulls in its modelling code (≈2 s on a CPU)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

from ...errors import ModelNotFoundError
from . import gguf_described
from .models import EMBEDDED_MODELS, embedded_source

__all__ = ["GENERIC_TOKENIZERS", "describe_quickly"]


#: the tokenizer classes whose saved folder transformers' generic fast tokenizer reads as AutoTokenizer does
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def describe_quickly(name: str | Path) -> tuple[Any, Any] | None:
    """``(facts, tokenizer)`` of a model whose description is a local folder — an embedded alias (a GGUF file's
    converted description, :mod:`~attnviz.workflows.capture.gguf_described`) or a folder — read without
    transformers' model classes: the config's JSON as a namespace (what
    :func:`~attnviz.workflows.capture.pipeline.n_layers`, :func:`~attnviz.workflows.capture.pipeline.max_positions`, the heads and the families' refusals read, with ``getattr``) and the tokenizer as the
    same generic fast tokenizer AutoTokenizer builds for it. Importing a family's config class pulls in its
    modelling code (≈2 s on a CPU): the command line's checks before the weights load (``--layer 99``,
    ``--query dog``) answer without it. None where this would not be the same description: a hub name, a
    folder not converted yet, a config with nested configs (a VLM, CLIP, an encoder-decoder pair), no layer or
    head count, a tokenizer of a class of its own (BERT's) — :func:`describe_model` reads those."""
    text = str(name)
    try:
        if text in EMBEDDED_MODELS:
            folder, kwargs = embedded_source(text)
            if "gguf_file" in kwargs:
                folder = gguf_described.cache_folder(Path(folder) / kwargs["gguf_file"])
                if not (folder / gguf_described.DONE).is_file():
                    return None
        elif Path(text).is_dir():
            folder = Path(text)
        else:
            return None
        facts = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        tokenizer_class = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get(
            "tokenizer_class"
        )
        if tokenizer_class not in GENERIC_TOKENIZERS or not (folder / "tokenizer.json").is_file():
            return None
    except (OSError, ValueError, ModelNotFoundError):
        return None
    if not isinstance(facts, dict) or any(isinstance(v, dict) and "model_type" in v for v in facts.values()):
        return None
    config = types.SimpleNamespace(**facts)
    layers = ("num_hidden_layers", "n_layer", "num_layers")  # what n_layers and the heads' count read first
    heads = ("num_attention_heads", "n_head", "num_heads", "n_heads")
    if not isinstance(getattr(config, "model_type", None), str):
        return None
    if not any(isinstance(facts.get(n), int) for n in layers) or not any(isinstance(facts.get(h), int) for h in heads):
        return None
    from transformers import PreTrainedTokenizerFast  # deferred: the generic fast tokenizer alone, no model class

    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    except (OSError, ValueError):
        return None
    return config, tokenizer
