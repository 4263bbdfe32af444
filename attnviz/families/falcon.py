"""Falcon: computed inline, tapped through projection hooks.

With ALiBi (``alibi=True``, e.g. falcon-rw): fused ``[head, 3, d]`` (or multi-query ``[head + 2, d]``).
Before transformers 5.25 its eager path adds alibi·inv_norm to the scores and the mask it receives
carries ALiBi as well (sdpa: the mask only); from 5.25 only the mask carries it, on both backends, and
attnviz moves it into the bias (``_bias``, ``_mask``). Without ALiBi (falcon-7b, -40b): RoPE applied
inside the module (``rotate``), no bias; the new decoder architecture fuses ``[kv_head, group + 2, d]``.
When a transformers release changes how the module receives a term, the spec reads both forms, told
apart by the module itself (:func:`falcon_passes_alibi`), never by a version number.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import Tensor, nn

from .facts import Facts, Family, ProjectionSpec, Tiny, alibi_per_item

__all__ = ["FACTS", "falcon_passes_alibi"]


_TAKES_ALIBI: dict[type[nn.Module], bool] = {}


def _takes_alibi(attention_class: type[nn.Module]) -> bool:
    """Whether a Falcon attention class takes ALiBi as an ``alibi`` argument (transformers < 5.25:
    its eager path adds ``alibi·inv_norm`` to the scores and its mask carries ALiBi too) — from 5.25
    ALiBi reaches it only inside the additive mask, already ÷√d (``FalconModel.forward``)."""
    if attention_class not in _TAKES_ALIBI:
        _TAKES_ALIBI[attention_class] = "alibi" in inspect.signature(attention_class.forward).parameters
    return _TAKES_ALIBI[attention_class]


def _falcon_passes_alibi(module: Any) -> bool:
    return _takes_alibi(type(module))


def falcon_passes_alibi() -> bool:
    """Whether the installed transformers' Falcon passes ALiBi as an argument (< 5.25) rather than in its mask."""
    from transformers.models.falcon import modeling_falcon

    return _takes_alibi(modeling_falcon.FalconAttention)


def _falcon_refusal(config) -> str | None:
    alibi = getattr(config, "alibi", False)
    if getattr(config, "new_decoder_architecture", False) and alibi and falcon_passes_alibi():
        return (
            "Falcon's new_decoder_architecture with ALiBi is not supported with transformers < 5.25 "
            "(with rotary embeddings it is; from 5.25 both are)"
        )
    return None


def _falcon_rotary(module: Any, inputs: dict, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """Falcon without ALiBi rotates q and k inside its attention module: the rotation of its own
    modeling file (``apply_rotary_pos_emb``) with the ``position_embeddings`` (cos, sin) it was given."""
    if module.config.alibi:
        return q, k
    cos, sin = inputs["position_embeddings"]
    rotary = sys.modules[type(module).__module__].apply_rotary_pos_emb
    return rotary(q, k, cos, sin)


def _falcon_mask_alibi(module: Any, inputs: dict, batch: int) -> Tensor:  # [b, h, 1, k]
    """The ALiBi term Falcon's additive mask carries on every key it lets through (transformers ≥ 5.25),
    one row per head: a key's term is the same for every query that may see it; a key no query sees
    (padding) gets 0, which is what ``build_alibi_tensor`` gives a padded key."""
    mask = inputs["attention_mask"]
    allowed = mask > torch.finfo(mask.dtype).min / 2
    seen = torch.where(allowed, mask, torch.finfo(mask.dtype).min).amax(dim=-2, keepdim=True)
    return torch.where(allowed.any(dim=-2, keepdim=True), seen, 0).expand(batch, module.num_heads, 1, -1)


def _falcon_bias(module: Any, inputs: dict, batch: int) -> Tensor | None:
    if not module.config.alibi:
        return None
    if not _falcon_passes_alibi(module):  # ≥ 5.25: in the mask only, moved here (the mask becomes bool)
        return _falcon_mask_alibi(module, inputs, batch)
    if module.config._attn_implementation == "sdpa":  # < 5.25's sdpa path: in the mask only, left there
        return None
    return alibi_per_item(module, inputs["alibi"], batch) * module.inv_norm_factor


def _falcon_mask(module: Any, inputs: dict, n: int) -> Tensor | None:
    mask = inputs.get("attention_mask")
    if mask is None or not module.config.alibi or _falcon_passes_alibi(module):
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # ≥ 5.25: its ALiBi is the bias (``_falcon_bias``)


def _falcon_mask_bias(module: Any, inputs: dict, batch: int) -> Tensor | None:
    if inputs.get("alibi") is None:  # no ALiBi, or ≥ 5.25 (the mask is bool already, the bias holds it)
        return None
    return alibi_per_item(module, inputs["alibi"], batch) * module.inv_norm_factor


FACTS = Facts(
    rank=180,
    rows=(
        Family(
            "Falcon (alibi=True)",
            "projection hooks",
            "decoder",
            "ALiBi",
            "falcon_alibi",
            "from transformers 5.25 both backends add ALiBi once, recorded as the bias; before, its sdpa path "
            "adds it once (left in the mask) where eager adds it twice; each backend's own numbers are shown",
            ("eager",),
        ),
        Family(
            "Falcon (rotary)",
            "projection hooks",
            "decoder",
            "RoPE inside the module",
            "falcon",
            "q and k rotated by its own apply_rotary_pos_emb; multi-query",
        ),
        Family(
            "Falcon (new decoder architecture)",
            "projection hooks",
            "decoder",
            "RoPE inside the module, GQA",
            "falcon_new",
            "q/k/v fused per key/value group",
        ),
    ),
    projection_specs={
        "falcon": ProjectionSpec(
            "FalconAttention",
            q=None,
            k=None,
            v=None,
            fused="query_key_value",
            layout="interleaved",
            out="dense",
            scaling=lambda m: m.inv_norm_factor,
            mask="attention_mask",
            refuse=_falcon_refusal,
            rotate=_falcon_rotary,
            bias=_falcon_bias,
            mask_from=_falcon_mask,
            mask_bias=_falcon_mask_bias,
        )
    },
    causal_lm_types=frozenset({"falcon"}),
    tiny={
        "falcon_alibi": Tiny(
            lambda tf: tf.FalconConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                vocab_size=128,
                alibi=True,
                multi_query=False,
                new_decoder_architecture=False,
                parallel_attn=False,
                bias=True,
            )
        ),
        "falcon": Tiny(
            lambda tf: tf.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
        ),
        "falcon_new": Tiny(
            lambda tf: tf.FalconConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_kv_heads=2,
                new_decoder_architecture=True,
                vocab_size=128,
            )
        ),
    },
)
