"""Architecture facts, as data: everything attnviz knows about particular model families.

Most families need nothing here: their attention modules call transformers' AttentionInterface,
and the taps read Q, K, V, the mask, the scaling and every other argument of that call. What is
here:

- where a recorded call sits: which path components name an encoder-decoder model's stacks and
  its cross-attention (:data:`CROSS_ATTENTION_NAMES`), see :func:`locate`;
- which arguments of an attention call change nothing attnviz computes (:data:`INERT_ARGUMENTS`)
  and which it reproduces (:data:`INTERPRETED_ARGUMENTS`) — anything else refuses the capture;
- families whose attention is computed inline, tapped through forward hooks on their projections
  (:data:`PROJECTION_SPECS`): where q/k/v live, fused layouts, the scaling, ALiBi biases, masks;
- which ``AutoModel*`` class loads a name, and each family's position limit quirks;
- :data:`FAMILIES`: what is supported, reproduced against the model's own eager attention by the
  tests, or refused — the support table of docs/guides/capture.md is generated from it (a test keeps them equal).

The facts of vision encoders and of models of two towers are :mod:`attnviz.engine.vision_specs`'.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError

__all__ = [
    "CROSS_ATTENTION_NAMES",
    "ENCODER_DECODER_PARTS",
    "PARTS",
    "FAMILIES",
    "INERT_ARGUMENTS",
    "INTERPRETED_ARGUMENTS",
    "OUTPUT_PROJECTIONS",
    "PROJECTION_SPECS",
    "SHARED_LAYERS",
    "TRANSPOSED_WEIGHTS",
    "Family",
    "ProjectionSpec",
    "check_supported",
    "locate",
    "refusal",
    "supported_families",
    "support_table",
]

# ---------------------------------------------------------------- where a call sits
PARTS = ("encoder", "decoder", "cross", "text", "vision")  # the attentions a capture can hold, in this order
ENCODER_DECODER_PARTS = PARTS[:3]  # what an encoder-decoder model's capture holds, all three
#: path components that mark a cross-attention module (decoder queries over encoder keys)
CROSS_ATTENTION_NAMES = frozenset(
    {
        "encoder_attn",  # BART, mBART, Marian, Pegasus, M2M100, Whisper, NLLB-MoE …
        "EncDecAttention",  # T5, mT5, UMT5, LongT5, Switch
        "crossattention",  # BERT / RoBERTa as decoders with add_cross_attention
        "cross_attn",
        "cross_attention",
    }
)
STACKS = ("encoder", "decoder")
_INDEX = re.compile(r"^\d+$")


def locate(
    name: str,
    *,
    encoder_decoder: bool,
    causal: bool,
    layer_idx: int | None = None,
    towers: dict[str, str] | None = None,
) -> tuple[str, int]:
    """``(part, layer)`` of the attention module at ``name`` (its path in the model).

    Encoder-decoder models: the part is the stack named in the path (``encoder`` / ``decoder``),
    or ``cross`` for a cross-attention module in the decoder. Models of two towers (``towers``, from
    :data:`attnviz.engine.vision_specs.TOWERS`): the part of the tower named in the path. One-stack
    models: ``decoder`` when the attention is causal, ``encoder`` otherwise. The layer is the first index in the path after
    the stack or tower (``model.decoder.layers.3.encoder_attn`` → 3), else the module's ``layer_idx``, else 0.
    """
    parts = name.split(".")
    start = 0
    part = "decoder" if causal else "encoder"
    tower = next((i for i, p in enumerate(parts) if p in (towers or {})), None)
    if tower is not None and towers is not None:
        start, part = tower + 1, towers[parts[tower]]
    elif encoder_decoder:
        stack = next((i for i, p in enumerate(parts) if p in STACKS), None)
        if stack is not None:
            start = stack + 1
            part = parts[stack]
        if part == "decoder" and any(p in CROSS_ATTENTION_NAMES for p in parts[start:]):
            part = "cross"
    layer = next((int(p) for p in parts[start:] if _INDEX.match(p)), None)
    if layer is None:
        layer = layer_idx if isinstance(layer_idx, int) else 0
    return part, layer


# ---------------------------------------------------------------- arguments of an attention call
#: keyword arguments that reach attention functions but change nothing in the attention maths
INERT_ARGUMENTS = frozenset(
    {
        "dropout",  # checked separately: must be 0 (the model is in eval mode)
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "output_router_logits",
        "cache_position",
        "past_key_values",
        "cache",
        "layer_idx",
        "encoder_hidden_states",
        "position_ids",  # RoPE is already in q and k; packed sequences would come with cu_seq_lens_*
        "token_type_ids",
        "target_dtype",
    }
)
# Anything else that is not None/False — head_mask, cu_seq_lens_q/k (packed sequences), an
# unknown tensor — refuses the capture.
#: keyword arguments attnviz reproduces (recorded into the call, used by its own SDPA)
INTERPRETED_ARGUMENTS = frozenset(
    {
        "scaling",
        "is_causal",
        "sliding_window",
        "softcap",
        "position_bias",  # T5 family: relative position bias, added to the scores
        "s_aux",  # gpt-oss: one learned sink logit per head
    }
)


# ---------------------------------------------------------------- one module, many layers
#: families whose attention modules each run for several layers of one forward (ALBERT: one layer's
#: weights shared by the whole stack, ``num_hidden_groups`` groups of ``inner_group_num`` layers):
#: a call's layer is its index among the model's attention calls in the forward — the value here, from
#: the config, is how many attention calls one forward makes (the count runs on, modulo it, over
#: several forwards in one tap). Any other module that runs twice in a forward stays refused.
SHARED_LAYERS: dict[str, Callable[[Any], int]] = {
    "albert": lambda config: config.num_hidden_layers * config.inner_group_num,
}


# ---------------------------------------------------------------- what a head writes
#: where an attention module's output projection sits (its input: the heads' A·V, concatenated
#: head by head), tried in order from the module that called the attention: a child — Llama, Qwen,
#: Mistral, gpt-oss ``o_proj``; BART, Marian ``out_proj``; GPT-2 ``c_proj``; T5 ``o`` — or, written
#: ``../output/dense``, a child of the module's parent (BERT, RoBERTa: ``attention.self`` is the
#: attention, ``attention.output.dense`` projects it before the residual and LayerNorm). Families
#: computed inline name theirs in :attr:`ProjectionSpec.out`. The self-check proves each against the
#: projection's own output, so a wrong guess fails instead of drawing.
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "o", "dense", "../output/dense")
#: module classes that store their weight as ``[in, out]`` (transformers' ``Conv1D``: GPT-2, GPT-1)
TRANSPOSED_WEIGHTS = frozenset({"Conv1D"})


# ---------------------------------------------------------------- families computed inline
def _module_inputs_view(name: str, reshape: Callable[[Any, Tensor, int], Tensor]) -> Callable:
    def get(module: Any, inputs: dict[str, Any], batch: int) -> Tensor | None:
        value = inputs.get(name)
        return None if value is None else reshape(module, value, batch)

    return get


@dataclass(frozen=True)
class ProjectionSpec:
    """Where one family's inline attention lives and how it scores.

    The taps record the output of the q/k/v projections (or one fused projection, split by
    ``layout``), the input of the output projection (the model's own A·V, heads concatenated),
    and the attention module's own inputs (``mask`` and ``bias`` read them by name).
    """

    module: str  # class name of the attention module
    q: str | None = "q_proj"  # child projections (None when fused)
    k: str | None = "k_proj"
    v: str | None = "v_proj"
    fused: str | None = None  # one child producing q, k and v
    # fused: "concat" [q | k | v]; "interleaved" [head, 3, d]; "multi_query" [head + 2, d];
    # "grouped" [kv_head, group + 2, d] (Falcon's new decoder architecture)
    layout: str = "concat"
    out: str = "out_proj"  # the output projection; its input is the attention output
    heads: str = "num_heads"  # attribute holding the number of query heads
    scaling: Callable[[Any], float] = lambda m: m.head_dim**-0.5
    causal: bool = True
    window: Callable[[Any], int | None] = lambda m: None
    clip: Callable[[Any], float | None] = lambda m: None  # q/k/v clamped to ±clip after the projection
    bias: Callable[[Any, dict, int], Tensor | None] = lambda m, inputs, batch: None  # [b|1, head, q|1, k]
    mask: str | None = None  # the module input holding its mask (None: only the causal structure)
    mask_true_means_masked: bool = False  # a bool mask where True *blocks* (MPT)
    # the additive term an additive mask carries on every key it lets through, [b|1, head, q|1, k]
    # (Falcon folds ALiBi into its mask): edits that unblock a key add it there too
    mask_bias: Callable[[Any, dict, int], Tensor | None] = lambda m, inputs, batch: None
    # a term of the scores that is a function of this call's Q and K ([batch, head, pos, d]) or of
    # their length — DeBERTa's c2p / p2c relative terms, LongT5's blocked relative bias — computed by
    # the module's own code from what the hooks kept, [b, head, q, k]: recorded as its *value* for
    # this input (an edit of the weights keeps it)
    qk_bias: Callable[[Any, dict, Tensor, Tensor], Tensor | None] = lambda m, inputs, q, k: None
    # the dense "may attend" mask [b, 1, q, k] of a module whose mask input has a form of its own
    # (LongT5's blocked local mask), from its inputs and the number of tokens; None: ``mask`` says
    mask_from: Callable[[Any, dict, int], Tensor | None] | None = None
    # the model's other attention modules call the AttentionInterface (LongT5's decoder and
    # cross-attention): the interface wrapper is installed beside the hooks
    interface_too: bool = False
    # parameters the module adds to q and to v after the projection, [head·d] each (DeBERTa v1's
    # q_bias and v_bias, its fused in_proj having none)
    qv_bias: Callable[[Any], tuple[Tensor | None, Tensor | None]] = lambda m: (None, None)
    # q and k as the module's own code turns them after the projection, before Q·Kᵀ (Falcon's inline
    # RoPE): ``(module, inputs, q, k) -> (q, k)``, each [batch, head, pos, d]
    rotate: Callable[[Any, dict, Tensor, Tensor], tuple[Tensor, Tensor]] = lambda m, inputs, q, k: (q, k)
    refuse: Callable[[Any], str | None] = lambda config: None  # why a config of this family is not supported


def _alibi_per_item(module: Any, alibi: Tensor, batch: int) -> Tensor:  # [b·h, 1, k] or [b, h, 1, k] -> [b, h, 1, k]
    return alibi.reshape(batch, module.num_heads, 1, -1)


def _mpt_bias(module: Any, bias: Tensor, batch: int) -> Tensor:  # [h, 1, max_len] -> [1, h, 1, max_len]
    return bias[None]


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


def unblock(blocked: Tensor, n: int) -> tuple[Tensor, Tensor]:  # [B, blocks, H, L, 3L] -> [B, H, n, n], [n, n]
    """LongT5's local attention layout made dense: query ``i`` (block ``i // L``, row ``i % L``) sees
    the 3L keys of the blocks before, at and after its own, key ``j`` in slot ``j - (i // L - 1)·L``.
    Returns the dense values (0 where ``j`` is not in those blocks) and where it is."""
    length = blocked.shape[-2]
    i = torch.arange(n, device=blocked.device)
    block, row = i // length, i % length
    slot = i[None, :] - (block[:, None] - 1) * length  # [q, k]
    inside = (slot >= 0) & (slot < 3 * length)
    values = blocked[:, block[:, None], :, row[:, None], slot.clamp(0, 3 * length - 1)]  # [q, k, B, H]
    return values.permute(2, 3, 0, 1).masked_fill(~inside, 0), inside


def _longt5_mask(module: Any, inputs: dict, n: int) -> Tensor:  # [b, 1, n, n] bool
    """LongT5's local mask [b, 1, blocks, L, 3L] (the locality and the padding), dense."""
    allowed, inside = unblock(inputs["mask"].transpose(1, 2) > 0, n)
    return allowed & inside


def _longt5_bias(module: Any, inputs: dict, q: Tensor, k: Tensor) -> Tensor:  # [b|1, head, n, n]
    """LongT5's relative position bias over its local blocks, dense: the first layer's from its own
    ``compute_bias``, a later layer's from the ``position_bias`` the first passed on (which carries
    the mask as -1e10: those keys are masked anyway, so they are zeroed here)."""
    blocked = inputs.get("position_bias")
    if blocked is None:
        blocked = module.compute_bias(module.block_len) if module.has_relative_attention_bias else None
        if blocked is None:
            return q.new_zeros(1, q.shape[1], q.shape[-2], q.shape[-2])
        blocked = blocked[0]  # [1, 1, h, L, 3L] -> [1, h, L, 3L] per block: one for every block
        blocked = blocked[:, None].expand(1, -(-q.shape[-2] // module.block_len), *blocked.shape[1:])
    dense, _ = unblock(blocked, q.shape[-2])
    return dense.masked_fill(~_longt5_mask(module, inputs, q.shape[-2]), 0)


def _longt5_refusal(config) -> str | None:
    if getattr(config, "encoder_attention_type", "local") != "local":
        return (
            "LongT5 with transient-global attention: its encoder's keys include one aggregate per block "
            "of the text (a sum of token states, not a token), which a token × token map cannot show"
        )
    return None


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
    return _alibi_per_item(module, inputs["alibi"], batch) * module.inv_norm_factor


def _falcon_mask(module: Any, inputs: dict, n: int) -> Tensor | None:
    mask = inputs.get("attention_mask")
    if mask is None or not module.config.alibi or _falcon_passes_alibi(module):
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # ≥ 5.25: its ALiBi is the bias (``_falcon_bias``)


def _falcon_mask_bias(module: Any, inputs: dict, batch: int) -> Tensor | None:
    if inputs.get("alibi") is None:  # no ALiBi, or ≥ 5.25 (the mask is bool already, the bias holds it)
        return None
    return _alibi_per_item(module, inputs["alibi"], batch) * module.inv_norm_factor


def _bloom_refusal(config) -> str | None:
    if getattr(config, "pretraining_tp", 1) > 1 and getattr(config, "slow_but_exact", False):
        return "Bloom with pretraining_tp > 1 and slow_but_exact=True bypasses its output projection"
    return None


PROJECTION_SPECS: dict[str, ProjectionSpec] = {
    # DeBERTa-v2/v3: scores = Q·Kᵀ/√(d·f) + c2p + p2c (f = 1 + the relative terms), computed inline;
    # the relative terms are the module's own disentangled_attention_bias, recorded as a bias; its
    # mask [b, 1, n, n] is 0/1 (1 = may attend); its output projection is attention.output.dense
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
    # GPT-Neo: no scaling at all; "local" layers see only the last window_size tokens
    "gpt_neo": ProjectionSpec(
        "GPTNeoSelfAttention",
        scaling=lambda m: 1.0,
        window=lambda m: m.config.window_size if m.attention_type == "local" else None,
    ),
    # XGLM: the query is multiplied by `scaling` after q_proj
    "xglm": ProjectionSpec("XGLMAttention", scaling=lambda m: m.scaling),
    # GPT-1: a fused Conv1D c_attn, split three ways; ÷√d only when the module's `scale` is set
    "openai-gpt": ProjectionSpec(
        "Attention",
        q=None,
        k=None,
        v=None,
        fused="c_attn",
        out="c_proj",
        heads="n_head",
        scaling=lambda m: (m.split_size // m.n_head) ** -0.5 if m.scale else 1.0,
    ),
    # Bloom: fused [head, 3, d]; ALiBi passed in as `alibi` [b·h, 1, k]; scores = alibi + qkᵀ/√d
    "bloom": ProjectionSpec(
        "BloomAttention",
        q=None,
        k=None,
        v=None,
        fused="query_key_value",
        layout="interleaved",
        out="dense",
        scaling=lambda m: m.inv_norm_factor,
        bias=_module_inputs_view("alibi", _alibi_per_item),
        mask="attention_mask",
        refuse=_bloom_refusal,
    ),
    # MPT: fused [q | k | v], optionally clamped; ALiBi as `position_bias` [h, 1, max_len]; bool mask True = blocked
    "mpt": ProjectionSpec(
        "MptAttention",
        q=None,
        k=None,
        v=None,
        fused="Wqkv",
        heads="n_heads",
        scaling=lambda m: m.softmax_scale,
        clip=lambda m: m.clip_qkv,
        bias=_module_inputs_view("position_bias", _mpt_bias),
        mask="attention_mask",
        mask_true_means_masked=True,
    ),
    # Falcon (alibi=True, e.g. falcon-rw): fused [head, 3, d] (or multi-query [head + 2, d]). Before
    # transformers 5.25 its eager path adds alibi·inv_norm to the scores and the mask it receives
    # carries ALiBi as well (sdpa: the mask only); from 5.25 only the mask carries it, on both
    # backends, and attnviz moves it into the bias (``_falcon_bias``, ``_falcon_mask``).
    # Without ALiBi (falcon-7b, -40b): RoPE applied inside the module (``rotate``), no bias; the new
    # decoder architecture fuses [kv_head, group + 2, d]
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
    ),
    # DeBERTa (v1): one fused in_proj split per head [head, 3, d], q_bias and v_bias added after it,
    # Q divided by √(d·f) before Q·Kᵀ; c2p / p2c as v2's, by the module's own disentangled_att_bias
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
    # LongT5 (local attention): the encoder attends within blocks of local_radius + 1 tokens to the
    # keys at most local_radius away, unscaled, plus a bucketed relative bias over the blocks; its
    # decoder and cross-attention are T5's, through the interface
    "longt5": ProjectionSpec(
        "LongT5LocalAttention",
        q="q",
        k="k",
        v="v",
        out="o",
        heads="n_heads",
        scaling=lambda m: 1.0,
        causal=False,
        qk_bias=_longt5_bias,
        mask_from=_longt5_mask,
        interface_too=True,
        refuse=_longt5_refusal,
    ),
    # MPNet: T5-style bucketed relative position bias, computed once by the encoder and passed to
    # every layer as `position_bias` [b, h, q, k]; scores = qkᵀ/√d + position_bias + additive mask
    "mpnet": ProjectionSpec(
        "MPNetSelfAttention",
        q="q",
        k="k",
        v="v",
        out="o",
        heads="num_attention_heads",
        scaling=lambda m: m.attention_head_size**-0.5,
        causal=False,
        mask="attention_mask",
        bias=lambda m, inputs, batch: inputs.get("position_bias"),
    ),
}


def fused_layout(spec: ProjectionSpec, module: nn.Module) -> str:
    if spec.layout == "interleaved" and getattr(module, "new_decoder_architecture", False):
        return "grouped"
    if spec.layout == "interleaved" and getattr(module, "multi_query", False):
        return "multi_query"
    return spec.layout


# ---------------------------------------------------------------- loading
#: model types whose hub configs may lack `architectures` but that are causal language models
CAUSAL_LM_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gpt2", "phi3", "gemma2", "bloom", "mpt", "falcon"})
#: positions a family reserves from max_position_embeddings (RoBERTa's padding offset)
RESERVED_POSITIONS = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


def model_class_name(config) -> str:
    """``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM`` / ``AutoModel`` for a config."""
    architectures = getattr(config, "architectures", None) or []
    if getattr(config, "is_encoder_decoder", False) or any(
        a.endswith("ForConditionalGeneration") for a in architectures
    ):
        return "AutoModelForSeq2SeqLM"
    if any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in architectures):
        return "AutoModelForCausalLM"
    if getattr(config, "model_type", "") in CAUSAL_LM_TYPES:
        return "AutoModelForCausalLM"
    return "AutoModel"


# ---------------------------------------------------------------- what is supported
@dataclass(frozen=True)
class Family:
    """One row of the support table."""

    name: str
    how: str  # "interface" | "projection hooks" | "refused"
    parts: str  # which attentions a capture holds
    position: str  # how positions enter attention
    tiny: str | None = None  # the tiny_model family the tests compare with the model's own eager attention
    note: str = ""
    backends: tuple[str, ...] = field(default=("eager", "sdpa"))
    model_types: tuple[str, ...] = ()  # for refused families: the config model types refused before running


FAMILIES: tuple[Family, ...] = (
    Family("BERT", "interface", "encoder", "learned absolute", "bert"),
    Family("RoBERTa", "interface", "encoder", "learned absolute", "roberta"),
    Family("GPT-2", "interface", "decoder", "learned absolute", "gpt2", "fused c_attn; per-layer scaling"),
    Family("Llama / SmolLM2", "interface", "decoder", "RoPE, GQA", "llama"),
    Family("Qwen2", "interface", "decoder", "RoPE, GQA", "qwen2"),
    Family("Mistral", "interface", "decoder", "RoPE, GQA, sliding window", "mistral"),
    Family(
        "gpt-oss",
        "interface",
        "decoder",
        "RoPE, GQA, learned sinks",
        "gpt_oss",
        "the sink's share of each row is shown",
        ("eager",),
    ),
    Family("BART", "interface", "encoder, decoder, cross", "learned absolute", "bart"),
    Family("Marian", "interface", "encoder, decoder, cross", "sinusoidal", "marian"),
    Family("T5", "interface", "encoder, decoder, cross", "relative position bias", "t5"),
    Family("mT5", "interface", "encoder, decoder, cross", "relative position bias", "mt5"),
    Family("UMT5", "interface", "encoder, decoder, cross", "relative position bias per layer", "umt5"),
    Family(
        "GPT-Neo",
        "projection hooks",
        "decoder",
        "learned absolute, local windows",
        "gpt_neo",
        "unscaled scores",
        ("eager",),
    ),
    Family("XGLM", "projection hooks", "decoder", "sinusoidal", "xglm", "", ("eager",)),
    Family("GPT-1", "projection hooks", "decoder", "learned absolute", "openai-gpt", "", ("eager",)),
    Family("Bloom", "projection hooks", "decoder", "ALiBi", "bloom", "", ("eager",)),
    Family("MPT", "projection hooks", "decoder", "ALiBi", "mpt", "", ("eager",)),
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
    Family(
        "MPNet",
        "projection hooks",
        "encoder",
        "relative position bias",
        "mpnet",
        "one bucketed bias, computed once, for every layer",
        ("eager",),
    ),
    Family(
        "LongT5 (local)",
        "projection hooks",
        "encoder, decoder, cross",
        "relative position bias in local blocks",
        "longt5",
        "the encoder by projection hooks (its blocks drawn dense), the decoder through the interface",
        ("eager",),
    ),
    Family(
        "LongT5 (transient-global)",
        "refused",
        "—",
        "local blocks and per-block aggregates",
        None,
        "its encoder's keys include one aggregate per block of the text, not a token",
    ),
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
    Family(
        "ALBERT",
        "interface",
        "encoder",
        "learned absolute",
        "albert",
        "one attention module runs for every layer: a call's layer is its index in the forward",
    ),
)


def refusal(config) -> str | None:
    """Why attnviz refuses a model of this config before running it, or None."""
    model_type = getattr(config, "model_type", "")
    for family in FAMILIES:
        if family.how == "refused" and model_type in family.model_types:
            return f"{family.name}: {family.note}"
    spec = PROJECTION_SPECS.get(model_type)
    return spec.refuse(config) if spec is not None else None


def check_supported(config) -> None:
    """Raise :class:`UnsupportedModelError` (why, and what is supported) for a config :func:`refusal` refuses."""
    reason = refusal(config)
    if reason:
        raise UnsupportedModelError(f"{reason}. attnviz supports {supported_families()}")


def support_table() -> str:
    """The support table (markdown) of docs/guides/capture.md, generated from :data:`FAMILIES`."""
    lines = [
        "| family | how attnviz taps it | parts | positions | checked against its own eager attention |",
        "|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        if f.how == "refused":
            checked = f"refused with `UnsupportedModelError`: {f.note}"
        else:
            checked = f"yes, {' and '.join(f.backends)}" + (f" ({f.note})" if f.note else "")
        lines.append(f"| {f.name} | {f.how} | {f.parts} | {f.position} | {checked} |")
    return "\n".join(lines)


def supported_families() -> str:
    tapped = [f.name for f in FAMILIES if f.how == "interface"]
    hooked = [f.name for f in FAMILIES if f.how == "projection hooks"]
    return (
        "any model whose attention dispatches through transformers' AttentionInterface (tested: "
        + ", ".join(tapped)
        + "), and by projection hooks: "
        + ", ".join(hooked)
    )
