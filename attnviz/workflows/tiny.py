"""Tiny random models of the families attnviz claims, for tests, examples and the support sweep:
:func:`tiny_model` (a family's tiny config, randomly initialised, in eval mode; :func:`tiny_families`
lists them) and :func:`tiny_processor` (a tiny vision family's image processor). The models of two
towers have their own builders beside their workflows (``workflows.capture.joint.tiny_joint``,
``workflows.capture.vlm.tiny_vlm``)."""

from __future__ import annotations

from typing import Any

import torch

from ..engine.vision_specs import vision_spec
from ..errors import InputError, UnsupportedModelError

__all__ = ["tiny_families", "tiny_model", "tiny_processor"]


def _tiny_configs() -> dict:
    import transformers as tf  # deferred: importing attnviz does not import transformers

    common: dict[str, Any] = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128
    )
    seq2seq: dict[str, Any] = dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=128,
        max_position_embeddings=64,
    )
    t5: dict[str, Any] = dict(
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        vocab_size=128,
        decoder_start_token_id=0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    vision: dict[str, Any] = dict(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
    )
    # DeBERTa-v3's layout: c2p and p2c, log-bucketed relative positions, q/k shared with them
    deberta_v3: dict[str, Any] = dict(
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_buckets=8,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
    )
    return {
        "bert": lambda: tf.BertConfig(max_position_embeddings=64, **common),
        "roberta": lambda: tf.RobertaConfig(max_position_embeddings=66, pad_token_id=1, **common),
        "gpt2": lambda: tf.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=0
        ),
        "llama": lambda: tf.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **common),
        "qwen2": lambda: tf.Qwen2Config(num_key_value_heads=2, max_position_embeddings=64, **common),
        "mistral": lambda: tf.MistralConfig(
            num_key_value_heads=2, max_position_embeddings=64, sliding_window=4, **common
        ),
        "gpt_oss": lambda: tf.GptOssConfig(
            num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=4, **common
        ),
        "bart": lambda: tf.BartConfig(**seq2seq),
        "marian": lambda: tf.MarianConfig(**seq2seq, decoder_start_token_id=0, pad_token_id=0),
        "t5": lambda: tf.T5Config(**t5),
        "mt5": lambda: tf.MT5Config(**t5),
        "umt5": lambda: tf.UMT5Config(**t5),
        "longt5": lambda: tf.LongT5Config(**t5, local_radius=2),
        "gpt_neo": lambda: tf.GPTNeoConfig(
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            max_position_embeddings=64,
            vocab_size=128,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "xglm": lambda: tf.XGLMConfig(
            d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, vocab_size=128, max_position_embeddings=64
        ),
        "openai-gpt": lambda: tf.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128),
        "bloom": lambda: tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=128),
        "mpt": lambda: tf.MptConfig(
            d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=64, vocab_size=128
        ),
        "falcon_alibi": lambda: tf.FalconConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=128,
            alibi=True,
            multi_query=False,
            new_decoder_architecture=False,
            parallel_attn=False,
            bias=True,
        ),
        "falcon": lambda: tf.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128),
        "falcon_new": lambda: tf.FalconConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            vocab_size=128,
        ),
        "albert": lambda: tf.AlbertConfig(embedding_size=16, **common),
        # deberta-base's layout: c2p and p2c, no absolute positions in the input
        "deberta": lambda: tf.DebertaConfig(
            max_position_embeddings=64,
            relative_attention=True,
            pos_att_type=["c2p", "p2c"],
            position_biased_input=False,
            **common,
        ),
        "mpnet": lambda: tf.MPNetConfig(max_position_embeddings=66, pad_token_id=1, **common),
        "deberta_v2": lambda: tf.DebertaV2Config(max_position_embeddings=64, **deberta_v3, **common),
        # vision encoders: 32×32 images in 8×8 patches (a 4×4 grid)
        "vit": lambda: tf.ViTConfig(**vision, intermediate_size=64),
        "deit": lambda: tf.DeiTConfig(**vision, intermediate_size=64),
        "dinov2": lambda: tf.Dinov2Config(**vision, mlp_ratio=2),
        "dinov2_registers": lambda: tf.Dinov2WithRegistersConfig(**vision, mlp_ratio=2, num_register_tokens=4),
        "clip_vision": lambda: tf.CLIPVisionConfig(**vision, intermediate_size=64),
        "siglip_vision": lambda: tf.SiglipVisionConfig(**vision, intermediate_size=64),
    }


def tiny_families() -> list[str]:
    """The families :func:`tiny_model` builds."""
    return list(_tiny_configs())


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
    encoder through projection hooks) and ``deberta`` (v1, deberta-base's layout). A configuration
    attnviz refuses comes from ``overrides`` (e.g. ``talking_head=True``, LongT5's
    ``encoder_attention_type="transient-global"``); they go to the config (e.g. ``num_key_value_heads=2``).
    Encoder-decoders come with their LM head (``…ForConditionalGeneration``), decoders as causal
    LMs, BERT, RoBERTa, ALBERT, DeBERTa and MPNet as bare encoders. ``attn_implementation`` ``None`` takes sdpa where the
    family has it, else eager.
    """
    import transformers as tf  # deferred: importing attnviz does not import transformers

    configs = _tiny_configs()
    if family not in configs:
        raise InputError(f"unknown tiny family {family!r}; choose from {', '.join(configs)}")
    config = configs[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model_cls: Any
    if family in {"bert", "roberta", "albert", "deberta_v2", "deberta", "mpnet"} or vision_spec(config) is not None:
        model_cls = tf.AutoModel  # a vision config's AutoModel is its encoder (CLIPVisionModel …)
    elif config.is_encoder_decoder:
        model_cls = tf.AutoModelForSeq2SeqLM
    else:
        model_cls = tf.AutoModelForCausalLM
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


#: the image processor of each tiny vision family: its transformers class, and how it reaches 32×32
_TINY_PROCESSORS: dict[str, tuple[str, dict[str, Any]]] = {
    "vit": ("ViTImageProcessor", {"size": {"height": 32, "width": 32}}),
    "deit": ("DeiTImageProcessor", {"size": {"height": 36, "width": 36}, "crop_size": {"height": 32, "width": 32}}),
    "dinov2": ("BitImageProcessor", {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}}),
    "clip_vision": ("CLIPImageProcessor", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}),
    "siglip_vision": ("SiglipImageProcessor", {"size": {"height": 32, "width": 32}}),
}
_TINY_PROCESSORS["dinov2_registers"] = _TINY_PROCESSORS["dinov2"]


def tiny_processor(family: str):
    """The image processor of a tiny vision family of :func:`tiny_model`: the class its real
    checkpoints use (ViT's, DeiT's, DINOv2's ``BitImageProcessor``, CLIP's, SigLIP's), set to the tiny
    model's 32×32 input. Needs Pillow."""
    import transformers as tf  # deferred: importing attnviz does not import transformers

    if family not in _TINY_PROCESSORS:
        raise InputError(f"{family!r} is not a tiny vision family; choose from {', '.join(_TINY_PROCESSORS)}")
    name, kwargs = _TINY_PROCESSORS[family]
    cls = getattr(tf, f"{name}Pil", None) or getattr(tf, name)  # the Pillow backend (no torchvision needed)
    return cls(**kwargs)
