"""What a report stores of a capture (:mod:`attnviz.views.report_page` writes the page around it): every
part, layer and head's map as 8-bit levels of its own largest value, deflated and base64-encoded
(:func:`encode_map`, :func:`quantise`), each layer's mask once and its value norms (16-bit), what moves
between words, and the model view's thumbnails — within a size budget (:func:`report_data`), past which it
keeps the chosen heads only and says so."""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.capture import Capture
from ..errors import OutOfRangeError
from .common import allowed_cells, labels, measure_map
from .model_view import MODEL_VIEW_CELLS, model_view, thumb_size

__all__ = [
    "LEVELS",
    "MEASURES",
    "QUANTISATION",
    "REPORT_BUDGET_MB",
    "UNITS",
    "ReportData",
    "encode_map",
    "map_key",
    "pack",
    "quantise",
    "report_data",
    "thumbnail_data",
]

#: the levels a stored value takes: a map is kept as round(LEVELS·x/s), s its largest value
LEVELS = 255
#: the size a report aims at, in MB (10⁶ bytes): past it, the maps of the chosen heads only
REPORT_BUDGET_MB = 15.0
UNITS = ("tokens", "words")
MEASURES = ("weights", "moved")
QUANTISATION = (
    "Each head's token map is stored as 8-bit levels of its own largest value s (round(255·x/s)), deflated: "
    "a weight shown is within s/510 of the one attnviz computed (at most 0.002). Words are merged in the page "
    "as cap.attention(words=True) merges them (a key word sums its tokens, a query word averages its rows): "
    "within m·s/510 for a key word of m tokens. What moves between tokens, α·‖f(x)‖, is the stored weight "
    "times the key's ‖f(x)‖ (16-bit levels of the layer's largest): within ‖f(x)‖·s/510; between words it is "
    "the norm of a summed vector, stored as its own 8-bit map: within s/510 of its largest value s."
)


def map_key(part: str, units: str, measure: str, layer: int, head: int) -> str:
    """The name of one head's map in the page's data: ``part/units/measure/layer/head``."""
    return f"{part}/{units}/{measure}/{layer}/{head}"


