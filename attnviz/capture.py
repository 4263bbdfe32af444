"""The Capture data model: one text's recorded attention (``attnviz.capture()`` makes it).

A :class:`Capture` is one text: its tokens and words, and per captured layer the Q, K, V the
attention kernel received (O(n·d)), the kernel's own output and — when the backend produced
them — its own weights, with the scaling and mask it used. Attention maps (O(n²) per head) are
recomputed on demand by :func:`attnviz.attention.scaled_dot_product`. It holds no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .attention import build_mask, scaled_dot_product
from .errors import (
    ArgumentTypeError,
    InputError,
    OutOfRangeError,
)
from .words import Word, group_matrix

if TYPE_CHECKING:
    import pandas as pd

    from .validate import ValidationReport

__all__ = ["Capture", "LayerRecord"]


@dataclass
class LayerRecord:
    """What one attention layer's kernel saw and produced, for one text."""

    name: str  # the module's name in the model, e.g. "model.layers.3.self_attn"
    q: Tensor  # [head, pos, d_head], after RoPE
    k: Tensor  # [kv_head, pos, d_head], after RoPE, before GQA expansion
    v: Tensor  # [kv_head, pos, d_head_v]
    out: Tensor | None  # [head, pos, d_head_v], the model's own attention output (A·V)
    weights: Tensor | None  # [head, pos, pos], the model's own weights (eager backends)
    scaling: float  # the factor on Q·Kᵀ the model used
    causal: bool
    window: int | None = None  # sliding window, when the model used one
    softcap: float | None = None
    mask: Tensor | None = None  # [pos, pos] bool / additive, only when causal+window do not describe it


