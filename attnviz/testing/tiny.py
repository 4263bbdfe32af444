"""Tiny random models of the families attnviz claims, for tests, examples and the support sweep:
:func:`tiny_model` (a family's tiny config, randomly initialised, in eval mode; :func:`tiny_families`
lists them), :func:`tiny_processor` (a tiny vision family's image processor), and the models of two
towers with their processors, :func:`tiny_joint` (CLIP, SigLIP) and :func:`tiny_vlm` (LLaVA,
Idefics3). Each config is its family's (:attr:`attnviz.families.facts.Facts.tiny`,
:attr:`~attnviz.families.facts.Facts.tiny_pairs`); this module only builds them."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError, UnsupportedModelError
from ..families import TINY, TINY_PAIRS
from ..workflows.capture.models import embedded_source

__all__ = ["tiny_families", "tiny_joint", "tiny_model", "tiny_processor", "tiny_vlm"]


def tiny_families() -> list[str]:
    """The families :func:`tiny_model` builds."""
    return list(TINY)


def tiny_model(family: str, *, attn_implementation: str | None = None, seed: int = 0, **overrides):
    """A tiny randomly initialised model of a family (for tests and examples), in eval mode.

    Families (see :func:`tiny_families`): ``bert``, ``roberta``, ``gpt2``, ``llama``, ``qwen2``,
    ``mistral``, ``gpt_oss`` and the encoder-decoders ``bart``, ``marian``, ``t5``, ``mt5``,
    ``umt5`` (through the AttentionInterface); ``gpt_neo``, ``xglm``, ``openai-gpt``, ``bloom``,
    ``mpt``, ``falcon_alibi``, ``falcon`` (rotary, multi-query), ``falcon_new`` (its new decoder
    architecture), ``deberta_v2`` (DeBERTa-v3's layout), ``mpnet`` (through projection hooks),
    ``albert`` (one attention module for every layer); the vision encoders ``vit``, ``deit``,
    ``dinov2``, ``dinov2_registers``, ``clip_vision``, ``siglip_vision`` (32×32 images, 8×8 patches;
    :func:`tiny_processor` gives their image processor); ``longt5`` (its local attention's
    encoder through projection hooks) and ``deberta`` (v1, deberta-base's layout) — and any family
    registered since (:func:`attnviz.families.register`). A configuration attnviz refuses comes from
    ``overrides`` (e.g. ``talking_head=True``, LongT5's ``encoder_attention_type="transient-global"``);
    they go to the config (e.g. ``num_key_value_heads=2``). Each family's tiny says its Auto class:
    encoder-decoders come with their LM head (``…ForConditionalGeneration``), decoders as causal LMs,
    BERT, RoBERTa, ALBERT, DeBERTa, MPNet and the vision encoders as bare encoders. ``attn_implementation``
    ``None`` takes sdpa where the family has it, else eager.
    """
    import transformers as tf  # deferred: importing attnviz does not import transformers

    if family not in TINY:
        raise InputError(f"unknown tiny family {family!r}; choose from {', '.join(TINY)}")
    tiny = TINY[family]
    config = tiny.config(tf)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    auto = tiny.auto or ("AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM")
    model_cls: Any = getattr(tf, auto)
    try:
        model = model_cls.from_config(config, attn_implementation=attn_implementation or "sdpa")
    except (ValueError, ImportError) as err:
        if attn_implementation is not None:
            raise UnsupportedModelError(
                f"transformers cannot build {family} with attn_implementation={attn_implementation!r} "
                f"({err}); leave it None for the family's default, or try 'eager'"
            ) from err
        torch.manual_seed(seed)
        model = model_cls.from_config(config, attn_implementation="eager")
    model.eval()
    return model


def tiny_processor(family: str):
    """The image processor of a tiny vision family of :func:`tiny_model`: the class its real
    checkpoints use (ViT's, DeiT's, DINOv2's ``BitImageProcessor``, CLIP's, SigLIP's), set to the tiny
    model's 32×32 input. Needs Pillow."""
    import transformers as tf  # deferred: importing attnviz does not import transformers

    vision = [name for name, tiny in TINY.items() if tiny.processor is not None]
    if family not in vision:
        raise InputError(f"{family!r} is not a tiny vision family; choose from {', '.join(vision)}")
    processor = TINY[family].processor
    assert processor is not None
    name, kwargs = processor
    cls = getattr(tf, f"{name}Pil", None) or getattr(tf, name)  # the Pillow backend (no torchvision needed)
    return cls(**kwargs)


def _pair(kind: str, family: str, attn_implementation: str | None, seed: int) -> tuple[Any, Any]:
    import transformers as tf  # deferred: importing attnviz does not import transformers

    names = [name for name, pair in TINY_PAIRS.items() if pair.kind == kind]
    if family not in names:
        raise InputError(f"tiny_{kind} builds {' or '.join(map(repr, names))}, not {family!r}")
    pair = TINY_PAIRS[family]
    folder, kwargs = embedded_source("smollm2")
    tokenizer = tf.AutoTokenizer.from_pretrained(folder, **kwargs)
    config, processor = pair.build(tf, tokenizer)
    torch.manual_seed(seed)
    model = getattr(tf, pair.auto).from_config(config, attn_implementation=attn_implementation or "sdpa")
    return model.eval(), processor


def tiny_joint(family: str = "clip", *, attn_implementation: str | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(a tiny random ``CLIPModel`` or ``SiglipModel``, its processor), for tests and examples: two
    2-layer towers of width 32 and 4 heads — the text tower over SmolLM2's real tokenizer, the vision
    tower reading 32×32 pictures in 8×8 patches (CLIP: ``[CLS]`` + 16 patches; SigLIP: 16 patches)."""
    return _pair("joint", family, attn_implementation, seed)


def tiny_vlm(family: str = "llava", *, attn_implementation: str | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(a tiny random vision-language model, its processor), for tests and examples; the language model
    a 2-layer Llama over SmolLM2's real tokenizer with the image tokens added. Needs Pillow.

    - ``"llava"``: a 2-layer CLIP vision tower reading 32×32 pictures in 8×8 patches (16 image tokens,
      its ``[CLS]`` dropped), ``LlavaProcessor``;
    - ``"idefics3"``: a 2-layer Idefics3 (SigLIP-style) tower reading 64×64 pictures in 8×8 patches, its
      connector's pixel shuffle (``scale_factor=2``) making 16 image tokens of 2×2 patches each,
      ``Idefics3Processor`` with ``do_image_splitting=False`` (the picture whole, resized to 64×64)."""
    return _pair("vlm", family, attn_implementation, seed)
