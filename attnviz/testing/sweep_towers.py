"""The support sweep's models of two towers: each part of each capture against the model's own eager attention.

- the joint text–image models (``CLIPModel``, ``SiglipModel``, built by
  :func:`attnviz.testing.tiny_joint`): two padded texts with two pictures, the ``text`` part
  against the text tower's ``output_attentions`` and the ``vision`` part against the vision tower's;
- the vision-language models (LLaVA and Idefics3, :func:`attnviz.testing.tiny_vlm`): two padded texts with
  two pictures, the ``decoder`` part against the model's ``output_attentions`` and the ``vision`` part
  against its vision tower's own, run alone on the same pixels.

Each on eager and sdpa, an :class:`~attnviz.testing.sweep.Outcome` per family and backend, held to
:data:`~attnviz.testing.sweep.EXACT` by ``tests/test_sweep.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import UnsupportedModelError
from ..workflows.capture.runner import capture
from .sweep import EXACT, Outcome
from .tiny import tiny_joint, tiny_vlm

__all__ = ["TOWER_FAMILIES", "towers", "worst_error"]

#: the families of two towers the sweep builds, and their texts (a VLM's with its image token)
TOWER_FAMILIES: dict[str, tuple[Callable[[], tuple[Any, Any]], tuple[str, str]]] = {
    "clip (joint)": (lambda: tiny_joint("clip"), ("a cat sleeping on a mat", "a cup")),
    "siglip (joint)": (lambda: tiny_joint("siglip"), ("a cat sleeping on a mat", "a cup")),
    "llava": (tiny_vlm, ("A photo: <image> the cat sleeps on a mat", "<image> a cup")),
    "idefics3": (lambda: tiny_vlm("idefics3"), ("A photo: <image> the cat sleeps on a mat", "<image> a cup")),
}


def _pictures() -> list[np.ndarray]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy() for h, w in ((40, 48), (32, 36))]


def _own(model: Any, encoded: Any) -> dict[str, Sequence[torch.Tensor]]:
    """The model's own eager attentions per part, each layer ``[batch, head, q, k]``."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(**encoded, output_attentions=True)
            if getattr(out, "vision_model_output", None) is not None:  # a joint model: both towers
                return {"text": out.text_model_output.attentions, "vision": out.vision_model_output.attentions}
            pixels = encoded["pixel_values"]
            if hasattr(model.model, "vision_tower"):  # LLaVA
                tower = model.model.vision_tower(pixels, output_attentions=True)
            else:  # Idefics3: [texts, pictures = 1, 3, h, w], its tower model.vision_model
                tower = model.model.vision_model(pixels.flatten(0, 1), output_attentions=True)
            return {"decoder": out.attentions, "vision": tower.attentions}
    finally:
        model.set_attn_implementation(before)


def worst_error(caps: Sequence[Any], own: dict[str, Sequence[torch.Tensor]]) -> float:
    """The largest absolute difference between the captures' parts and the model's own attentions (each
    capture's own rows of the padded batch); an :class:`AssertionError` when the parts, the layers or
    a self-check are not the model's."""
    worst = 0.0
    for b, cap in enumerate(caps):
        assert set(cap.parts) == set(own), f"capture's parts {cap.parts}, the model's {sorted(own)}"
        for part, refs in own.items():
            assert cap.layer_indices(part) == list(range(len(refs))), f"{part}: layers {cap.layer_indices(part)}"
            for layer, ref in enumerate(refs):
                ours = cap.attention(layer, part=part)
                n_q, n_k = ours.shape[-2:]
                assert ref.shape[-2] >= n_q and ref.shape[-1] >= n_k, f"{part} layer {layer}: {tuple(ours.shape)}"
                worst = max(worst, float((ours - ref[b, :, :n_q, :n_k].float()).abs().max()))
        report = cap.validate()
        assert report.passed, str(report)
    return worst


def towers(
    families: Iterable[str] | None = None, compare: Callable[[Sequence[Any], dict], float] = worst_error
) -> list[Outcome]:
    """Every family of :data:`TOWER_FAMILIES` (or only ``families``) on eager and sdpa: two (text,
    picture) pairs in one capture, every part against the model's own eager attention (``compare``:
    :func:`worst_error`)."""
    out = []
    pictures = _pictures()
    for family, (build, texts) in TOWER_FAMILIES.items():
        if families is not None and family not in families:
            continue
        model, processor = build()
        encoded = processor(text=list(texts), images=pictures, return_tensors="pt", padding=True)
        own = _own(model, encoded)
        for backend in ("eager", "sdpa"):
            model.set_attn_implementation(backend)
            try:
                caps = capture(model, list(texts), pictures, processor=processor)
                assert isinstance(caps, list) and len(caps) == 2 and caps[0].model["backend"] == backend
                worst = compare(caps, own)
            except UnsupportedModelError as exc:
                out.append(Outcome(family, backend, "refused", reason=str(exc).splitlines()[0][:200]))
                continue
            except Exception as exc:  # noqa: BLE001 - as the sweep's: a failed self-check or a bug
                line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                out.append(Outcome(family, backend, "mismatch", reason=f"{type(exc).__name__}: {line}"))
                continue
            kind = "exact" if worst <= EXACT else "mismatch"
            out.append(Outcome(family, backend, kind, worst, "" if kind == "exact" else f"max error {worst:.1e}"))
    return out
