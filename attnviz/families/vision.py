"""The vision encoders attnviz captures from images (ViT, DeiT, DINOv2, DINOv2 with registers, CLIP's
and SigLIP's vision towers alone): their attention goes through the AttentionInterface,
bidirectional, one part (``encoder``); each lays out the tokens before its patches (its
:class:`~attnviz.families.facts.VisionSpec`), then one token per patch, row by row."""

from __future__ import annotations

from typing import Any

from .facts import TINY_VISION, Facts, Tiny, VisionSpec

__all__ = ["FACTS", "cls", "cls_and_registers"]


def cls(config: Any) -> tuple[str, ...]:
    """One ``[CLS]`` before the patches."""
    return ("[CLS]",)


def cls_and_registers(config: Any) -> tuple[str, ...]:
    """``[CLS]``, then the config's register tokens (DINOv2 with registers)."""
    return ("[CLS]",) + tuple(f"[REG{i}]" for i in range(int(getattr(config, "num_register_tokens", 0))))


_DINOV2_PROCESSOR = ("BitImageProcessor", {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}})

FACTS = Facts(
    rank=300,
    vision_specs={
        "vit": VisionSpec("ViT", cls, "ViTModel"),
        "deit": VisionSpec("DeiT", lambda config: ("[CLS]", "[DIST]"), "DeiTModel"),  # + the distillation token
        "dinov2": VisionSpec("DINOv2", cls, "Dinov2Model"),
        "dinov2_with_registers": VisionSpec("DINOv2 with registers", cls_and_registers, "Dinov2WithRegistersModel"),
        "clip_vision_model": VisionSpec("CLIP vision tower", cls, "CLIPVisionModel"),
        "siglip_vision_model": VisionSpec("SigLIP vision tower", lambda config: (), "SiglipVisionModel"),  # no CLS
    },
    # 32×32 images in 8×8 patches (a 4×4 grid); each with the image processor its real checkpoints use,
    # set to that size (Pillow's backend: no torchvision needed)
    tiny={
        "vit": Tiny(
            lambda tf: tf.ViTConfig(**TINY_VISION, intermediate_size=64),
            auto="AutoModel",
            processor=("ViTImageProcessor", {"size": {"height": 32, "width": 32}}),
        ),
        "deit": Tiny(
            lambda tf: tf.DeiTConfig(**TINY_VISION, intermediate_size=64),
            auto="AutoModel",
            processor=(
                "DeiTImageProcessor",
                {"size": {"height": 36, "width": 36}, "crop_size": {"height": 32, "width": 32}},
            ),
        ),
        "dinov2": Tiny(
            lambda tf: tf.Dinov2Config(**TINY_VISION, mlp_ratio=2), auto="AutoModel", processor=_DINOV2_PROCESSOR
        ),
        "dinov2_registers": Tiny(
            lambda tf: tf.Dinov2WithRegistersConfig(**TINY_VISION, mlp_ratio=2, num_register_tokens=4),
            auto="AutoModel",
            processor=_DINOV2_PROCESSOR,
        ),
        "clip_vision": Tiny(
            lambda tf: tf.CLIPVisionConfig(**TINY_VISION, intermediate_size=64),
            auto="AutoModel",
            processor=(
                "CLIPImageProcessor",
                {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
            ),
        ),
        "siglip_vision": Tiny(
            lambda tf: tf.SiglipVisionConfig(**TINY_VISION, intermediate_size=64),
            auto="AutoModel",
            processor=("SiglipImageProcessor", {"size": {"height": 32, "width": 32}}),
        ),
    },
)
