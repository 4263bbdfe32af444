"""From pictures to a vision encoder's inputs, and its Captures.

Images (PIL images, numpy arrays, file paths; one or a list: a batch) go through the model's own
image processor (``AutoImageProcessor.from_pretrained`` for a name or folder, or the one passed);
``pixel_values`` gives the processed tensor directly. Each capture keeps its picture as the model read
it (uint8 RGB, the processed size) and its tokens' layout — the tokens before the patches
(:data:`attnviz.families.VISION_SPECS`), then the patches row by row
(:class:`attnviz.data.images.ImageGrid`). The forward and its checks are the pipeline's
(:mod:`attnviz.workflows.capture.pipeline`), as for text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...data.capture import Capture
from ...data.images import ImageGrid, image_sequence, to_uint8
from ...engine.taps import AttentionCall
from ...errors import ArgumentTypeError, ImageFileError, InputError, NotAVisionModelError, UnsupportedModelError
from ...families import VISION_SPECS, vision_spec
from .build import Item, run_captures
from .pipeline import Resolved, check_mode

__all__ = [
    "MAX_IMAGE_PIXELS",
    "ImageInputs",
    "capture_images",
    "encode_images",
    "image_processor",
    "is_image_input",
    "read_image",
    "require_vision",
]

#: the most pixels an image file may have (width × height); larger files are refused before decoding
MAX_IMAGE_PIXELS = 40_000_000


def is_image_input(value: Any) -> bool:
    """Whether ``value`` (or, for a list, its first element) is a picture rather than a text: a PIL
    image, a numpy array, a tensor or a :class:`~pathlib.Path`."""
    first = value[0] if isinstance(value, (list, tuple)) and value else value
    if isinstance(first, (Path, Tensor)):
        return True
    kind = type(first)
    return kind.__module__.startswith(("PIL.", "numpy")) or hasattr(first, "__array_interface__")


def require_vision(resolved: Resolved) -> None:
    """Refuse an image for a model that reads no images, saying which models do; and a joint text–image
    model (CLIPModel, SiglipModel), whose towers attnviz captures one at a time."""
    spec = vision_spec(resolved.model.config)
    if spec is not None and spec.tower is not None and isinstance(getattr(resolved.model, spec.tower, None), nn.Module):
        raise UnsupportedModelError(
            f"{resolved.name} is a joint text–image model ({type(resolved.model).__name__}): attnviz captures its "
            "two towers from a text and a picture together, capture(model, text, image, processor=…), or one "
            f"tower: attnviz.capture(model.{spec.tower}, image, processor) for the pictures alone"
        )
    if spec is None:
        kind = getattr(resolved.model.config, "model_type", "?")
        names = sorted({spec.name for spec in VISION_SPECS.values()})
        raise NotAVisionModelError(
            f"{resolved.name} ({kind}) is not a vision encoder, so it cannot read an image; give it text, or "
            f"capture the image with one of: {', '.join(names)} (e.g. attnviz.testing.tiny_model('vit'))"
        )


def read_image(image: Any, index: int | None = None) -> Any:
    """One picture as an RGB PIL image: a PIL image, a numpy array (``[h, w]``, ``[h, w, 3|4]``;
    uint8, or floats in 0..1), or the path of an image file (decoded by Pillow; larger than
    :data:`MAX_IMAGE_PIXELS` refused before it is decoded)."""
    from PIL import Image, UnidentifiedImageError  # deferred: Pillow is needed for images only

    where = "the image" if index is None else f"image {index}"
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.is_file():
            raise ImageFileError(
                f"{where}: no file at {str(path)[:80]!r}; a vision encoder reads pictures: give a PIL image, "
                "an array or the path of an image file"
            )
        try:
            with Image.open(path) as opened:
                if opened.width * opened.height > MAX_IMAGE_PIXELS:
                    raise ImageFileError(
                        f"{where} ({str(path)!r}) has {opened.width}×{opened.height} pixels, more than "
                        f"{MAX_IMAGE_PIXELS:,}; resize it first"
                    )
                opened.load()
                return opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as err:
            raise ImageFileError(
                f"{where} ({str(path)!r}) is not an image Pillow can read ({type(err).__name__}: {err}); give a "
                "PNG, JPEG or another format Pillow opens"
            ) from err
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if hasattr(image, "__array_interface__") or type(image).__module__.startswith("numpy"):
        import numpy as np  # deferred: with Pillow, for images only

        array = np.asarray(image)
        if array.ndim == 3 and array.shape[-1] == 1:
            array = array[..., 0]
        if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)) or 0 in array.shape:
            raise ImageFileError(
                f"{where} is an array of shape {array.shape}; give [height, width] (grey) or "
                "[height, width, 3] (RGB) — channels last"
            )
        if array.dtype != np.uint8:
            if not np.issubdtype(array.dtype, np.floating) or not np.isfinite(array).all():
                raise ImageFileError(f"{where} is an array of {array.dtype}; give uint8 (0..255) or floats in 0..1")
            if array.min() < 0 or array.max() > 1:
                raise ImageFileError(
                    f"{where} holds floats in {array.min():.3g}..{array.max():.3g}; give floats in 0..1 or uint8"
                )
            array = (array * 255).round().astype(np.uint8)
        return Image.fromarray(array).convert("RGB")
    raise ArgumentTypeError(
        f"{where} must be a PIL image, a numpy array or a file path, got {type(image).__name__} "
        "(a processed tensor goes in pixel_values=)"
    )


def image_processor(resolved: Resolved, processor: Any = None) -> Any:
    """The processor given, else the model's own (``AutoImageProcessor.from_pretrained`` of the name
    or folder it was loaded from), else an error that says what to pass."""
    if processor is not None:
        if not callable(processor):
            raise ArgumentTypeError(f"processor must be an image processor, got {type(processor).__name__}")
        return processor
    source = getattr(resolved.model.config, "_name_or_path", "") or ""
    if not source:
        raise InputError(
            f"{resolved.name} has no name or folder to load its image processor from; pass processor= "
            "(AutoImageProcessor.from_pretrained(name), or attnviz.testing.tiny_processor(family) for a tiny model)"
        )
    from transformers import AutoImageProcessor  # deferred: importing attnviz does not import transformers

    try:
        return AutoImageProcessor.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise InputError(
            f"could not load the image processor of {source!r} ({type(err).__name__}: {err}); pass processor="
        ) from err


@dataclass
class ImageInputs:
    """Pictures encoded for one forward: the pixel values and each picture as the model read it."""

    pixel_values: Tensor  # [batch, 3, height, width]
    pictures: list[Tensor]  # per image: [height, width, 3] uint8


def encode_images(
    resolved: Resolved,
    image: Any = None,
    *,
    processor: Any = None,
    pixel_values: Tensor | None = None,
) -> ImageInputs:
    """The inputs of :func:`attnviz.capture` for a vision encoder: ``image`` (one or a list) through
    the image processor, or ``pixel_values`` (``[batch, 3, h, w]``, already processed; its pictures are
    un-normalised with ``processor``'s mean and std when one is given, else stretched per channel)."""
    require_vision(resolved)
    if pixel_values is not None:
        if image is not None:
            raise InputError("pass either an image or pixel_values, not both")
        if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 4 or not pixel_values.is_floating_point():
            raise ArgumentTypeError("pixel_values must be a [batch, channels, height, width] float tensor")
        values = pixel_values
    else:
        if image is None:
            raise InputError("give an image to capture (a PIL image, an array or a path), or pixel_values=")
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not images:
            raise InputError("the list of images is empty; give at least one")
        pictures = [read_image(im, i if len(images) > 1 else None) for i, im in enumerate(images)]
        processor = image_processor(resolved, processor)
        try:
            values = processor(images=pictures, return_tensors="pt")["pixel_values"]
        except (TypeError, ValueError, KeyError) as err:
            raise InputError(f"the image processor {type(processor).__name__} failed on these images: {err}") from err
    mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
    rescale = getattr(processor, "rescale_factor", None) if getattr(processor, "do_rescale", True) else 1.0
    dtype = next(resolved.model.parameters()).dtype
    return ImageInputs(values.to(resolved.device, dtype), [to_uint8(v, mean, std, rescale) for v in values])


def grid_of(resolved: Resolved, height: int, width: int) -> ImageGrid:
    """The token layout of a ``height × width`` input (the pixels filled in per image)."""
    config = resolved.model.config
    spec = vision_spec(config)
    assert spec is not None
    patch: Any = getattr(config, "patch_size", None)
    ph, pw = (patch, patch) if isinstance(patch, int) else (int(patch[0]), int(patch[1]))
    if height % ph or width % pw:
        raise InputError(
            f"the processed image is {height}×{width} pixels, not a whole number of {ph}×{pw} patches; "
            "use the model's own image processor"
        )
    return ImageGrid(
        torch.zeros(0, dtype=torch.uint8), (ph, pw), (height // ph, width // pw), list(spec.prefix(config))
    )


def capture_images(
    resolved: Resolved,
    inputs: ImageInputs,
    *,
    layers: set[int] | None = None,
    check: str = "sample",
    keep_on_device: bool = False,
    weight_mode: str | None = None,
) -> list[Capture]:
    """One Capture per picture: one forward of the batch through the pipeline, each capture with its
    picture and patch grid."""
    check_mode(check)
    model = resolved.model
    batch, _, height, width = inputs.pixel_values.shape
    layout = grid_of(resolved, height, width)
    n = layout.n_tokens

    def ran(calls: list[AttentionCall]) -> None:
        seen = {c.q.shape[-2] for c in calls if c.q is not None}
        if seen != {n}:
            raise UnsupportedModelError(
                f"{resolved.name}'s attention read {sorted(seen)} tokens, but its layout (prefix "
                f"{layout.prefix}, {layout.grid[0]}×{layout.grid[1]} patches) has {n}; attnviz cannot say which "
                "token is which patch"
            )

    sequence = image_sequence(layout)
    items = [
        Item(
            sequence,
            None,
            {"encoder": (n, n)},
            image=ImageGrid(picture, layout.patch, layout.grid, list(layout.prefix)),
        )
        for picture in inputs.pictures
    ]
    made, _ = run_captures(
        resolved,
        lambda: model(pixel_values=inputs.pixel_values),
        items,
        layers=layers,
        check=check,
        keep_on_device=keep_on_device,
        weight_mode=weight_mode,
        lengths={"encoder": [n] * batch},
        ran=ran,
    )
    return made
