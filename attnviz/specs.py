"""Architecture facts, as data, for families whose attention does not dispatch through
transformers' AttentionInterface. For those, attnviz taps the projection modules instead: forward
hooks on the query/key/value projections (or one fused projection) record Q, K, V, and a forward
pre-hook on the output projection records the attention output (heads concatenated) — the model's
own A·V, which validation compares with the recomputation, so a wrong spec cannot go unnoticed.

Families that do dispatch through the interface (BERT, RoBERTa, GPT-2, Llama, Qwen2, Mistral,
SmolLM2 and most recent ones) need no spec at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

__all__ = ["PROJECTION_SPECS", "ProjectionSpec", "supported_families"]


@dataclass(frozen=True)
class ProjectionSpec:
    """Where one family's attention lives and how it scores."""

    module: str  # class name of the attention module
    q: str | None = "q_proj"  # child projections (None when fused)
    k: str | None = "k_proj"
    v: str | None = "v_proj"
    fused: str | None = None  # one child producing [q | k | v] concatenated on the last dimension
    out: str = "out_proj"  # the output projection; its input is the attention output
    heads: str = "num_heads"  # attribute holding the number of heads
    scaling: Callable[[nn.Module], float] = lambda m: m.head_dim ** -0.5
    causal: bool = True
    window: Callable[[nn.Module], int | None] = lambda m: None


PROJECTION_SPECS: dict[str, ProjectionSpec] = {
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
        "Attention", q=None, k=None, v=None, fused="c_attn", out="c_proj", heads="n_head",
        scaling=lambda m: (m.split_size // m.n_head) ** -0.5 if m.scale else 1.0,
    ),
}

INTERFACE_FAMILIES = ("bert", "roberta", "gpt2", "llama", "qwen2", "mistral", "smollm2 (llama)")


def supported_families() -> str:
    return (
        "any model whose attention dispatches through transformers' AttentionInterface (tested: "
        + ", ".join(INTERFACE_FAMILIES) + "), and by projection hooks: " + ", ".join(PROJECTION_SPECS)
    )
