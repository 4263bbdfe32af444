"""CLIP and SigLIP, the joint text–image models: two towers, the parts ``text`` and ``vision`` of one
capture (a joint checkpoint's name loads as the joint model, both towers; its vision tower alone is
captured as its :class:`~attnviz.families.facts.VisionSpec` says, ``tower`` naming it)."""

from __future__ import annotations

from typing import Any

from .facts import Facts, TinyPair, VisionSpec
from .vision import cls

_SMALL: dict[str, Any] = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _tiny(prefix: str, images: Any) -> Any:
    """The tiny joint model of ``prefix`` (``CLIP`` / ``Siglip``): two 2-layer towers of width 32 and 4
    heads — the text tower over the tokenizer given, the vision tower reading 32×32 pictures in 8×8
    patches — and its processor, ``images(transformers)`` its image processor."""

    def build(tf: Any, tokenizer: Any) -> tuple[Any, Any]:
        ids = dict(
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        text = getattr(tf, f"{prefix}TextConfig")(
            **_SMALL, vocab_size=len(tokenizer), max_position_embeddings=64, **ids
        )
        vision = getattr(tf, f"{prefix}VisionConfig")(**_SMALL, image_size=32, patch_size=8)
        config = getattr(tf, f"{prefix}Config")(text_config=text.to_dict(), vision_config=vision.to_dict())
        return config, getattr(tf, f"{prefix}Processor")(image_processor=images(tf), tokenizer=tokenizer)

    return build


FACTS = Facts(
    rank=310,
    vision_specs={
        "clip": VisionSpec("CLIP vision tower", cls, "CLIPVisionModel", tower="vision_model"),
        "siglip": VisionSpec("SigLIP vision tower", lambda config: (), "SiglipVisionModel", tower="vision_model"),
    },
    towers={
        "clip": {"text_model": "text", "vision_model": "vision"},
        "siglip": {"text_model": "text", "vision_model": "vision"},
    },
    tiny_pairs={
        "clip": TinyPair(
            "joint",
            _tiny(
                "CLIP",
                lambda tf: tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
            ),
            "AutoModel",
        ),
        "siglip": TinyPair(
            "joint", _tiny("Siglip", lambda tf: tf.SiglipImageProcessor(size={"height": 32, "width": 32})), "AutoModel"
        ),
    },
)