@dataclass
class Capture:
    """One text's attention, as recorded from one forward of one model."""

    text: str
    tokens: list[str]  # the tokenizer's pieces, e.g. ['The', 'Ġcat', ...]
    token_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``
    words: list[Word]
    layers: dict[int, LayerRecord]
    model: dict[str, Any] = field(default_factory=dict)  # name, model_type, backend, dtype, n_layers, …

    # ------------------------------------------------------------------ basic facts
    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])

    @property
    def n_heads(self) -> int:
        return int(self.model["n_heads"])

    @property
    def n_kv_heads(self) -> int:
        return int(self.model["n_kv_heads"])

    @property
    def d_head(self) -> int:
        return int(self.model["d_head"])

    @property
    def token_labels(self) -> list[str]:
        """Readable labels: the token's text (special tokens as themselves). Byte-level pieces of one
        character (2–3 tokens with the same span, as for 小 in byte-level BPE) get subscripts: 小₁ 小₂."""
        subscripts = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
        count: dict[tuple[int, int], int] = {}
        for span in self.offsets:
            count[span] = count.get(span, 0) + 1
        seen: dict[tuple[int, int], int] = {}
        labels = []
        for token, (start, end) in zip(self.tokens, self.offsets):
            piece = self.text[start:end].strip() if end > start else token
            label = piece or token
            if end > start and count[(start, end)] > 1:
                seen[(start, end)] = seen.get((start, end), 0) + 1
                label += str(seen[(start, end)]).translate(subscripts)
            labels.append(label)
        return labels

    @property
    def nbytes(self) -> int:
        """Bytes of tensor storage the capture holds (shared storages counted once)."""
        seen: set[int] = set()
        total = 0
        for rec in self.layers.values():
            for t in (rec.q, rec.k, rec.v, rec.out, rec.weights, rec.mask):
                if t is not None and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
        return total

    def __repr__(self) -> str:
        return (
            f"Capture({self.model.get('name', '?')!r}, {self.n_tokens} tokens, {len(self.words)} words, "
            f"layers {sorted(self.layers)[:3]}{'…' if len(self.layers) > 3 else ''} of {self.n_layers}, "
            f"{self.n_heads} heads ({self.n_kv_heads} kv), backend {self.model.get('backend')})"
        )

    # ------------------------------------------------------------------ access
    def layer(self, layer: int) -> LayerRecord:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ArgumentTypeError(f"layer must be an int, got {type(layer).__name__}")
        if layer not in self.layers:
            if 0 <= layer < self.n_layers:
                raise OutOfRangeError(
                    f"layer {layer} was not captured (captured: {sorted(self.layers)}); capture again with layers=None or including {layer}"
                )
            raise OutOfRangeError(f"layer {layer} is out of range: this model has layers 0..{self.n_layers - 1}")
        return self.layers[layer]

    def _check_head(self, head: int | None) -> None:
        if head is None:
            return
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"head must be an int or None, got {type(head).__name__}")
        if not 0 <= head < self.n_heads:
            raise OutOfRangeError(f"head {head} is out of range: this model has heads 0..{self.n_heads - 1}")

    def q(self, layer: int) -> Tensor:  # [head, pos, d_head]
        return self.layer(layer).q

    def k(self, layer: int) -> Tensor:  # [kv_head, pos, d_head]
        return self.layer(layer).k

    def v(self, layer: int) -> Tensor:  # [kv_head, pos, d_head_v]
        return self.layer(layer).v

    def kv_head_of(self, head: int) -> int:
        """The key/value head a query head reads (GQA groups consecutive query heads)."""
        return head // (self.n_heads // self.n_kv_heads)

    # ------------------------------------------------------------------ recomputation
    def _sdpa_args(self, layer: int, head: int | None, causal: bool | None, scale: bool | float):
        rec = self.layer(layer)
        self._check_head(head)
        if head is None:
            q, k, v = rec.q, rec.k, rec.v
        else:
            kv = self.kv_head_of(head)
            q, k, v = rec.q[head : head + 1], rec.k[kv : kv + 1], rec.v[kv : kv + 1]
        if scale is True:
            factor = rec.scaling
        elif scale is False:
            factor = 1.0
        elif isinstance(scale, (int, float)):
            factor = float(scale)
        else:
            raise ArgumentTypeError(f"scale must be True (the model's), False (none) or a number, got {scale!r}")
        if causal is None:  # exactly the model's own mask
            kwargs = dict(causal=rec.causal, window=rec.window, mask=rec.mask)
        elif causal is True:
            kwargs = dict(causal=True, window=rec.window if rec.causal else None)
        elif causal is False:
            kwargs = dict(causal=False)
        else:
            raise ArgumentTypeError(f"causal must be None (the model's), True or False, got {causal!r}")
        if kwargs.get("mask") is not None:
            kwargs["mask"] = kwargs["mask"][None, None]
        return q[None], k[None], v[None], dict(scale=factor, softcap=rec.softcap, **kwargs)

    def attention(
        self,
        layer: int,
        head: int | None = None,
        *,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """Attention weights recomputed by attnviz's own SDPA, in float32.

        - ``causal``: ``None`` uses the model's own mask; ``True`` forces the causal mask (the seeds'
          switch), ``False`` lets every token see every token.
        - ``scale``: ``True`` is the model's own factor (1/√d_k, or GPT-2's per-layer one), ``False``
          switches scaling off (the row collapses toward one-hot), a number sets it.
        - ``temperature``: scores are divided by it before the softmax.
        - ``words``: merge tokens into words — attention *to* a word summed over its tokens, *from*
          a word averaged over its tokens — giving ``[word, word]``.
        """
        if not isinstance(temperature, (int, float)) or temperature <= 0:
            raise InputError(f"temperature must be a number > 0, got {temperature!r}")
        q, k, v, kwargs = self._sdpa_args(layer, head, causal, scale)
        _, weights = scaled_dot_product(q, k, v, temperature=float(temperature), **kwargs)
        weights = weights[0] if head is None else weights[0, 0]
        return self.to_words(weights) if words else weights

    def allowed(self, layer: int, *, causal: bool | None = None) -> Tensor:  # [query_pos, key_pos] bool
        """Which (query, key) pairs the mask lets through (``causal`` as in :meth:`attention`)."""
        _, _, _, kwargs = self._sdpa_args(layer, None, causal, True)
        n = self.n_tokens
        allowed = build_mask(n, n, causal=kwargs.get("causal", False), window=kwargs.get("window"))
        allowed = torch.ones(n, n, dtype=torch.bool) if allowed is None else allowed[0, 0].cpu()
        mask = kwargs.get("mask")
        if mask is not None:
            mask = mask[0, 0].cpu()
            allowed = allowed & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2)
        return allowed

    def output(self, layer: int, head: int | None = None) -> Tensor:  # [head, pos, d_head_v] or [pos, d_head_v]
        """A·V recomputed by attnviz's own SDPA with the model's mask and scaling, in float32."""
        q, k, v, kwargs = self._sdpa_args(layer, head, None, True)
        out, _ = scaled_dot_product(q, k, v, **kwargs)
        return out[0] if head is None else out[0, 0]

    def scores(self, layer: int, head: int | None = None, *, scale: bool | float = True) -> Tensor:
        """Pre-softmax scores Q·Kᵀ·scale (no mask), float32: ``[head, q, k]`` or ``[q, k]``."""
        q, k, _, kwargs = self._sdpa_args(layer, head, None, scale)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        s = (q.float() @ k.float().transpose(-2, -1)) * kwargs["scale"]
        return s[0] if head is None else s[0, 0]

    def to_words(self, weights: Tensor) -> Tensor:  # [..., query_pos, key_pos] -> [..., word, word]
        """Merge a token × token matrix into word × word (to a word summed, from a word averaged)."""
        to_sum = group_matrix(self.words, self.n_tokens).to(weights)
        from_mean = group_matrix(self.words, self.n_tokens, mean=True).to(weights)
        return from_mean @ weights @ to_sum.T

    @property
    def word_labels(self) -> list[str]:
        return [w.text for w in self.words]

    def word_index(self, word: str | int) -> int:
        """Index of a word given by its text (first occurrence) or its index."""
        if isinstance(word, int):
            if not 0 <= word < len(self.words):
                raise OutOfRangeError(f"word {word} is out of range: this text has words 0..{len(self.words) - 1}")
            return word
        for i, w in enumerate(self.words):
            if w.text == word:
                return i
        raise InputError(f"no word {word!r} in this text; its words are {self.word_labels}")

    # ------------------------------------------------------------------ outputs
    def validate(self, **kwargs) -> ValidationReport:
        """Recomputed weights and outputs against the model's own, per layer and head."""
        from .validate import validate

        return validate(self, **kwargs)

    def to_pandas(self, layer: int | None = None, head: int | None = None, *, words: bool = False) -> pd.DataFrame:
        """A tidy table: layer, head, query_pos, key_pos, query_token, key_token, weight.

        ``layer``/``head`` ``None`` means all captured layers / all heads (that computes every
        pattern asked for). With ``words=True`` positions and tokens are words.
        Masked pairs (weight exactly 0 by the mask) are kept, so every table is n × n per head.
        """
        import pandas as pd

        layers = sorted(self.layers) if layer is None else [layer]
        self._check_head(head)
        labels = self.word_labels if words else self.tokens
        n = len(labels)
        frames = []
        for lay in layers:
            w = self.attention(lay, words=words).cpu()  # [head, q, k]
            heads = range(self.n_heads) if head is None else [head]
            for h in heads:
                frames.append(
                    pd.DataFrame(
                        {
                            "layer": lay,
                            "head": h,
                            "query_pos": torch.arange(n).repeat_interleave(n).numpy(),
                            "key_pos": torch.arange(n).repeat(n).numpy(),
                            "query_token": [labels[i] for i in range(n) for _ in range(n)],
                            "key_token": labels * n,
                            "weight": w[h].reshape(-1).numpy(),
                        }
                    )
                )
        return pd.concat(frames, ignore_index=True)

    def save(self, path: str | Path) -> Path:
        """Write the capture as one safetensors file with JSON metadata (no pickle)."""
        from .io import save

        return save(self, path)

    def to(self, device: str | torch.device) -> Capture:
        """A copy with every tensor on ``device``."""
        layers = {
            i: replace(
                r,
                **{
                    name: getattr(r, name).to(device)
                    for name in ("q", "k", "v", "out", "weights", "mask")
                    if getattr(r, name) is not None
                },
            )
            for i, r in self.layers.items()
        }
        return replace(self, layers=layers)
