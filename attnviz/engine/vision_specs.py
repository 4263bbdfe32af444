"""Architecture facts of pictures, as data: the vision encoders attnviz captures and the models of two towers.

- :data:`VISION_SPECS` (:func:`vision_spec`): how each vision encoder lays out the tokens its attention
  reads — the tokens before the patches, then the patches row by row — and the class a name loads as;
- :data:`TOWERS`: which path component of a model of two towers (CLIP, SigLIP, LLaVA) names which
  part, what :func:`attnviz.engine.specs.locate` reads a recorded call's part from.

The text families' facts are :mod:`attnviz.engine.specs`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TOWERS", "VISION_SPECS", "VisionSpec", "vision_spec"]

# ---------------------------------------------------------------- models of two towers
#: models of two towers, by ``config.model_type``: the path component that names a tower → its part. A
#: joint text–image model's towers are ``text`` and ``vision``; a vision-language model's vision tower is
#: ``vision`` beside its language model (``decoder``, as any one-stack causal model)
TOWERS: dict[str, dict[str, str]] = {
    "clip": {"text_model": "text", "vision_model": "vision"},
    "siglip": {"text_model": "text", "vision_model": "vision"},
    "llava": {"vision_tower": "vision"},
    "idefics3": {"vision_model": "vision"},  # model.vision_model; its language model is model.text_model
}


# ---------------------------------------------------------------- vision encoders
@dataclass(frozen=True)
class VisionSpec:
    """How a vision encoder lays out the tokens its attention reads: the tokens before the patches
    (labels, from the config), then one token per patch, row by row."""

    name: str
    prefix: Callable[[Any], tuple[str, ...]]  # labels of the tokens before the patches
    model_class: str  # the transformers class a name of this family loads as (the vision tower of CLIP/SigLIP)
    tower: str | None = None  # a joint text–image model's attribute holding its vision tower (CLIPModel.vision_model)


def _cls(config) -> tuple[str, ...]:
    return ("[CLS]",)


def _cls_and_registers(config) -> tuple[str, ...]:
    return ("[CLS]",) + tuple(f"[REG{i}]" for i in range(int(getattr(config, "num_register_tokens", 0))))


#: the vision encoders attnviz captures from images, by ``config.model_type``; their attention goes
#: through the AttentionInterface, bidirectional, one part (``encoder``). ``clip`` and ``siglip`` are
#: the joint checkpoints' model types (a name of one loads as the joint model, both towers:
#: ``workflows.capture.models.model_kind``; ``tower`` names its vision tower, captured alone as this spec says).
VISION_SPECS: dict[str, VisionSpec] = {
    "vit": VisionSpec("ViT", _cls, "ViTModel"),
    "deit": VisionSpec("DeiT", lambda config: ("[CLS]", "[DIST]"), "DeiTModel"),  # + the distillation token
    "dinov2": VisionSpec("DINOv2", _cls, "Dinov2Model"),
    "dinov2_with_registers": VisionSpec("DINOv2 with registers", _cls_and_registers, "Dinov2WithRegistersModel"),
    "clip_vision_model": VisionSpec("CLIP vision tower", _cls, "CLIPVisionModel"),
    "clip": VisionSpec("CLIP vision tower", _cls, "CLIPVisionModel", tower="vision_model"),
    "siglip_vision_model": VisionSpec("SigLIP vision tower", lambda config: (), "SiglipVisionModel"),  # no CLS
    "siglip": VisionSpec("SigLIP vision tower", lambda config: (), "SiglipVisionModel", tower="vision_model"),
}


def vision_spec(config) -> VisionSpec | None:
    """The :class:`VisionSpec` of a config's family (None: not a vision encoder attnviz knows)."""
    return VISION_SPECS.get(getattr(config, "model_type", "") or "")
