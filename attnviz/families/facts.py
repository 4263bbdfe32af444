"""The types of a model family's facts, and the few helpers families share.

A family module (one file under :mod:`attnviz.families`) holds a :class:`Facts`: its support-table
rows (:class:`Family`), where its inline attention lives (:class:`ProjectionSpec`), its vision layout
(:class:`VisionSpec`), its towers, its VLM layout (:class:`VlmSpec`), its tiny test models
(:class:`Tiny`, :class:`TinyPair`), what it refuses. The registry (``attnviz/families/__init__.py``)
collects them; the engine and the workflows read the registry, never a family by name. This module
imports nothing of attnviz's, so the engine and every family can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

__all__ = [
    "TINY_COMMON",
    "TINY_SEQ2SEQ",
    "TINY_T5",
    "TINY_VISION",
    "Facts",
    "Family",
    "ImageLayout",
    "ProjectionSpec",
    "QKWeights",
    "ResidualSpec",
    "Tiny",
    "TinyPair",
    "VisionSpec",
    "VlmSpec",
    "alibi_per_item",
    "heads_of_linear",
    "inputs_view",
    "split_refusal",
    "tiny_language_model",
]


# ---------------------------------------------------------------- families computed inline
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


# ---------------------------------------------------------------- the residual stream (qk_attribution)
#: what a family's ``ResidualSpec.qk`` gives: (W_q [head·d_head, hidden], b_q [head·d_head] | None,
#: W_k [kv_head·d_head, hidden], b_k | None) — the projections as ``x @ Wᵀ + b``, heads side by side
QKWeights = tuple[Tensor, Tensor | None, Tensor, Tensor | None]


def heads_of_linear(q: Any, k: Any) -> QKWeights:
    """:attr:`ResidualSpec.qk` of a family with two ``nn.Linear`` projections (Llama's ``q_proj`` / ``k_proj``)."""
    return q.weight, q.bias, k.weight, k.bias


@dataclass(frozen=True)
class ResidualSpec:
    """Where a family writes and reads its residual stream: what :func:`attnviz.qk_attribution` hooks.

    The stream entering a layer is a sum of what wrote it: the embeddings (``embeddings``: each
    label and the module, from ``model.base_model``, whose output is added), every earlier head (its
    ``α·V`` through its slice of the output projection, which :mod:`attnviz.engine.projections` finds
    beside ``attention``), every earlier MLP (``mlp``: the module whose output is its write) and the
    biases. ``layout``: ``"pre"`` — a norm (``norm``) before each attention, the writes added to the
    stream as they are; ``"parallel"`` — the same, attention and MLP reading one normed stream (GPT-J,
    GPT-NeoX); ``"post"`` — a norm on the stream after each write (``stream_norms``, from a block, and
    ``embedding_norm``, from the base model: BERT), each applied to every component with its scale held.
    ``norm_kind``: ``"layer"`` (centred, a bias) or ``"rms"``. ``qk(attention module)``: the Q and K
    projections as :data:`QKWeights`. ``rope``: None, ``"half"`` (rotate-half: Llama, NeoX) or ``"pairs"``
    (GPT-J's rotate-every-two), its cos and sin read from the attention module's ``position_embeddings``
    argument, in the order ``rope_order`` (the rotated width is theirs: partial rotary reads itself)."""

    layout: str
    blocks: str  # path from model.base_model to the list of blocks
    embeddings: tuple[tuple[str, str], ...]  # (label, path from base_model) of each embedding added
    attention: str  # path from a block to its attention module
    mlp: str  # path from a block to the module whose output is the MLP's write
    qk: Callable[[Any], QKWeights]
    norm: str | None = None  # pre / parallel: path from a block to the norm before its attention
    norm_kind: str = "layer"
    stream_norms: tuple[str, ...] = ()  # post: paths from a block of the norms on the stream, in order
    embedding_norm: str | None = None  # post: path from base_model of the embeddings' norm
    rope: str | None = None
    rope_order: str = "cos_sin"


def inputs_view(name: str, reshape: Callable[[Any, Tensor, int], Tensor]) -> Callable:
    """A :attr:`ProjectionSpec.bias` reading the attention module's input ``name``, reshaped."""

    def get(module: Any, inputs: dict[str, Any], batch: int) -> Tensor | None:
        value = inputs.get(name)
        return None if value is None else reshape(module, value, batch)

    return get


def alibi_per_item(module: Any, alibi: Tensor, batch: int) -> Tensor:  # [b·h, 1, k] or [b, h, 1, k] -> [b, h, 1, k]
    """ALiBi as Bloom builds it (``build_alibi_tensor``, Bloom's and Falcon's), one row per item and head."""
    return alibi.reshape(batch, module.num_heads, 1, -1)


# ---------------------------------------------------------------- the support table
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


# ---------------------------------------------------------------- pictures
@dataclass(frozen=True)
class VisionSpec:
    """How a vision encoder lays out the tokens its attention reads: the tokens before the patches
    (labels, from the config), then one token per patch, row by row."""

    name: str
    prefix: Callable[[Any], tuple[str, ...]]  # labels of the tokens before the patches
    model_class: str  # the transformers class a name of this family loads as (the vision tower of CLIP/SigLIP)
    tower: str | None = None  # a joint text–image model's attribute holding its vision tower (CLIPModel.vision_model)


@dataclass(frozen=True)
class ImageLayout:
    """Where a VLM's picture's tokens sit: the vision tower's patches (``tower_patch`` pixels each, a
    ``tower_grid``, after its ``prefix``), and the language model's image tokens (one per ``patch``
    block of pixels, a ``grid``, row by row)."""

    tower_patch: tuple[int, int]
    tower_grid: tuple[int, int]
    prefix: list[str]
    patch: tuple[int, int]
    grid: tuple[int, int]


def split_refusal(name: str, what: str) -> str:
    """Why a processor that splits a picture into tiles (``do_image_splitting``) is refused, and what to set."""
    return (
        f"{name}'s processor splits the picture into {what} (do_image_splitting), each read by the vision "
        "tower alone beside a downscaled whole; attnviz maps one tile to the picture: set "
        "processor.image_processor.do_image_splitting = False (the picture is then read whole, at max_image_size)"
    )


@dataclass(frozen=True)
class VlmSpec:
    """A vision-language family attnviz captures: its name, and where its image tokens come from.

    ``layout(config, pixel_values, name, tower_prefix)`` gives the :class:`ImageLayout` of a processed
    batch of pictures (``tower_prefix()``: the labels of the tokens its vision tower reads before the
    patches, from the tower's :class:`VisionSpec`; it raises where the tower is not one attnviz knows).
    ``reads_tiles``: its processor may split a picture into tiles (``do_image_splitting``), which attnviz
    refuses; the dashboard reads such a picture whole instead."""

    name: str
    layout: Callable[[Any, Any, str, Callable[[], list[str]]], ImageLayout]
    reads_tiles: bool = False


# ---------------------------------------------------------------- tiny models, for tests
#: the sizes most tiny configs share: 2 layers of width 32, 4 heads, a vocabulary of 128
TINY_COMMON: dict[str, Any] = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128
)
#: the tiny encoder-decoders' sizes (BART's names)
TINY_SEQ2SEQ: dict[str, Any] = dict(
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
#: the T5 family's tiny sizes (T5's names)
TINY_T5: dict[str, Any] = dict(
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
#: the tiny vision encoders: 32×32 images in 8×8 patches (a 4×4 grid)
TINY_VISION: dict[str, Any] = dict(
    image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
)


@dataclass(frozen=True)
class Tiny:
    """A tiny randomly initialised model of a family, for tests, examples and the support sweep.

    ``config(transformers)`` makes its config (transformers is handed in: a family module does not
    import it); ``auto`` the Auto class it is built with (None: ``AutoModelForSeq2SeqLM`` for an
    encoder-decoder, else ``AutoModelForCausalLM``); ``processor`` a vision family's image processor
    (its transformers class name and the arguments that make it read the tiny model's pictures)."""

    config: Callable[[Any], Any]
    auto: str | None = None
    processor: tuple[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class TinyPair:
    """A tiny model of two towers and its processor, for tests: ``build(transformers, tokenizer)`` gives
    (its config, its processor) over a real tokenizer (SmolLM2's, handed in, to which it may add its
    special tokens), and ``auto`` the Auto class that builds it. ``kind``: ``vlm`` or ``joint``."""

    kind: str
    build: Callable[[Any, Any], tuple[Any, Any]]
    auto: str


# ---------------------------------------------------------------- one family
@dataclass(frozen=True, eq=False)
class Facts:
    """Everything attnviz knows about one family (or a close group), as the registry collects it.

    ``rank`` orders the families' rows in the support table (lower first); every mapping is keyed by
    ``config.model_type`` except ``tiny`` and ``tiny_pairs`` (keyed by the tiny family's name)."""

    rank: int = 1000
    rows: tuple[Family, ...] = ()  # its rows of the support table
    projection_specs: Mapping[str, ProjectionSpec] = field(default_factory=dict)  # attention computed inline
    # modules that run for several layers of one forward (ALBERT): how many attention calls one forward makes
    shared_layers: Mapping[str, Callable[[Any], int]] = field(default_factory=dict)
    causal_lm_types: frozenset[str] = frozenset()  # hub configs that may lack `architectures` but are causal LMs
    reserved_positions: Mapping[str, int] = field(default_factory=dict)  # positions taken from max_position_embeddings
    vision_specs: Mapping[str, VisionSpec] = field(default_factory=dict)
    towers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # path component naming a tower → part
    vlms: Mapping[str, VlmSpec] = field(default_factory=dict)
    refused_vlms: Mapping[str, str] = field(default_factory=dict)  # a VLM whose picture is refused, and why
    tiny: Mapping[str, Tiny] = field(default_factory=dict)
    tiny_pairs: Mapping[str, TinyPair] = field(default_factory=dict)
    # where its residual stream is written and read, per model type (qk_attribution; others refused)
    residual: Mapping[str, ResidualSpec] = field(default_factory=dict)


def tiny_language_model(tf: Any, tokenizer: Any) -> dict[str, Any]:
    """A tiny VLM's language model: a 2-layer Llama of width 32 over ``tokenizer`` (its config as a dict)."""
    return tf.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
    ).to_dict()
