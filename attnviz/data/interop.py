"""Hand a capture to the tools people already use: bertviz and CircuitsVis.

Both take attention matrices; attnviz gives them its validated recomputation — so a model on sdpa
or flash, where ``output_attentions`` returns nothing, still feeds bertviz's head view and model
view, and CircuitsVis's attention patterns.

>>> from bertviz import head_view
>>> head_view(**cap.to_bertviz())                                  # in a notebook
>>> import circuitsvis as cv
>>> cv.attention.attention_patterns(**cap.to_circuitsvis(layer=3))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = ["to_bertviz", "to_circuitsvis"]


def _stack(cap: Capture, part: str, words: bool) -> tuple:  # one [1, head, q, k] tensor per layer
    layers = cap.layer_indices(part)
    n_layers = cap.info(part)["n_layers"]
    if layers != list(range(n_layers)):
        raise InputError(
            f"bertviz numbers layers by position, so it needs every layer; this capture holds {part} layers "
            f"{layers} of {n_layers}: capture with layers=None"
        )
    kept, n_heads = cap.kept_heads(part), cap.info(part)["n_heads"]
    if kept != list(range(n_heads)):
        raise InputError(
            f"bertviz numbers heads by position, so it needs every head; this capture holds {part} heads "
            f"{kept} of {n_heads}: capture with heads=None (or draw them with attnviz.figures.head_view)"
        )
    return tuple(cap.attention(layer, part=part, words=words).cpu()[None] for layer in layers)


def to_bertviz(cap: Capture, *, words: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``bertviz.head_view`` / ``bertviz.model_view``.

    A one-stack model gives ``attention`` (a tuple with one ``[1, head, n, n]`` tensor per layer)
    and ``tokens``; an encoder-decoder gives ``encoder_attention``, ``decoder_attention``,
    ``cross_attention``, ``encoder_tokens`` and ``decoder_tokens``. ``words=True`` merges tokens
    into words first (to a word summed, from a word averaged).
    """
    if cap.target is None:
        (part,) = cap.parts
        seq, _ = cap.sequences(part)
        return {"attention": _stack(cap, part, words), "tokens": seq.word_labels if words else seq.token_labels}
    return {
        "encoder_attention": _stack(cap, "encoder", words),
        "decoder_attention": _stack(cap, "decoder", words),
        "cross_attention": _stack(cap, "cross", words),
        "encoder_tokens": cap.source.word_labels if words else cap.source.token_labels,
        "decoder_tokens": cap.target.word_labels if words else cap.target.token_labels,
    }


def to_circuitsvis(cap: Capture, layer: int, *, part: str | None = None, words: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``circuitsvis.attention.attention_patterns`` and ``attention_heads``:
    ``tokens`` and ``attention`` as ``[head, query_pos, key_pos]`` (for ``attention_heads`` add
    ``attention_head_names=[f"L{layer}·H{h}" for h in cap.kept_heads(part)]`` yourself: the heads a
    ``capture(heads=)`` kept, by the model's numbers, in the order of ``attention``).

    CircuitsVis draws a sequence attending to itself, so cross-attention is refused."""
    part = cap.resolve_part(part)
    if part == "cross":
        raise InputError("CircuitsVis draws one sequence attending to itself; pass part='encoder' or 'decoder'")
    seq, _ = cap.sequences(part)
    return {
        "tokens": seq.word_labels if words else seq.token_labels,
        "attention": cap.attention(layer, part=part, words=words).cpu(),
    }
