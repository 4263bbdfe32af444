"""The generic vocabulary of attention calls: where a call sits, which arguments it may carry, and what is supported.

Most families need nothing here: their attention modules call transformers' AttentionInterface,
and the taps read Q, K, V, the mask, the scaling and every other argument of that call. What is
here:

- where a recorded call sits: which path components name an encoder-decoder model's stacks and
  its cross-attention (:data:`CROSS_ATTENTION_NAMES`), see :func:`locate`;
- which arguments of an attention call change nothing attnviz computes (:data:`INERT_ARGUMENTS`)
  and which it reproduces (:data:`INTERPRETED_ARGUMENTS`) — anything else refuses the capture;
- where an attention module's output projection sits (:data:`OUTPUT_PROJECTIONS`), and the layout of
  a fused q/k/v projection (:func:`fused_layout`);
- which ``AutoModel*`` class loads a name (:func:`model_class_name`);
- what is supported and what is refused (:func:`refusal`, :func:`check_supported`,
  :func:`supported_families`, :func:`support_table` — the support table of docs/guides/capture.md,
  generated from the families' rows; a test keeps them equal).

Every fact of a particular family — its model types, projection spec, biases, refusals, support-table
rows, vision and tower facts — is in its own module under :mod:`attnviz.families`, read here through
the registry (``attnviz.families``), never by a family's name.
"""

from __future__ import annotations

import re

from torch import nn

from ..errors import UnsupportedModelError
from ..families import CAUSAL_LM_TYPES, FAMILIES, PROJECTION_SPECS
from ..families.facts import ProjectionSpec

__all__ = [
    "CROSS_ATTENTION_NAMES",
    "ENCODER_DECODER_PARTS",
    "INERT_ARGUMENTS",
    "INTERPRETED_ARGUMENTS",
    "OUTPUT_PROJECTIONS",
    "PARTS",
    "TRANSPOSED_WEIGHTS",
    "check_supported",
    "fused_layout",
    "locate",
    "model_class_name",
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
    :data:`attnviz.families.TOWERS`): the part of the tower named in the path. One-stack
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
def fused_layout(spec: ProjectionSpec, module: nn.Module) -> str:
    if spec.layout == "interleaved" and getattr(module, "new_decoder_architecture", False):
        return "grouped"
    if spec.layout == "interleaved" and getattr(module, "multi_query", False):
        return "multi_query"
    return spec.layout


# ---------------------------------------------------------------- loading
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
    """The support table (markdown) of docs/guides/capture.md, generated from the families' rows (:data:`attnviz.families.FAMILIES`)."""
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
