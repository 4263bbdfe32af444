"""A vision-language model's capture: its language model over the text and the picture's tokens.

A LLaVA-style model (:data:`VLM_TYPES`) reads a prompt whose ``<image>`` placeholder the processor
expands to one token per image feature; the vision tower's patches, through the projector, fill those
positions, and the language model attends over the merged sequence. The capture is that language
model's attention (its ``decoder`` part, through the AttentionInterface like any decoder): the text
tokens as the tokenizer wrote them, each image position labelled by the patch it came from
(``(row,col)``: the vision tower's grid, its ``[CLS]`` dropped by
``vision_feature_select_strategy="default"``), and ``cap.image`` the picture with the text before the
image as its ``prefix`` and after it as its ``suffix`` — so a text token's row is drawn over the image
(:func:`attnviz.figures.image_attention` with ``query=`` that token) beside its row over the text.
"""

from __future__ import annotations

from typing import Any

from ..data.capture import Capture
from ..data.images import ImageGrid, patch_label, to_uint8
from ..data.words import TokenSequence, Word, words_from_offsets
from ..engine.taps import tap
from ..errors import ArgumentTypeError, InputError, UnsupportedModelError
from .images import read_image
from .pipeline import Item, Resolved, captures, check_mode, tapped

__all__ = ["VLM_TYPES", "capture_vlm", "is_vlm", "tiny_vlm"]

#: the vision-language families attnviz captures: model_type → the prefix tokens its vision tower adds
VLM_TYPES = {"llava": 1}


def is_vlm(config: Any) -> bool:
    """Whether ``config`` is a vision-language model attnviz captures (:data:`VLM_TYPES`)."""
    return getattr(config, "model_type", None) in VLM_TYPES


