"""DeBERTa-v2 / v3 and DeBERTa (v1): computed inline, tapped through projection hooks.

scores = Q·Kᵀ/√(d·f) + c2p + p2c (f = 1 + the relative terms); the relative terms are the module's
own ``disentangled_attention_bias`` (v1: ``disentangled_att_bias``), recorded as a bias — their value
for this input. v2's mask ``[b, 1, n, n]`` is 0/1 (1 = may attend); the output projection is
``attention.output.dense``. v1 fuses ``in_proj`` per head ``[head, 3, d]``, adds ``q_bias`` and
``v_bias`` after it and divides Q by √(d·f) before Q·Kᵀ.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from torch import Tensor

from .facts import TINY_COMMON, Facts, Family, ProjectionSpec, Tiny


def _deberta_scale_factor(module: Any) -> int:
    """DeBERTa's ``scale_factor``: 1, plus one per relative term (c2p, p2c) its scores add."""
    return 1 + sum(term in module.pos_att_type for term in ("c2p", "p2c"))


def _deberta_scaling(module: Any) -> float:
    """``1/√(d·scale_factor)``: DeBERTa divides Q·Kᵀ (and each relative term) by ``√(d·scale_factor)``."""
    return 1.0 / math.sqrt(module.attention_head_size * _deberta_scale_factor(module))


def _deberta_relative(module: Any, inputs: dict, q: Tensor, k: Tensor) -> Tensor | None:  # [b, head, q, k]
    """DeBERTa's c2p + p2c terms for this call, by the module's own ``disentangled_attention_bias``
    on the call's Q and K (in its ``[batch·head, pos, d]`` layout), relative positions and relative
    embeddings — the very function its forward added to the scores, so the value is the model's."""
    if not module.relative_attention or not module.pos_att_type:
        return None
    b, h, n_q, d = q.shape
    scores = module.disentangled_attention_bias(
        q.reshape(b * h, n_q, d),
        k.reshape(b * h, k.shape[-2], d),
        inputs.get("relative_pos"),
        module.pos_dropout(inputs["rel_embeddings"]),
        _deberta_scale_factor(module),
    )
    return None if isinstance(scores, int) else scores.view(b, h, n_q, -1)


def _deberta_v1_relative(module: Any, inputs: dict, q: Tensor, k: Tensor) -> Tensor | None:  # [b, head, q, k]
    """DeBERTa (v1)'s c2p + p2c terms, by the module's own ``disentangled_att_bias`` on the call's Q
    divided as its forward divides it (its file's ``scaled_size_sqrt``), K, relative positions and
    relative embeddings."""
    if not module.relative_attention or inputs.get("rel_embeddings") is None or inputs.get("relative_pos") is None:
        return None
    factor = 1 + len(module.pos_att_type)
    scaled = q / sys.modules[type(module).__module__].scaled_size_sqrt(q, factor).to(dtype=q.dtype)
    score = module.disentangled_att_bias(
        scaled, k, inputs["relative_pos"], module.pos_dropout(inputs["rel_embeddings"]), factor
    )
    return None if isinstance(score, int) else score


def _deberta_v1_refusal(config) -> str | None:
    if getattr(config, "talking_head", False):
        return (
            "DeBERTa (v1) with talking_head=True mixes the heads' scores before the softmax and their "
            "weights after it, so no head's map is a softmax of its own Q·Kᵀ"
        )
    return None


# DeBERTa-v3's layout: c2p and p2c, log-bucketed relative positions, q/k shared with them
_V3: dict[str, Any] = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=8,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
    position_biased_input=False,
)

FACTS = Facts(
    rank=210,
    rows=(
        Family(
            "DeBERTa-v2 / v3",
            "projection hooks",
            "encoder",
            "disentangled relative (c2p, p2c)",
            "deberta_v2",
            "the relative terms are recorded as a bias, their value for this input",
            ("eager",),
        ),
        Family(
            "DeBERTa (v1)",
            "projection hooks",
            "encoder",
            "disentangled relative (c2p, p2c)",
            "deberta",
            "fused in_proj with q_bias and v_bias; talking_head=True is refused (it mixes the heads)",
            ("eager",),
        ),
    ),
    projection_specs={
        "deberta-v2": ProjectionSpec(
            "DisentangledSelfAttention",
            q="query_proj",
            k="key_proj",
            v="value_proj",
            out="../output/dense",
            heads="num_attention_heads",
            scaling=_deberta_scaling,
            causal=False,
            mask="attention_mask",
            qk_bias=_deberta_relative,
        ),
        "deberta": ProjectionSpec(
            "DisentangledSelfAttention",
            q=None,
            k=None,
            v=None,
            fused="in_proj",
            layout="interleaved",
            out="../output/dense",
            heads="num_attention_heads",
            scaling=lambda m: 1.0 / math.sqrt(m.attention_head_size * (1 + len(m.pos_att_type))),
            causal=False,
            mask="attention_mask",
            qv_bias=lambda m: (m.q_bias, m.v_bias),
            qk_bias=_deberta_v1_relative,
            refuse=_deberta_v1_refusal,
        ),
    },
    tiny={
        # deberta-base's layout: c2p and p2c, no absolute positions in the input
        "deberta": Tiny(
            lambda tf: tf.DebertaConfig(
                max_position_embeddings=64,
                relative_attention=True,
                pos_att_type=["c2p", "p2c"],
                position_biased_input=False,
                **TINY_COMMON,
            ),
            auto="AutoModel",
        ),
        "deberta_v2": Tiny(
            lambda tf: tf.DebertaV2Config(max_position_embeddings=64, **_V3, **TINY_COMMON), auto="AutoModel"
        ),
    },
)
