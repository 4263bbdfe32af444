"""Qwen2-VL and Qwen2.5-VL: refused with a picture (their text alone is captured as any decoder's)."""

from __future__ import annotations

from .facts import Facts

_MERGED = (
    "its vision tower reads the patches in spatial_merge_size × spatial_merge_size blocks (not row by row) "
    "and, on eager and sdpa, runs its attention once per picture in a forward; each image token of its "
    "language model stands for one such block, at 3-D (M-RoPE) positions"
)

FACTS = Facts(
    rank=340,
    refused_vlms={
        "qwen2_vl": f"Qwen2-VL: {_MERGED}",
        "qwen2_5_vl": f"Qwen2.5-VL: {_MERGED} (and windowed attention in most layers)",
    },
)
