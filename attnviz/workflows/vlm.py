"""A vision-language model's capture: its language model over the text and the picture's tokens, and
its vision tower over the picture.

A LLaVA-style model (:data:`VLM_TYPES`) reads a prompt whose ``<image>`` placeholder the processor
expands to one token per image feature; the vision tower's patches, through the projector, fill those
positions, and the language model attends over the merged sequence. A capture has two parts:

- ``decoder``, the language model's attention (through the AttentionInterface like any decoder): the
  text tokens as the tokenizer wrote them, each image position labelled by the patch it came from
  (``(row,col)``: the vision tower's grid, its ``[CLS]`` dropped by
  ``vision_feature_select_strategy="default"``), and ``cap.image`` the picture with the text before the
  image as its ``prefix`` and after it as its ``suffix`` — so a text token's row is drawn over the image
  (:func:`attnviz.figures.image_attention` with ``part="decoder"`` and ``query=`` that token) beside its
  row over the text;
- ``vision``, the vision tower's own attention over its ``[CLS]`` and the patches (``cap.vision``: the
  same picture, the tower's layout; every layer of the tower runs and is recorded, also those after
  ``vision_feature_layer``, whose output the projector does not read).

A list of texts with as many pictures is one right-padded forward, a capture per text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..data.capture import Capture
from ..data.images import ImageGrid, patch_label, to_uint8
from ..data.words import TokenSequence, Word, words_from_offsets
from ..engine.taps import tap
from ..engine.vision_specs import VISION_SPECS, vision_spec
from ..errors import ArgumentTypeError, AttnvizError, InputError, UnsupportedModelError
from .images import read_image
from .models import load_processor
from .pipeline import Item, Resolved, captures, check_mode, tapped

__all__ = ["REFUSED_VLMS", "VLM_TYPES", "VlmInputs", "capture_vlm", "encode_vlm", "is_vlm", "tiny_vlm", "vlm_refusal"]

#: the vision-language families attnviz captures (their towers: :data:`attnviz.engine.vision_specs.TOWERS`)
VLM_TYPES = frozenset({"llava"})


_TILES = (
    "its picture is split into tiles and a downscaled whole, each tile's patches pixel-shuffled into one "
    "image token per scale_factor × scale_factor patches, with <row_i_col_j> text tokens between the tiles"
)
_MERGED = (
    "its vision tower reads the patches in spatial_merge_size × spatial_merge_size blocks (not row by row) "
    "and, on eager and sdpa, runs its attention once per picture in a forward; each image token of its "
    "language model stands for one such block, at 3-D (M-RoPE) positions"
)
#: vision-language families attnviz does not map to the picture yet, and why: a picture given to them is
#: refused before any forward (their text alone is captured as any decoder's)
REFUSED_VLMS = {
    "idefics3": f"Idefics3 / SmolVLM: {_TILES}",
    "smolvlm": f"SmolVLM: {_TILES}",
    "qwen2_vl": f"Qwen2-VL: {_MERGED}",
    "qwen2_5_vl": f"Qwen2.5-VL: {_MERGED} (and windowed attention in most layers)",
}


def vlm_refusal(config: Any) -> str | None:
    """Why attnviz does not capture this vision-language model with a picture (:data:`REFUSED_VLMS`), or None."""
    reason = REFUSED_VLMS.get(getattr(config, "model_type", "") or "")
    if reason is None:
        return None
    return (
        f"{reason}; attnviz does not map those image tokens to the picture yet, so it refuses the picture "
        f"rather than draw it wrong. It captures LLaVA (model_type 'llava')"
    )


def is_vlm(config: Any) -> bool:
    """Whether ``config`` is a vision-language model attnviz captures (:data:`VLM_TYPES`)."""
    return getattr(config, "model_type", None) in VLM_TYPES


def _grid(resolved: Resolved, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(patch, grid) of the vision tower for a ``height × width`` picture."""
    config: Any = resolved.model.config
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    if strategy != "default":
        raise UnsupportedModelError(
            f"{resolved.name} selects its image features with {strategy!r}; attnviz maps image tokens to "
            "patches for vision_feature_select_strategy='default' (the [CLS] dropped) only"
        )
    patch: Any = config.vision_config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    return (ph, pw), (height // ph, width // pw)


def _tower_prefix(resolved: Resolved) -> list[str]:
    """The labels of the tokens the vision tower reads before the patches (CLIP's ``[CLS]``)."""
    config: Any = resolved.model.config
    vision_config: Any = config.vision_config
    spec = vision_spec(vision_config)
    if spec is None:
        raise UnsupportedModelError(
            f"{resolved.name}'s vision tower ({getattr(vision_config, 'model_type', '?')}) is not one attnviz "
            "maps to the picture; attnviz knows " + ", ".join(sorted({s.name for s in VISION_SPECS.values()}))
        )
    return list(spec.prefix(vision_config))


def _sequence(
    text: str, ids: list[int], tokenizer: Any, placeholder: str, image_id: int, grid: tuple[int, int]
) -> tuple[TokenSequence, int, int]:
    """(the merged sequence of one text, where its image tokens start and stop): each image position
    labelled by its patch, the text's tokens and words as the tokenizer wrote them."""
    at = [i for i, t in enumerate(ids) if t == image_id]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise InputError(f"the processor put the image tokens at {at[:4]}…; attnviz expects one run of them")
    rows, cols = grid
    if len(at) != rows * cols:
        raise InputError(
            f"the processor wrote {len(at)} image tokens for a picture of {rows}×{cols} patches; use the "
            "processor of this model"
        )
    start, stop = at[0], at[-1] + 1
    # the expanded text the processor tokenized, for the text tokens' offsets and words
    expanded = text.replace(placeholder, placeholder * len(at))
    again = tokenizer(expanded, return_offsets_mapping=True)
    if again["input_ids"] != ids:
        raise InputError("the tokenizer does not give back the processor's ids for this text; pass its own processor")
    offsets = [(int(a), int(b)) for a, b in again["offset_mapping"]]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    labels = [patch_label(r, c) for r in range(rows) for c in range(cols)]
    tokens[start:stop] = labels
    words = [w for w in words_from_offsets(expanded, offsets, tokens) if w.token_stop <= start or w.token_start >= stop]
    words += [
        Word(label, offsets[start + i][0], offsets[start + i][1], start + i, start + i + 1)
        for i, label in enumerate(labels)
    ]
    words.sort(key=lambda w: w.token_start)
    return TokenSequence(expanded, tokens, ids, offsets, words), start, stop


def _own_processor(source: str) -> Any:
    """The processor saved with the model's name or folder (:func:`attnviz.workflows.models.load_processor`),
    or None where there is none: the caller then says to pass one."""
    try:
        return load_processor(source)
    except AttnvizError:
        return None


@dataclass
class VlmInputs:
    """Texts with one picture each as a VLM's processor encoded them: the forward's tensors, each text's
    merged sequence (image positions labelled by their patches) and where its image tokens are, and
    the vision tower's layout."""

    texts: list[str]
    encoded: Any  # the processor's BatchFeature: input_ids, attention_mask, pixel_values
    lengths: list[int]  # each text's tokens in the right-padded batch
    made: list[tuple[TokenSequence, int, int]]  # (sequence, first image position, after the last)
    patch: tuple[int, int]
    grid: tuple[int, int]
    prefix: list[str]  # the vision tower's tokens before its patches ([CLS])
    image_processor: Any
    tokenizer: Any  # the processor's

    @property
    def n_tower(self) -> int:
        return len(self.prefix) + self.grid[0] * self.grid[1]

    def pictures(self, b: int, tokens: list[str]) -> tuple[ImageGrid, ImageGrid]:
        """(the language model's picture: text ``tokens`` before and after the image tokens of text ``b``,
        the vision tower's picture) of item ``b``."""
        _, start, stop = self.made[b]
        ip = self.image_processor
        mean, std = getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
        pixels = to_uint8(self.encoded["pixel_values"][b], mean, std, getattr(ip, "rescale_factor", None))
        grid = ImageGrid(pixels, self.patch, self.grid, tokens[:start], tokens[stop:])
        return grid, ImageGrid(pixels, self.patch, self.grid, self.prefix)


def encode_vlm(resolved: Resolved, text: Any, image: Any, processor: Any, *, verb: str = "capture") -> VlmInputs:
    """Texts (one ``<image>`` each) and as many pictures through a VLM's processor (given, else the one
    saved with the model's name or folder), checked: what :func:`capture_vlm` and
    :func:`attnviz.generate` run."""
    config: Any = resolved.model.config
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise ArgumentTypeError(
            "a vision-language capture takes a text (a str with an image token) and a picture, or a list of "
            f"texts and as many pictures, got {type(text).__name__}"
        )
    pictures = list(image) if isinstance(image, (list, tuple)) else [image]
    if image is None or len(pictures) != len(texts) or (isinstance(text, str) and isinstance(image, (list, tuple))):
        raise InputError(
            f"give one picture with each text: {verb}(model, text, image=…, processor=…)"
            + (", or a list of texts and a list of as many pictures" if verb == "capture" else "")
        )
    source = str(getattr(config, "_name_or_path", None) or "")
    if processor is None and source:
        processor = _own_processor(source)
    if processor is None or not callable(processor) or getattr(processor, "tokenizer", None) is None:
        raise InputError(
            f"{resolved.name} needs its processor (text and images together), e.g. "
            "AutoProcessor.from_pretrained(name); pass processor="
        )
    tokenizer = processor.tokenizer
    image_id = int(config.image_token_index)
    placeholder = getattr(processor, "image_token", None) or tokenizer.convert_ids_to_tokens(image_id)
    for t in texts:
        if t.count(placeholder) != 1:
            raise InputError(
                f"the text has {t.count(placeholder)} {placeholder!r} tokens; write exactly one where the picture "
                f"goes, e.g. {placeholder + ' ' + t.replace(placeholder, '')!r}"
            )
    read = [read_image(p, i if len(pictures) > 1 else None) for i, p in enumerate(pictures)]
    if getattr(tokenizer, "padding_side", "right") != "right":
        raise InputError("attnviz pads a batch on the right; set processor.tokenizer.padding_side = 'right'")
    encoded = processor(text=list(texts), images=read, return_tensors="pt", padding=True)
    pixel_values = encoded["pixel_values"]
    patch, grid = _grid(resolved, pixel_values.shape[-2], pixel_values.shape[-1])
    lengths = (
        encoded["attention_mask"].sum(-1).tolist() if "attention_mask" in encoded else [encoded["input_ids"].shape[1]]
    )
    made = [
        _sequence(t, encoded["input_ids"][b, : lengths[b]].tolist(), tokenizer, placeholder, image_id, grid)
        for b, t in enumerate(texts)
    ]
    prefix = _tower_prefix(resolved)
    return VlmInputs(list(texts), encoded, lengths, made, patch, grid, prefix, processor.image_processor, tokenizer)


def capture_vlm(
    resolved: Resolved,
    text: Any,
    image: Any,
    processor: Any,
    *,
    layers: set[int] | None = None,
    check: str = "sample",
    keep_on_device: bool = False,
    weight_mode: str | None = None,
) -> list[Capture]:
    """Texts with one picture each through a VLM's processor (``processor(text=…, images=…)``, e.g.
    ``LlavaProcessor``), one right-padded forward; per text the capture of its language model
    (``decoder``) and of its vision tower (``vision``), with ``cap.image`` and ``cap.vision``."""
    check_mode(check)
    model = resolved.model
    inputs = encode_vlm(resolved, text, image, processor)
    encoded, lengths, n_tower = inputs.encoded, inputs.lengths, inputs.n_tower
    rows, cols = inputs.grid

    dtype = next(model.parameters()).dtype
    kwargs = {k: v.to(resolved.device) for k, v in encoded.items()}
    kwargs["pixel_values"] = kwargs["pixel_values"].to(dtype)
    taps = tap(
        model,
        layers=layers,
        to_cpu=not keep_on_device,
        weight_mode=weight_mode or ("drop" if check == "off" else "compare"),
        lengths={"decoder": lengths, "vision": [n_tower] * len(inputs.texts)},
    )
    recorder, _ = tapped(resolved, taps, lambda _: model(**kwargs), layers)
    n = encoded["input_ids"].shape[1]
    seen = {(c.part, c.q.shape[-2]) for c in recorder.calls if c.q is not None}
    if {p for p, _ in seen} - {"decoder", "vision"} or seen - {("decoder", n), ("vision", n_tower)}:
        raise UnsupportedModelError(
            f"{resolved.name} attended over {sorted(seen)} (part, tokens); attnviz expects its language model "
            f"over the {n} merged tokens and its vision tower over {n_tower} (prefix {inputs.prefix}, "
            f"{rows}×{cols} patches), or it cannot say which position is which image token"
        )
    items = []
    for b, (sequence, _, _) in enumerate(inputs.made):
        grid, tower = inputs.pictures(b, sequence.tokens)
        cut = {"decoder": (lengths[b], lengths[b]), "vision": (n_tower, n_tower)}
        items.append(Item(sequence, None, cut, image=grid, vision=tower))
    return captures(resolved, recorder.calls, items, check, projections=recorder.projections)


def tiny_vlm(*, attn_implementation: str | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(a tiny random LLaVA, its ``LlavaProcessor``), for tests and examples: a 2-layer CLIP vision
    tower reading 32×32 pictures in 8×8 patches (16 image tokens, its ``[CLS]`` dropped), a 2-layer
    Llama over SmolLM2's real tokenizer with ``<image>`` added. Needs Pillow."""
    import torch
    import transformers as tf  # deferred: importing attnviz does not import transformers

    from .models import embedded_source

    folder, kwargs = embedded_source("smollm2")
    tokenizer = tf.AutoTokenizer.from_pretrained(folder, **kwargs)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = tf.CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    text = tf.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
    )
    image_id: Any = tokenizer.convert_tokens_to_ids("<image>")
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_index=int(image_id))
    torch.manual_seed(seed)
    model = tf.AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation or "sdpa")
    images = tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = tf.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return model.eval(), processor
