"""LLaVA: a vision-language model whose language model reads one image token per patch of its vision
tower (a CLIP tower; its ``[CLS]`` dropped by ``vision_feature_select_strategy="default"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedModelError
from .facts import Facts, ImageLayout, TinyPair, VlmSpec, tiny_language_model


def layout(config: Any, pixel_values: Any, name: str, tower_prefix: Callable[[], list[str]]) -> ImageLayout:
    """One image token per patch of the tower, after the tower's own prefix (its ``[CLS]``)."""
    patch: Any = config.vision_config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    height, width = pixel_values.shape[-2:]
    rows, cols = height // ph, width // pw
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    if strategy != "default":
        raise UnsupportedModelError(
            f"{name} selects its image features with {strategy!r}; attnviz maps image tokens to "
            "patches for vision_feature_select_strategy='default' (the [CLS] dropped) only"
        )
    return ImageLayout((ph, pw), (rows, cols), tower_prefix(), (ph, pw), (rows, cols))


def tiny(tf: Any, tokenizer: Any) -> tuple[Any, Any]:
    """A 2-layer CLIP vision tower reading 32×32 pictures in 8×8 patches (16 image tokens, its ``[CLS]``
    dropped) beside the tiny language model, and ``LlavaProcessor``."""
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = tiny_language_model(tf, tokenizer)
    small: dict[str, Any] = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    vision = tf.CLIPVisionConfig(image_size=32, patch_size=8, **small)
    image_id = int(tokenizer.convert_tokens_to_ids("<image>"))
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id)
    images = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = tf.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return config, processor


FACTS = Facts(
    rank=320,
    towers={"llava": {"vision_tower": "vision"}},
    vlms={"llava": VlmSpec("LLaVA", layout)},
    tiny_pairs={"llava": TinyPair("vlm", tiny, "AutoModelForImageTextToText")},
)
