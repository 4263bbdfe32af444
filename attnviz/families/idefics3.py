"""Idefics3 (the architecture of SmolVLM): one image token per ``scale_factor × scale_factor`` block of
its vision tower's patches (the connector's pixel shuffle), the picture as one tile — its processor
with ``do_image_splitting=False``; a picture split into tiles is refused, saying so. SmolVLM's own
model type is refused with a picture: its processor is untested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedModelError
from .facts import Facts, ImageLayout, TinyPair, VlmSpec, split_refusal, tiny_language_model


def layout(config: Any, pixel_values: Any, name: str, tower_prefix: Callable[[], list[str]]) -> ImageLayout:
    """One image token per block of ``scale_factor × scale_factor`` patches; its tower has no ``[CLS]``."""
    patch: Any = config.vision_config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    height, width = pixel_values.shape[-2:]
    rows, cols = height // ph, width // pw
    tiles = pixel_values.shape[1] if pixel_values.dim() == 5 else 1
    if tiles != 1:
        raise UnsupportedModelError(split_refusal(name, f"{tiles} pictures"))
    s = int(config.scale_factor)
    if rows != cols or rows % s:  # the connector's pixel shuffle reads a square grid in s × s blocks
        raise UnsupportedModelError(
            f"{name}'s vision tower reads {rows}×{cols} patches, which its connector cannot "
            f"pixel-shuffle in {s}×{s} blocks; use the processor of this model"
        )
    return ImageLayout((ph, pw), (rows, cols), [], (ph * s, pw * s), (rows // s, cols // s))


def tiny(tf: Any, tokenizer: Any) -> tuple[Any, Any]:
    """A 2-layer Idefics3 (SigLIP-style) tower reading 64×64 pictures in 8×8 patches, its connector's pixel
    shuffle (``scale_factor=2``) making 16 image tokens of 2×2 patches each, beside the tiny language
    model, and ``Idefics3Processor`` with ``do_image_splitting=False`` (the picture whole, resized to 64×64)."""
    # the processor's tokens: the image's, the ones around it, and the tiles' (unused whole)
    tiles = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    around = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
    tokenizer.add_special_tokens({"additional_special_tokens": around + tiles})
    text = tiny_language_model(tf, tokenizer)
    small: dict[str, Any] = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    vision = tf.Idefics3VisionConfig(image_size=64, patch_size=8, **small).to_dict()
    image_id = int(tokenizer.convert_tokens_to_ids("<image>"))
    config = tf.Idefics3Config(vision_config=vision, text_config=text, image_token_id=image_id, scale_factor=2)
    images = tf.Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": 64}, max_image_size={"longest_edge": 64}
    )
    return config, tf.Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=16)


FACTS = Facts(
    rank=330,
    towers={"idefics3": {"vision_model": "vision"}},  # model.vision_model; its language model is model.text_model
    vlms={"idefics3": VlmSpec("Idefics3", layout, reads_tiles=True)},
    refused_vlms={
        "smolvlm": (
            "SmolVLM: its processor needs torchvision (for its video processor) and num2words, which attnviz's "
            "tests do not install, so how it lays out a picture's tokens is untested (its model is Idefics3's, "
            "which is tested)"
        )
    },
    tiny_pairs={"idefics3": TinyPair("vlm", tiny, "AutoModelForImageTextToText")},
)
