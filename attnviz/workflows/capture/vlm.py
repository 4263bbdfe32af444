"""A vision-language model's capture: its language model over the text and the picture's tokens, and
its vision tower over the picture.

A vision-language model (:data:`attnviz.families.VLMS`) reads a prompt whose ``<image>`` placeholder the processor
expands to the picture's tokens; the vision tower's patches, through the projector, fill those
positions, and the language model attends over the merged sequence. Where each image token comes from:

- **LLaVA**: one image token per patch of the vision tower (its ``[CLS]`` dropped by
  ``vision_feature_select_strategy="default"``);
- **Idefics3** (the architecture of SmolVLM): one image token per ``scale_factor × scale_factor`` block
  of the tower's patches (the connector's pixel shuffle), the picture as one tile — its processor with
  ``do_image_splitting=False``; a picture split into tiles is refused, saying so. The processor's
  ``<fake_token_around_image>`` and ``<global-img>`` around the image tokens are text tokens.

A capture has two parts:

- ``decoder``, the language model's attention (through the AttentionInterface like any decoder): the
  text tokens as the tokenizer wrote them, each image position labelled by the cell of the picture it
  stands for (``(row,col)``: LLaVA's patch, Idefics3's block of patches), and ``cap.image`` the picture
  in those cells with the text before the image as its ``prefix`` and after it as its ``suffix`` — so a
  text token's row is drawn over the image (:func:`attnviz.figures.image_attention` with
  ``part="decoder"`` and ``query=`` that token) beside its row over the text;
- ``vision``, the vision tower's own attention over its ``[CLS]`` (LLaVA's CLIP; Idefics3's tower has
  none) and the patches (``cap.vision``: the same picture, the tower's patches; every layer of the tower
  runs and is recorded, also those after ``vision_feature_layer``, whose output the projector does not read).

A list of texts with as many pictures is one right-padded forward, a capture per text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...data.capture import Capture
from ...data.images import ImageGrid, patch_label, to_uint8
from ...data.words import TokenSequence, Word, words_from_offsets
from ...engine.taps import AttentionCall
from ...errors import ArgumentTypeError, AttnvizError, InputError, UnsupportedModelError
from ...families import REFUSED_VLMS, VISION_SPECS, VLMS, vision_spec, vlm_spec
from ...families.facts import ImageLayout, split_refusal
from .build import Item, run_captures
from .images import read_image
from .models import load_processor
from .pipeline import Resolved, check_mode

__all__ = [
    "VlmInputs",
    "capture_vlm",
    "encode_vlm",
    "image_token_id",
    "is_vlm",
    "vlm_refusal",
]


def vlm_refusal(config: Any) -> str | None:
    """Why attnviz does not capture this vision-language model with a picture
    (:data:`attnviz.families.REFUSED_VLMS`), or None."""
    reason = REFUSED_VLMS.get(getattr(config, "model_type", "") or "")
    if reason is None:
        return None
    names = " and ".join(spec.name for spec in VLMS.values())
    return (
        f"{reason}; attnviz does not map those image tokens to the picture yet, so it refuses the picture "
        f"rather than draw it wrong. It captures {names} (model_type {', '.join(map(repr, VLMS))})"
    )


def is_vlm(config: Any) -> bool:
    """Whether ``config`` is a vision-language model attnviz captures (:data:`attnviz.families.VLMS`)."""
    return vlm_spec(config) is not None


def image_token_id(config: Any) -> int:
    """The id of a vision-language model's image token (LLaVA's ``image_token_index``, Idefics3's ``image_token_id``)."""
    value = getattr(config, "image_token_index", None)
    return int(value if value is not None else config.image_token_id)