def pack(raw: bytes) -> str:
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def quantise(maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # maps [..., q, k] ≥ 0
    """Each map (the last two dimensions) as 8-bit levels of its own largest value: (levels uint8 [..., q, k],
    scales [...]); an all-zero map has scale 1."""
    top = maps.float().amax(dim=(-2, -1))
    scales = torch.where(top > 0, top, torch.ones_like(top))
    levels = (maps.float() * (LEVELS / scales)[..., None, None]).round_().clamp_(0, LEVELS).to(torch.uint8)
    return levels, scales


def encode_map(z: torch.Tensor) -> tuple[float, str]:  # z [query, key], float, ≥ 0; masked cells any value
    """One map as the page stores it: (s, base64 of the deflated bytes round(255·z/s)), s its largest
    value (1 for an all-zero map); the page reads back s·level/255."""
    levels, scale = quantise(z)
    return float(scale), pack(levels.contiguous().numpy().tobytes())


@dataclass
class ReportData:
    """What the page's script reads: the parts' layers, heads and labels, each head's map
    (:func:`map_key` → (s, base64)) and each layer's mask, and what was left out."""

    parts: list[dict[str, Any]]
    maps: dict[str, tuple[float, str]] = field(default_factory=dict)
    masks: dict[str, int] = field(default_factory=dict)  # part/layer → its token mask's place in mask_data
    mask_data: list[str] = field(default_factory=list)  # each distinct mask: base64 of deflated 0/1 bytes
    # part/layer → (the layer's largest norm t, base64 of deflated uint16 levels round(65535·‖f_h(x_j)‖/t), [head, key])
    norms: dict[str, tuple[float, str]] = field(default_factory=dict)
    chosen: list[tuple[str, int, int]] | None = None  # past the budget: the heads kept (part, layer, head)
    left_out: list[str] = field(default_factory=list)  # what the page could not hold, said in it

    @property
    def nbytes(self) -> int:
        """The characters the maps and masks take in the page."""
        return (
            sum(len(b) for _, b in self.maps.values())
            + sum(map(len, self.mask_data))
            + sum(len(b) for _, b in self.norms.values())
        )


def _word_of(seq: Any) -> list[int]:
    """Each token's word (-1 for a token in none): what the page merges a token map into words with."""
    word_of = [-1] * seq.n_tokens
    for i, w in enumerate(seq.words):
        word_of[w.token_start : w.token_stop] = [i] * (w.token_stop - w.token_start)
    return word_of


def _has_norms(cap: Capture, part: str) -> bool:
    return all(cap.layer(layer, part).value_dots is not None for layer in cap.layer_indices(part))


def report_data(
    cap: Capture, *, budget_bytes: float | None = None, heads: list[tuple[int, int]] | None = None
) -> ReportData:
    """What the page stores of every part, layer and head: its token weights (8-bit, :func:`quantise`), the
    layer's mask (each distinct one once) and value norms (16-bit: what moves between tokens is the weight
    times the norm), and what moves between words (a map of its own: it is not linear in the weights);
    the page merges words itself. Past ``budget_bytes``, what moves between words is left out; if that is
    not enough, the maps of ``heads`` only ((layer, head) pairs; default: the first layer's head 0) — each
    said in :attr:`ReportData.left_out`."""
    parts: list[dict[str, Any]] = []
    data = ReportData(parts=parts)
    first = cap.parts[0]
    chosen = heads if heads is not None else [(cap.layer_indices(first)[0], cap.kept_heads(first)[0])]
    kept = [  # by the model's head numbers: a capture of some heads (capture(heads=)) holds those only
        (part, layer, head)
        for layer, head in chosen
        for part in cap.parts
        if layer in cap.layer_indices(part) and head in cap.layer(layer, part).head_numbers
    ]
    if not kept:
        raise OutOfRangeError(f"heads={heads!r}: none of these (layer, head) pairs is in the capture")
    n_layers = sum(len(cap.layer_indices(p)) for p in cap.parts)
    words_moved, only_chosen = True, False  # what the budget lets in: decided on the layers' sizes so far
    token_total = word_total = done = 0  # bytes of the token weights (and norms, masks), of words' moved; layers
    for part in cap.parts:
        layers = cap.layer_indices(part)
        measures = [m for m in MEASURES if m == "weights" or _has_norms(cap, part)]
        if "moved" not in measures:
            data.left_out.append(f"{part}: what moves (this capture kept no value norms)")
        entry: dict[str, Any] = {
            "name": part,
            "layers": layers,
            "heads": {str(layer): cap.layer(layer, part).head_numbers for layer in layers},  # the model's numbers
            "measures": measures,
            "units": {
                u: {"q": labels(cap, u == "words", part, "query"), "k": labels(cap, u == "words", part, "key")}
                for u in UNITS
            },
            "prompt_length": cap.model["generation"]["prompt_length"]
            if "generation" in cap.model and part == "decoder"
            else None,
        }
        queries, keys = cap.sequences(part)
        entry["word_of"] = {"q": _word_of(queries), "k": _word_of(keys)}
        parts.append(entry)
        for layer in layers:
            allowed = cap.allowed(layer, part=part).cpu()  # [query, key]: the word masks follow (any pair)
            mask = pack(allowed.to(torch.uint8).contiguous().numpy().tobytes())
            if mask not in data.mask_data:  # a causal mask is the same in every layer: stored once
                data.mask_data.append(mask)
                token_total += len(mask)
            done += 1
            data.masks[f"{part}/{layer}"] = data.mask_data.index(mask)
            stacked = cap.layer(layer, part).head_numbers  # the record's heads, in its stacks' order
            shown = [h for p, la, h in kept if (p, la) == (part, layer)] if only_chosen else stacked
            if not shown:
                continue
            weights = torch.stack([cap.attention(layer, h, part=part).float().cpu() for h in shown])
            levels, scales = quantise(weights.nan_to_num_(0).masked_fill_(~allowed, 0))
            token_bytes = 0
            for i, head in enumerate(shown):
                packed = pack(levels[i].contiguous().numpy().tobytes())
                token_bytes += len(packed)
                data.maps[map_key(part, "tokens", "weights", layer, head)] = (float(scales[i]), packed)
            if "moved" in measures:
                # α_ij·‖f_h(x_j)‖ between tokens: the page multiplies the weights by the norms, 16-bit levels
                norms = cap.value_norms(layer, part=part).float().cpu()  # [head, key]
                top = float(norms.max()) or 1.0
                norm_levels = (norms / top * 65535).round().clamp(0, 65535).to(torch.int32).numpy().astype("<u2")
                data.norms[f"{part}/{layer}"] = (top, pack(norm_levels.tobytes()))
                token_bytes += len(data.norms[f"{part}/{layer}"][1])
            token_total += token_bytes
            tokens_about = token_total / done * n_layers  # the first layers' maps deflate worst: an overestimate
            if budget_bytes is not None and not only_chosen and tokens_about > 3 * budget_bytes:
                only_chosen = True  # far past the budget (a long text): no more heads are computed than are kept
                _keep_chosen(data, kept, f"about {tokens_about / 1e6:.0f} MB", budget_bytes)
                shown = [h for p, la, h in kept if (p, la) == (part, layer)]
            if "moved" not in measures or not words_moved or not shown:
                continue
            # between words it is the norm of a summed vector, not linear in the weights: stored
            moved = measure_map(cap, layer, None, "moved", part=part, words=True)[[stacked.index(h) for h in shown]]
            word_allowed = allowed_cells(cap, layer, None, True, part)
            levels, scales = quantise(moved.nan_to_num_(0).masked_fill_(~word_allowed, 0))
            for i, head in enumerate(shown):
                packed = pack(levels[i].contiguous().numpy().tobytes())
                word_total += len(packed)
                data.maps[map_key(part, "words", "moved", layer, head)] = (float(scales[i]), packed)
            if budget_bytes is not None and not only_chosen and tokens_about + word_total > budget_bytes:
                words_moved = False  # with them the maps would pass the budget: what moves between words goes
                _drop_words_moved(data, f"about {word_total / done * n_layers / 1e6:.1f} MB", budget_bytes)
    if budget_bytes is not None and not only_chosen and data.nbytes > budget_bytes:  # the exact sizes, at the end
        if words_moved and any("/words/moved/" in k for k in data.maps):
            words_moved = False
            _drop_words_moved(data, f"{word_total / 1e6:.1f} MB", budget_bytes)
        if data.nbytes > budget_bytes:
            _keep_chosen(data, kept, f"{data.nbytes / 1e6:.1f} MB", budget_bytes)
    for entry in parts:
        entry["words_moved"] = words_moved and "moved" in entry["measures"]
    return data


def _keep_chosen(data: ReportData, kept: list[tuple[str, int, int]], size: str, budget_bytes: float) -> None:
    data.left_out.append(
        f"the maps of every head: they take {size}, over the budget of {budget_bytes / 1e6:.1f} MB for the maps; "
        "shown: the overview's thumbnails and the chosen heads " + ", ".join(f"{p} L{la}·H{h}" for p, la, h in kept)
    )
    data.maps = {k: v for k, v in data.maps.items() if (k.split("/")[0], *map(int, k.split("/")[3:])) in kept}
    data.chosen = kept


def _drop_words_moved(data: ReportData, size: str, budget_bytes: float) -> None:
    data.left_out.append(
        f"what moves between words ({size}: it would take the maps past their budget of "
        f"{budget_bytes / 1e6:.1f} MB); between tokens it is here"
    )
    data.maps = {k: v for k, v in data.maps.items() if "/words/moved/" not in k}


def thumbnail_data(cap: Capture, part: str, selected: tuple[int, int]) -> dict[str, Any]:
    """The model view (:func:`~attnviz.views.model_view.model_view`) as the page rebuilds it: its figure
    without the mosaic, the mosaic as 8-bit levels of 1 (255: a gap between thumbnails), deflated, and what
    names each cell's head (the thumbnails' size, the layers): a mosaic of 270 heads at 24² cells is
    ≈1.4 MB as the figure's JSON, ≈0.1 MB so."""
    import numpy as np  # deferred: numpy comes with torch; only the report's thumbnails need it here

    fig = model_view(cap, part=part, selected=selected)
    z = np.asarray(fig.data[0].z, dtype=np.float32)
    levels = np.where(np.isnan(z), 255, np.clip(np.round(np.nan_to_num(z) * 254), 0, 254)).astype(np.uint8)
    fig.data[0].z, fig.data[0].customdata = None, None
    return {
        "z": pack(levels.tobytes()),
        "shape": list(z.shape),
        "size": list(thumb_size(cap, False, MODEL_VIEW_CELLS, part)),
        "layers": cap.layer_indices(part),
        "heads": cap.kept_heads(part),  # the mosaic's columns, by the model's numbers
        "figure": json.loads(fig.to_json()),
    }
