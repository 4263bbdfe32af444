"""The picture a vision encoder read, and where each of its tokens sits on it.

A vision encoder's sequence is a few tokens before the patches (``[CLS]``, DeiT's ``[DIST]``,
DINOv2's registers ``[REG0]`` …; SigLIP has none), then one token per patch, row by row. An
:class:`ImageGrid` keeps the processed image (uint8 RGB, the model's input size: what the model
read, after resizing and cropping) and that layout, so a view can draw a token's attention over the
pixels it came from. Each token is a word of its own (:func:`image_sequence`): the word-level rules of
the analyses become patch-level ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import InputError, OutOfRangeError
from .words import TokenSequence, Word

__all__ = ["ImageGrid", "image_sequence", "patch_label", "to_uint8"]


def patch_label(row: int, col: int) -> str:
    """The label of the patch at ``(row, col)``: ``"(row,col)"``."""
    return f"({row},{col})"


@dataclass
class ImageGrid:
    """The processed image and its patch grid: ``prefix`` tokens, then ``rows × cols`` patches of
    ``patch = (height, width)`` pixels, row by row, then ``suffix`` tokens (a vision-language model's
    text after the image; its text before the image is the prefix)."""

    pixels: Tensor  # [height, width, 3] uint8: the image as the model read it (un-normalised)
    patch: tuple[int, int]  # (height, width) of a patch in pixels
    grid: tuple[int, int]  # (rows, cols) of patches
    prefix: list[str]  # labels of the tokens before the patches, e.g. ["[CLS]", "[REG0]"]
    suffix: list[str] = field(default_factory=list)  # labels of the tokens after them (a VLM's text after the image)

    @property
    def n_prefix(self) -> int:
        return len(self.prefix)

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def n_tokens(self) -> int:
        return self.n_prefix + self.n_patches + len(self.suffix)

    @property
    def labels(self) -> list[str]:
        """Every token's label: the prefix's, then ``(row,col)`` per patch."""
        rows, cols = self.grid
        return list(self.prefix) + [patch_label(r, c) for r in range(rows) for c in range(cols)] + list(self.suffix)

    def token(self, query: int | str | tuple[int, int]) -> int:
        """The token index of ``query``: an index, a label (``"[CLS]"``, ``"(2,3)"``) or a ``(row, col)``."""
        if isinstance(query, tuple):
            row, col = query
            rows, cols = self.grid
            if not (0 <= row < rows and 0 <= col < cols):
                raise OutOfRangeError(
                    f"patch {query} is out of range: the grid has rows 0..{rows - 1}, cols 0..{cols - 1}"
                )
            return self.n_prefix + row * cols + col
        if isinstance(query, str):
            labels = self.labels
            if query not in labels:
                shown = ", ".join(self.prefix + [labels[-1]]) if self.prefix else labels[-1]
                raise InputError(f"no token {query!r} in this image; its tokens are {shown} and the patches (row,col)")
            return labels.index(query)
        if isinstance(query, int) and not isinstance(query, bool):
            if not 0 <= query < self.n_tokens:
                raise OutOfRangeError(f"token {query} is out of range: this image has tokens 0..{self.n_tokens - 1}")
            return query
        raise InputError(f"a query is a token index, a label or a (row, col), got {query!r}")

    def position(self, token: int) -> tuple[int, int] | None:
        """``(row, col)`` of a patch token; None for a token before the patches."""
        index = self.token(token) - self.n_prefix
        return None if not 0 <= index < self.n_patches else divmod(index, self.grid[1])

    def box(self, token: int) -> tuple[int, int, int, int] | None:
        """The pixels of a patch token in the processed image, ``(x0, y0, x1, y1)`` (x1, y1 exclusive);
        None for a token before the patches."""
        where = self.position(token)
        if where is None:
            return None
        (row, col), (ph, pw) = where, self.patch
        return col * pw, row * ph, (col + 1) * pw, (row + 1) * ph

    def patch_values(self, values: Tensor) -> Tensor:  # [..., rows, cols]
        """``values`` over the tokens (``[..., n_tokens]``) as the patch grid, the prefix dropped."""
        if values.shape[-1] != self.n_tokens:
            raise InputError(f"{values.shape[-1]} values for an image of {self.n_tokens} tokens")
        return values[..., self.n_prefix : self.n_prefix + self.n_patches].reshape(*values.shape[:-1], *self.grid)

    def meta(self) -> dict:
        """What a capture file keeps besides the pixels."""
        return {
            "patch": list(self.patch),
            "grid": list(self.grid),
            "prefix": list(self.prefix),
            "suffix": list(self.suffix),
        }

    @classmethod
    def from_meta(cls, meta: dict, pixels: Tensor) -> ImageGrid:
        (ph, pw), (rows, cols) = meta["patch"], meta["grid"]
        return cls(
            pixels, (int(ph), int(pw)), (int(rows), int(cols)), list(meta["prefix"]), list(meta.get("suffix", []))
        )


def image_sequence(grid: ImageGrid) -> TokenSequence:
    """The tokens of an image as a :class:`TokenSequence`: each token its label, its own word (a
    patch is a word), and no vocabulary id (``-1``)."""
    labels = grid.labels
    text = " ".join(labels)
    offsets, words, start = [], [], 0
    for i, label in enumerate(labels):
        offsets.append((start, start + len(label)))
        words.append(Word(label, start, start + len(label), i, i + 1))
        start += len(label) + 1
    return TokenSequence(text, labels, [-1] * len(labels), offsets, words)


def to_uint8(pixel_values: Tensor, mean, std, rescale: float | None) -> Tensor:  # [height, width, 3] uint8
    """One processed image ``[3, height, width]`` back to uint8 RGB: the processor's normalisation
    undone (``x·std + mean``, then ÷ its rescale factor); without a processor's numbers (``mean`` None)
    each channel is stretched from its minimum to its maximum."""
    x = pixel_values.detach().to("cpu", torch.float32)
    if x.dim() != 3 or x.shape[0] not in (1, 3):
        raise InputError(f"an image's pixel values must be [channels, height, width], got {tuple(x.shape)}")
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    if mean is None or std is None:
        lo = x.amin(dim=(1, 2), keepdim=True)
        hi = x.amax(dim=(1, 2), keepdim=True)
        x = (x - lo) / (hi - lo).clamp_min(1e-12) * 255
    else:
        x = (
            x * torch.tensor(std, dtype=torch.float32)[:, None, None]
            + torch.tensor(mean, dtype=torch.float32)[:, None, None]
        )
        x = x / (rescale or 1 / 255)
    return x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).contiguous()