def _layout(resolved: Resolved, pixel_values: Any) -> ImageLayout:
    """The :class:`~attnviz.families.facts.ImageLayout` of a processed batch of pictures (one per text),
    as the model's family lays it out (:attr:`attnviz.families.facts.VlmSpec.layout`)."""
    config: Any = resolved.model.config
    spec = vlm_spec(config)
    if spec is None:
        raise UnsupportedModelError(f"{resolved.name} is not a vision-language model attnviz captures")
    return spec.layout(config, pixel_values, resolved.name, lambda: _tower_prefix(resolved))


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
    expanded: str, ids: list[int], tokenizer: Any, image_id: int, grid: tuple[int, int]
) -> tuple[TokenSequence, int, int]:
    """(the merged sequence of one text, where its image tokens start and stop): each image position
    labelled by its cell of the picture, the text's tokens and words as the tokenizer wrote them
    (``expanded``: the text with its placeholder expanded as the processor did)."""
    at = [i for i, t in enumerate(ids) if t == image_id]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise InputError(f"the processor put the image tokens at {at[:4]}…; attnviz expects one run of them")
    rows, cols = grid
    if len(at) != rows * cols:
        raise InputError(
            f"the processor wrote {len(at)} image tokens for a picture of {rows}×{cols} cells; use the "
            "processor of this model"
        )
    start, stop = at[0], at[-1] + 1
    # the expanded text the processor tokenized, for the text tokens' offsets and words
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
    """The processor saved with the model's name or folder (:func:`attnviz.workflows.capture.models.load_processor`),
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
    layout: ImageLayout
    image_processor: Any
    tokenizer: Any  # the processor's

    @property
    def n_tower(self) -> int:
        """The tokens the vision tower reads: its prefix ([CLS]), then its patches."""
        rows, cols = self.layout.tower_grid
        return len(self.layout.prefix) + rows * cols

    def forward_kwargs(self, device: Any, dtype: Any) -> dict[str, Any]:
        """The model's inputs: the processor's tensors on ``device``, the pixels in the model's ``dtype``."""
        kwargs = {k: v.to(device) for k, v in self.encoded.items()}
        kwargs["pixel_values"] = kwargs["pixel_values"].to(dtype)
        return kwargs

    def pictures(self, b: int, tokens: list[str]) -> tuple[ImageGrid, ImageGrid]:
        """(the language model's picture: text ``tokens`` before and after the image tokens of text ``b``,
        the vision tower's picture) of item ``b``."""
        _, start, stop = self.made[b]
        ip, layout = self.image_processor, self.layout
        mean, std = getattr(ip, "image_mean", None), getattr(ip, "image_std", None)
        values = self.encoded["pixel_values"][b]
        values = values[0] if values.dim() == 4 else values  # Idefics3: [pictures, 3, h, w], one picture
        pixels = to_uint8(values, mean, std, getattr(ip, "rescale_factor", None))
        grid = ImageGrid(pixels, layout.patch, layout.grid, tokens[:start], tokens[stop:])
        return grid, ImageGrid(pixels, layout.tower_patch, layout.tower_grid, layout.prefix)


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
    image_id = image_token_id(config)
    if getattr(getattr(processor, "image_processor", None), "do_image_splitting", False):
        raise UnsupportedModelError(split_refusal(resolved.name, "tiles"))
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
    encoded = processor(
        text=list(texts), images=read, return_tensors="pt", padding=True, return_text_replacement_offsets=True
    )
    replaced = encoded.pop("text_replacement_offsets")  # each text's placeholder and what it became
    layout = _layout(resolved, encoded["pixel_values"])
    lengths = (
        encoded["attention_mask"].sum(-1).tolist() if "attention_mask" in encoded else [encoded["input_ids"].shape[1]]
    )
    made = [
        _sequence(_expanded(t, r), encoded["input_ids"][b, : lengths[b]].tolist(), tokenizer, image_id, layout.grid)
        for b, (t, r) in enumerate(zip(texts, replaced, strict=True))
    ]
    return VlmInputs(list(texts), encoded, lengths, made, layout, processor.image_processor, tokenizer)


def _expanded(text: str, replacements: list[dict]) -> str:
    """``text`` with each placeholder replaced as the processor did (its ``text_replacement_offsets``)."""
    for r in sorted(replacements, key=lambda r: r["span"][0], reverse=True):
        start, stop = r["span"]
        text = text[:start] + r["replacement"] + text[stop:]
    return text


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
    rows, cols = inputs.layout.tower_grid

    kwargs = inputs.forward_kwargs(resolved.device, next(model.parameters()).dtype)
    n = encoded["input_ids"].shape[1]

    def ran(calls: list[AttentionCall]) -> None:
        seen = {(c.part, c.q.shape[-2]) for c in calls if c.q is not None}
        if {p for p, _ in seen} - {"decoder", "vision"} or seen - {("decoder", n), ("vision", n_tower)}:
            raise UnsupportedModelError(
                f"{resolved.name} attended over {sorted(seen)} (part, tokens); attnviz expects its language model "
                f"over the {n} merged tokens and its vision tower over {n_tower} (prefix {inputs.layout.prefix}, "
                f"{rows}×{cols} patches), or it cannot say which position is which image token"
            )

    items = []
    for b, (sequence, _, _) in enumerate(inputs.made):
        grid, tower = inputs.pictures(b, sequence.tokens)
        cut = {"decoder": (lengths[b], lengths[b]), "vision": (n_tower, n_tower)}
        items.append(Item(sequence, None, cut, image=grid, vision=tower))
    made, _ = run_captures(
        resolved,
        lambda: model(**kwargs),
        items,
        layers=layers,
        check=check,
        keep_on_device=keep_on_device,
        weight_mode=weight_mode,
        lengths={"decoder": lengths, "vision": [n_tower] * len(inputs.texts)},
        ran=ran,
    )
    return made
