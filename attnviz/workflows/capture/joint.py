"""A joint text–image model's capture: its text tower and its vision tower, two parts of one capture.

CLIP and SigLIP (``CLIPModel``, ``SiglipModel``: the joint checkpoints, :func:`is_joint`) read a
text with a text tower and a picture with a vision tower, apart, and compare the two embeddings. One
forward of ``attnviz.capture(model, text, image, processor=…)`` records both: the ``text`` part, the
text tower's attention over the text's tokens (CLIP's is causal, SigLIP's bidirectional), and the
``vision`` part, the vision tower's over the picture's tokens (CLIP's ``[CLS]``, then the patches row
by row; SigLIP has no ``[CLS]``). ``cap.image`` is the picture as the vision tower read it and where
each of its tokens sits (:meth:`attnviz.Capture.image_of` ``("vision")``), so the image figures draw the
vision part (``part="vision"``). A list of texts and a list of as many pictures is one padded batch:
capture ``b`` holds text ``b`` and picture ``b``. The forward and its checks are the pipeline's.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...data.capture import Capture, TokenSequence
from ...data.images import ImageGrid, to_uint8
from ...data.words import words_from_offsets
from ...engine.taps import AttentionCall
from ...errors import AttnvizError, InputError, UnsupportedModelError
from ...families import TOWERS, vision_spec
from .build import Item, run_captures
from .images import read_image
from .inputs import check_texts, padded, tokenize
from .models import load_processor
from .pipeline import Resolved, check_mode

__all__ = ["capture_joint", "is_joint"]


def is_joint(config: Any) -> bool:
    """Whether ``config`` is a joint text–image model attnviz captures: a family of
    :data:`attnviz.families.TOWERS` whose towers are the parts ``text`` and ``vision``."""
    towers = TOWERS.get(getattr(config, "model_type", "") or "")
    return towers is not None and set(towers.values()) == {"text", "vision"}


def _processors(resolved: Resolved, processor: Any, tokenizer: Any) -> tuple[Any, Any]:
    """(tokenizer, image processor): a joint processor's two (``CLIPProcessor``, ``SiglipProcessor``),
    or ``tokenizer=`` and an image processor given apart; neither given: the one saved with the model's
    name or folder (:func:`attnviz.workflows.capture.models.load_processor`)."""
    source = getattr(resolved.model.config, "_name_or_path", "")
    if processor is None and tokenizer is None and source:
        with contextlib.suppress(AttnvizError):
            processor = load_processor(source)
    text_side = getattr(processor, "tokenizer", None) if processor is not None else None
    image_side = getattr(processor, "image_processor", None) if processor is not None else None
    if text_side is None and image_side is None and processor is not None and tokenizer is not None:
        text_side, image_side = tokenizer, processor
    if not callable(text_side) or not callable(image_side):
        raise InputError(
            f"{resolved.name} reads a text and a picture: pass its processor (processor=, e.g. "
            "AutoProcessor.from_pretrained(name), holding its tokenizer and its image processor), or "
            "tokenizer= and an image processor as processor="
        )
    return text_side, image_side


def capture_joint(
    resolved: Resolved,
    text: Any,
    image: Any,
    processor: Any,
    tokenizer: Any = None,
    *,
    layers: set[int] | None = None,
    check: str = "sample",
    keep_on_device: bool = False,
    weight_mode: str | None = None,
    max_length: int | None = None,
) -> list[Capture]:
    """One Capture per (text, picture) pair: one forward of the padded texts and the pictures through
    the joint model, each capture with its ``text`` and ``vision`` parts and its picture."""
    check_mode(check)
    model = resolved.model
    config: Any = model.config
    if text is None or image is None:
        raise InputError(
            f"{resolved.name} is a joint text–image model: give a text and a picture, "
            "capture(model, text, image, processor=…), or capture one tower (model.vision_model with a picture)"
        )
    texts = check_texts(text)
    pictures = list(image) if isinstance(image, (list, tuple)) else [image]
    if len(pictures) != len(texts):
        raise InputError(
            f"{len(texts)} text(s) and {len(pictures)} picture(s): give as many texts as pictures — capture b "
            "holds text b and picture b (the towers read them apart)"
        )
    words, images = _processors(resolved, processor, tokenizer)
    vision_config = config.vision_config
    spec = vision_spec(vision_config)
    if spec is None:  # a joint model whose vision tower attnviz has no layout for
        raise UnsupportedModelError(
            f"{resolved.name}'s vision tower ({vision_config.model_type}) is not one attnviz maps"
        )
    limit = getattr(config.text_config, "max_position_embeddings", None)
    encoded = tokenize(words, texts, max_length, limit, resolved.name, False)
    read = [read_image(p, i if len(pictures) > 1 else None) for i, p in enumerate(pictures)]
    try:
        pixel_values = images(images=read, return_tensors="pt")["pixel_values"]
    except (TypeError, ValueError, KeyError) as err:
        raise InputError(f"the image processor {type(images).__name__} failed on these images: {err}") from err
    height, width = pixel_values.shape[-2:]
    patch: Any = vision_config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    if height % ph or width % pw:
        raise InputError(
            f"the processed image is {height}×{width} pixels, not a whole number of {ph}×{pw} patches; "
            "use the model's own image processor"
        )
    prefix = list(spec.prefix(vision_config))
    layout = ImageGrid(pixel_values.new_zeros(0), (ph, pw), (height // ph, width // pw), prefix)
    n_vision = layout.n_tokens

    ids, mask = padded(encoded, resolved.device)
    dtype = next(model.parameters()).dtype
    lengths = {"text": [len(e[0]) for e in encoded], "vision": [n_vision] * len(texts)}
    forward = dict(input_ids=ids, attention_mask=mask, pixel_values=pixel_values.to(resolved.device, dtype))

    def ran(calls: list[AttentionCall]) -> None:
        parts = {c.part for c in calls}
        seen = {c.q.shape[-2] for c in calls if c.part == "vision" and c.q is not None}
        if parts != {"text", "vision"} or seen - {n_vision}:
            raise UnsupportedModelError(
                f"{resolved.name} ran the attention of {sorted(parts)} (vision over {sorted(seen)} tokens); attnviz "
                f"expects its text tower over the text and its vision tower over {n_vision} tokens (prefix "
                f"{prefix}, {layout.grid[0]}×{layout.grid[1]} patches)"
            )

    mean, std = getattr(images, "image_mean", None), getattr(images, "image_std", None)
    rescale = getattr(images, "rescale_factor", None) if getattr(images, "do_rescale", True) else 1.0
    items = []
    for b, (row, offsets, tokens) in enumerate(encoded):
        grid = ImageGrid(to_uint8(pixel_values[b], mean, std, rescale), layout.patch, layout.grid, prefix)
        cut = {"text": (len(row), len(row)), "vision": (n_vision, n_vision)}
        sequence = TokenSequence(
            texts[b], list(tokens), list(row), list(offsets), words_from_offsets(texts[b], offsets, tokens)
        )
        items.append(Item(sequence, None, cut, image=grid))
    made, _ = run_captures(
        resolved,
        lambda: model(**forward),
        items,
        layers=layers,
        check=check,
        keep_on_device=keep_on_device,
        weight_mode=weight_mode,
        lengths=lengths,
        ran=ran,
    )
    return made