def _grid(resolved: Resolved, height: int, width: int, n_image: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(patch, grid) of the vision tower for a ``height × width`` picture, checked against the
    ``n_image`` image tokens the processor wrote."""
    config: Any = resolved.model.config
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    if strategy != "default":
        raise UnsupportedModelError(
            f"{resolved.name} selects its image features with {strategy!r}; attnviz maps image tokens to "
            "patches for vision_feature_select_strategy='default' (the [CLS] dropped) only"
        )
    patch: Any = config.vision_config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    rows, cols = height // ph, width // pw
    if rows * cols != n_image:
        raise InputError(
            f"the processor wrote {n_image} image tokens, but a {height}×{width} picture has {rows}×{cols} "
            f"patches of {ph}×{pw}; use the processor of this model (its patch_size and "
            "vision_feature_select_strategy as the model's)"
        )
    return (ph, pw), (rows, cols)


def capture_vlm(
    resolved: Resolved,
    text: Any,
    image: Any,
    processor: Any,
    *,
    layers: set[int] | None = None,
    check: str = "sample",
    keep_on_device: bool = False,
    weight_mode: str | None = None,
) -> Capture:
    """One text with one picture through a VLM's processor (``processor(text=…, images=…)``, e.g.
    ``LlavaProcessor``), one forward; the capture of its language model, with ``cap.image``."""
    check_mode(check)
    model = resolved.model
    config: Any = model.config
    if not isinstance(text, str):
        raise ArgumentTypeError(
            f"a vision-language capture takes one text (a str with an image token) and one image, got {type(text).__name__}"
        )
    if image is None or isinstance(image, (list, tuple)):
        raise InputError("give one picture with the text: capture(model, text, image=…, processor=…)")
    if processor is None or not callable(processor) or getattr(processor, "tokenizer", None) is None:
        raise InputError(
            f"{resolved.name} needs its processor (text and images together), e.g. "
            "AutoProcessor.from_pretrained(name); pass processor="
        )
    tokenizer = processor.tokenizer
    image_id = int(config.image_token_index)
    placeholder = getattr(processor, "image_token", None) or tokenizer.convert_ids_to_tokens(image_id)
    if text.count(placeholder) != 1:
        raise InputError(
            f"the text has {text.count(placeholder)} {placeholder!r} tokens; write exactly one where the picture "
            f"goes, e.g. {placeholder + ' ' + text.replace(placeholder, '')!r}"
        )
    picture = read_image(image)
    encoded = processor(text=text, images=picture, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    pixel_values = encoded["pixel_values"]
    at = [i for i, t in enumerate(ids) if t == image_id]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise InputError(f"the processor put the image tokens at {at[:4]}…; attnviz expects one run of them")
    (ph, pw), (rows, cols) = _grid(resolved, pixel_values.shape[-2], pixel_values.shape[-1], len(at))
    n = len(ids)
    start, stop = at[0], at[-1] + 1
    # the expanded text the processor tokenized, for the text tokens' offsets and words
    expanded = text.replace(placeholder, placeholder * len(at))
    again = tokenizer(expanded, return_offsets_mapping=True)
    if again["input_ids"] != ids:
        raise InputError("the tokenizer does not give back the processor's ids for this text; pass its own processor")
    offsets = [(int(a), int(b)) for a, b in again["offset_mapping"]]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    labels = [patch_label(r, c) for r in range(rows) for c in range(cols)]
    tokens[start:stop] = labels
    words = [w for w in words_from_offsets(expanded, offsets, tokens) if w.token_stop <= start or w.token_start >= stop]
    words += [
        Word(label, offsets[start + i][0], offsets[start + i][1], start + i, start + i + 1)
        for i, label in enumerate(labels)
    ]
    words.sort(key=lambda w: w.token_start)
    sequence = TokenSequence(expanded, tokens, ids, offsets, words)

    dtype = next(model.parameters()).dtype
    kwargs = {k: v.to(resolved.device) for k, v in encoded.items()}
    kwargs["pixel_values"] = kwargs["pixel_values"].to(dtype)
    taps = tap(
        model,
        layers=layers,
        to_cpu=not keep_on_device,
        weight_mode=weight_mode or ("drop" if check == "off" else "compare"),
        lengths={"decoder": [n]},
    )
    recorder, _ = tapped(resolved, taps, lambda _: model(**kwargs), layers)
    language = [c for c in recorder.calls if c.part == "decoder"]
    if not language or {c.q.shape[-2] for c in language if c.q is not None} != {n}:
        raise UnsupportedModelError(
            f"{resolved.name}'s language model did not attend over the {n} merged tokens; attnviz cannot say "
            "which position is which image token"
        )
    made = captures(resolved, language, [Item(sequence, None, {"decoder": (n, n)})], check)
    mean, std = (
        getattr(processor.image_processor, "image_mean", None),
        getattr(processor.image_processor, "image_std", None),
    )
    rescale = getattr(processor.image_processor, "rescale_factor", None)
    pixels = to_uint8(pixel_values[0], mean, std, rescale)
    made[0].image = ImageGrid(pixels, (ph, pw), (rows, cols), tokens[:start], tokens[stop:])
    return made[0]


def tiny_vlm(*, attn_implementation: str | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(a tiny random LLaVA, its ``LlavaProcessor``), for tests and examples: a 2-layer CLIP vision
    tower reading 32×32 pictures in 8×8 patches (16 image tokens, its ``[CLS]`` dropped), a 2-layer
    Llama over SmolLM2's real tokenizer with ``<image>`` added. Needs Pillow."""
    import torch
    import transformers as tf  # deferred: importing attnviz does not import transformers

    from .models import embedded_source

    folder, kwargs = embedded_source("smollm2")
    tokenizer = tf.AutoTokenizer.from_pretrained(folder, **kwargs)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = tf.CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    text = tf.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
    )
    image_id: Any = tokenizer.convert_tokens_to_ids("<image>")
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=int(image_id))
    torch.manual_seed(seed)
    model = tf.AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation or "sdpa")
    images = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = tf.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return model.eval(), processor
