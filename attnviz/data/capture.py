"""The Capture data model: one text's recorded attention (``attnviz.capture()`` makes it).

A :class:`Capture` is one input: its tokens and words (and, for encoder-decoder models, the
decoder's tokens too), and per attention — keyed by *part* (``"encoder"``, ``"decoder"``,
``"cross"``) and layer — the Q, K, V the kernel received (O(n·d)), the kernel's own output, the
scaling, mask, position bias and sinks it used. Attention maps (O(n²) per head) are recomputed on
demand by :func:`attnviz.attention.scaled_dot_product`. It holds no model.

Which tokens a part reads: encoder → source × source, decoder → target × target, cross →
target (queries) × source (keys). A one-stack model has one part, over its one text. A model of two
towers adds a ``vision`` part over its picture's tokens (``[CLS]``, patches: :meth:`Capture.image_of`)
beside its ``text`` part (a joint CLIP / SigLIP model's text tower, over the source) or its language
model (a vision-language model's ``decoder``, over the source's text and image tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..attention import attention_output, attention_tile, build_mask, online_attention, scaled_dot_product
from ..engine.specs import PARTS
from ..errors import ArgumentTypeError, InputError, OutOfRangeError
from .images import ImageGrid, image_sequence
from .interop import to_bertviz, to_circuitsvis
from .moved import word_contributions
from .records import LayerRecord
from .reprs import html_of
from .tables import capture_table
from .validate import ValidationReport
from .validate import validate as validate_capture
from .words import TokenSequence, Word, group_matrix

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["PARTS", "Capture", "LayerRecord", "TokenSequence"]

#: the tensor fields of a :class:`LayerRecord` (what moves between devices and into a capture file)
RECORD_TENSORS = (
    "q",
    "k",
    "v",
    "out",
    "weights",
    "mask",
    "bias",
    "relative_bias",
    "sinks",
    "weight_error",
    "weight_scale",
    "value_dots",
    "projection_check",
    "lse",
)


def _factor(scale: object, model: float) -> float:
    """The factor on Q·Kᵀ that ``scale`` (of :meth:`Capture.attention`) means, the model's being ``model``."""
    if scale is True:
        return model
    if scale is False:
        return 1.0
    if isinstance(scale, (int, float)):
        return float(scale)
    raise ArgumentTypeError(f"scale must be True (the model's), False (none) or a number, got {scale!r}")


def _check_causal(causal: object, part: str) -> None:
    """Refuse a ``causal`` (of :meth:`Capture.attention`) that is not None / True / False, or True for cross-attention."""
    if causal not in (None, True, False) or not isinstance(causal, (bool, type(None))):
        raise ArgumentTypeError(f"causal must be None (the model's), True or False, got {causal!r}")
    if causal is True and part == "cross":
        raise InputError(
            "cross-attention has no causal mask: each target token reads the whole source; leave causal=None (or False)"
        )


#: which query rows or key columns: a range, a slice, a sequence of ints or a 1-d tensor (None: all)
Span = range | slice | Sequence[int] | Tensor | None


def _rows(span: Span, n: int, name: str, what: str) -> Tensor:
    """:func:`_span` as a tensor of indices always."""
    index = _span(span, n, name, what, tensor=True)
    assert isinstance(index, Tensor)  # tensor=True
    return index


def _span(span: Span, n: int, name: str, what: str, *, tensor: bool = False) -> Tensor | slice:
    """``span`` as a slice (a range or slice of step 1, unless ``tensor``) or a 1-d long tensor of
    indices, read as Python reads them: a slice clamps to ``0..n-1`` and may step backwards, an index
    may count from the end (``-1`` is the last); an :class:`OutOfRangeError` naming ``0..n-1`` for an
    index outside ``-n..n-1``."""
    if span is None:
        span = range(n)
    if isinstance(span, slice):
        span = range(*span.indices(n))
    if isinstance(span, range):
        if not len(span):
            return slice(0, 0) if not tensor else torch.zeros(0, dtype=torch.long)
        if span.step == 1 and 0 <= span[0] and span[-1] < n and not tensor:
            return slice(span.start, span.stop)
        span = list(span)
    if isinstance(span, Tensor):
        if span.dim() > 1 or span.dtype.is_floating_point or span.dtype == torch.bool:
            raise ArgumentTypeError(
                f"{name} must be a 1-d tensor of ints, got {span.dtype} of shape {tuple(span.shape)}"
            )
        index = span.long().flatten()
    elif isinstance(span, Sequence) and all(isinstance(x, int) and not isinstance(x, bool) for x in span):
        index = torch.tensor(list(span), dtype=torch.long)
    else:
        raise ArgumentTypeError(
            f"{name} must be a range, a slice, a sequence of ints or a 1-d tensor of ints, got {type(span).__name__}"
        )
    if index.numel():
        low, high = int(index.min()), int(index.max())  # one wait: the indices are checked once
        if low < -n or high >= n:
            raise OutOfRangeError(
                f"{name} must lie in 0..{n - 1} (or -{n}..-1 from the end; {n} {what}), got {low if low < -n else high}"
            )
        if low < 0:
            index = torch.where(index < 0, index + n, index)
    return index


@dataclass
class Capture:
    """One input's attention, as recorded from one forward of one model."""

    text: str  # the (source) text
    tokens: list[str]  # the tokenizer's pieces, e.g. ['The', 'Ġcat', ...]
    token_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``
    words: list[Word]
    records: dict[tuple[str, int], LayerRecord]  # (part, layer) -> what that attention's kernel saw
    model: dict[str, Any] = field(default_factory=dict)  # name, model_type, backend, dtype, parts: {part: sizes}, …
    target: TokenSequence | None = None  # the decoder's input tokens (encoder-decoder models)
    image: ImageGrid | None = None  # a vision encoder's picture and patch grid (its tokens: CLS, registers, patches)
    # a vision-language model's vision tower: the same picture, the tower's own tokens ([CLS], patches)
    vision: ImageGrid | None = None

    # ------------------------------------------------------------------ parts and sequences
    @property
    def parts(self) -> tuple[str, ...]:
        """The attentions this capture holds, e.g. ``("encoder", "decoder", "cross")``; ``("decoder",)`` for GPT-2."""
        present = {part for part, _ in self.records} | set(self.model.get("parts", {}))
        return tuple(p for p in PARTS if p in present)

    def resolve_part(self, part: str | None) -> str:
        """The part ``part`` names in this capture (None: the only one); an :class:`InputError` for a
        part it does not hold, or for None when it holds several."""
        parts = self.parts
        if part is None:
            if len(parts) == 1:
                return parts[0]
            raise InputError(
                f"this capture has the parts {', '.join(parts)}; say which with part=… (--part on the command line)"
            )
        if part not in parts:
            raise InputError(f"no part {part!r} in this capture; its parts are {', '.join(parts)}")
        return part

    @property
    def source(self) -> TokenSequence:
        """The text the model read (the encoder's, for an encoder-decoder model)."""
        return TokenSequence(self.text, self.tokens, self.token_ids, self.offsets, self.words)

    def sequences(self, part: str | None = None) -> tuple[TokenSequence, TokenSequence]:
        """(query tokens, key tokens) of a part: cross attention reads target × source; a ``vision``
        part its picture's tokens (:meth:`image_of`)."""
        part = self.resolve_part(part)
        if part == "vision":
            seq = image_sequence(self._vision_grid())
            return seq, seq
        if self.target is None or part in ("encoder", "text"):
            return self.source, self.source
        if part == "decoder":
            return self.target, self.target
        return self.target, self.source

    def image_of(self, part: str | None = None) -> ImageGrid | None:
        """The picture a part's tokens sit on and where each sits, or None (a text part).

        A vision encoder's part, or a vision-language model's language model (text and image tokens):
        :attr:`image`. A ``vision`` part (a joint CLIP / SigLIP model's vision tower, a VLM's vision
        tower): its tower's own tokens over the picture — :attr:`vision` where the capture has one (a
        VLM), else :attr:`image` (a joint model, whose ``text`` part has no picture)."""
        part = self.resolve_part(part)
        if part == "vision":
            return self._vision_grid()
        return None if part == "text" else self.image

    def _vision_grid(self) -> ImageGrid:
        grid = self.vision if self.vision is not None else self.image
        if grid is None:
            raise InputError("this capture's vision part has no picture kept with it, so its tokens are unknown")
        return grid

    def select(self, part: str | None = None) -> Capture:
        """This capture narrowed to one self-attention part, over that part's own tokens.

        The analyses (head statistics, coreference, rollout) work on one sequence attending to
        itself: the encoder over the source, or the decoder over the target. A one-part capture is
        returned as it is.
        """
        part = self.resolve_part(part)
        if len(self.parts) == 1:
            return self
        if part == "cross":
            raise InputError("cross-attention reads the target over the source; choose the encoder or the decoder part")
        seq, _ = self.sequences(part)
        records = {key: rec for key, rec in self.records.items() if key[0] == part}
        meta = {**self.model, "parts": {part: self.model["parts"][part]}}
        return Capture.of(seq, records, meta, image=self.image_of(part))

    @classmethod
    def of(
        cls,
        source: TokenSequence,
        records: dict[tuple[str, int], LayerRecord],
        model: dict[str, Any],
        target: TokenSequence | None = None,
        image: ImageGrid | None = None,
        vision: ImageGrid | None = None,
    ) -> Capture:
        """A capture of ``source`` (and, for an encoder-decoder, the decoder's ``target``) tokens; of a
        vision encoder, ``image`` is the picture its tokens came from (``vision``: a VLM's vision tower's)."""
        return cls(
            source.text,
            source.tokens,
            source.token_ids,
            source.offsets,
            source.words,
            records,
            model,
            target,
            image,
            vision,
        )

    @property
    def target_text(self) -> str | None:
        return None if self.target is None else self.target.text

    @property
    def target_tokens(self) -> list[str] | None:
        return None if self.target is None else self.target.tokens

    @property
    def target_words(self) -> list[Word] | None:
        return None if self.target is None else self.target.words

    # ------------------------------------------------------------------ sizes
    def info(self, part: str | None = None) -> dict[str, int]:
        """Sizes of a part: n_layers, n_heads, n_kv_heads, d_head."""
        return dict(self.model["parts"][self.resolve_part(part)])

    def _common(self, key: str) -> int:
        values = {info[key] for info in self.model["parts"].values()}
        if len(values) == 1:
            return int(values.pop())
        raise InputError(
            f"the parts of this capture differ in {key} ("
            + ", ".join(f"{p} {info[key]}" for p, info in self.model["parts"].items())
            + "); use cap.info(part)"
        )

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_layers(self) -> int:
        """Layers per part (the largest, when an encoder and a decoder differ)."""
        return max(int(info["n_layers"]) for info in self.model["parts"].values())

    @property
    def n_heads(self) -> int:
        return self._common("n_heads")

    @property
    def n_kv_heads(self) -> int:
        return self._common("n_kv_heads")

    @property
    def d_head(self) -> int:
        return self._common("d_head")

    @property
    def token_labels(self) -> list[str]:
        return self.source.token_labels

    @property
    def word_labels(self) -> list[str]:
        return [w.text for w in self.words]

    def word_index(self, word: str | int) -> int:
        return self.source.word_index(word)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor storage the capture holds (shared storages counted once)."""
        seen: set[int] = set()
        total = 0
        for rec in self.records.values():
            for name in RECORD_TENSORS:
                t = getattr(rec, name)
                if t is not None and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
        return total

    def __repr__(self) -> str:
        layers = ", ".join(f"{p} {len(self.layer_indices(p))}/{self.info(p)['n_layers']}" for p in self.parts)
        heads = ", ".join(
            sorted({f"{i['n_heads']} heads ({i['n_kv_heads']} kv)" for i in self.model["parts"].values()})
        )
        target = f", target {len(self.target.tokens)} tokens" if self.target is not None else ""
        return (
            f"Capture({self.model.get('name', '?')!r}, {self.n_tokens} tokens, {len(self.words)} words{target}, "
            f"layers: {layers}; {heads}, backend {self.model.get('backend')})"
        )

    # ------------------------------------------------------------------ access
    def layer_indices(self, part: str | None = None) -> list[int]:
        """The captured layers of a part, in order."""
        part = self.resolve_part(part)
        return sorted(layer for p, layer in self.records if p == part)

    def layer(self, layer: int, part: str | None = None) -> LayerRecord:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ArgumentTypeError(f"layer must be an int, got {type(layer).__name__}")
        part = self.resolve_part(part)
        if (part, layer) not in self.records:
            n = self.info(part)["n_layers"]
            where = f" ({part})" if len(self.parts) > 1 else ""
            if 0 <= layer < n:
                raise OutOfRangeError(
                    f"layer {layer}{where} was not captured (captured: {self.layer_indices(part)}); "
                    f"capture again with layers=None or including {layer}"
                )
            raise OutOfRangeError(f"layer {layer} is out of range: this model has layers 0..{n - 1}{where}")
        return self.records[(part, layer)]

    def check_head(self, head: int | None, part: str | None = None) -> None:
        """Refuse a head that is not an int in range for ``part`` (None passes: every head)."""
        if head is None:
            return
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"head must be an int or None, got {type(head).__name__}")
        n = self.info(part)["n_heads"]
        if not 0 <= head < n:
            raise OutOfRangeError(f"head {head} is out of range: this model has heads 0..{n - 1}")

    def q(self, layer: int, part: str | None = None) -> Tensor:  # [head, query_pos, d_head]
        return self.layer(layer, part).q

    def k(self, layer: int, part: str | None = None) -> Tensor:  # [kv_head, key_pos, d_head]
        return self.layer(layer, part).k

    def v(self, layer: int, part: str | None = None) -> Tensor:  # [kv_head, key_pos, d_head_v]
        return self.layer(layer, part).v

    def kv_head_of(self, head: int, part: str | None = None) -> int:
        """The key/value head a query head reads (GQA groups consecutive query heads)."""
        info = self.info(part)
        return head // (info["n_heads"] // info["n_kv_heads"])

    # ------------------------------------------------------------------ recomputation
    def _sdpa_args(self, layer: int, head: int | None, causal: bool | None, scale: bool | float, part: str | None):
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part)
        bias = rec.bias_part()
        sinks = rec.sinks
        if head is None:
            q, k, v = rec.q, rec.k, rec.v
        else:
            kv = self.kv_head_of(head, part)
            q, k, v = rec.q[head : head + 1], rec.k[kv : kv + 1], rec.v[kv : kv + 1]
            if bias is not None and bias.shape[0] > 1:
                bias = bias[head : head + 1]
            sinks = None if sinks is None else sinks[head : head + 1]
        factor = _factor(scale, rec.scaling)
        _check_causal(causal, part)
        mask = rec.mask_part()
        if mask is not None and head is not None and mask.shape[0] > 1:
            mask = mask[head : head + 1]
        if causal is None:  # exactly the model's own mask
            kwargs = dict(causal=rec.causal, window=rec.window, mask=None if mask is None else mask[None])
        elif causal is True:
            kwargs = dict(causal=True, window=rec.window if rec.causal else None)
        else:
            kwargs = dict(causal=False)
        return (
            q[None],
            k[None],
            v[None],
            dict(scale=factor, softcap=rec.softcap, bias=None if bias is None else bias[None], sinks=sinks, **kwargs),
        )

    def attention(
        self,
        layer: int,
        head: int | None = None,
        *,
        part: str | None = None,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
        rows: Span = None,
        cols: Span = None,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """Attention weights recomputed by attnviz's own SDPA, in float32.

        - ``part``: ``"encoder"``, ``"decoder"`` or ``"cross"``; may be left out when the capture has
          one part. Cross-attention is ``[target_pos, source_pos]``.
        - ``causal``: ``None`` uses the model's own mask; ``True`` forces the causal mask (the seeds'
          switch), ``False`` lets every token see every token.
        - ``scale``: ``True`` is the model's own factor (1/√d_k, or GPT-2's per-layer one), ``False``
          switches scaling off (the row collapses toward one-hot), a number sets it.
        - ``temperature``: scores are divided by it before the softmax.
        - ``words``: merge tokens into words — attention *to* a word summed over its tokens, *from*
          a word averaged over its tokens — giving ``[word, word]``.

        - ``rows`` / ``cols``: only this tile of the map, ``[head, r, c]`` (``[r, c]`` for one head) —
          a ``range``, a ``slice``, a sequence of ints or a 1-d tensor of query rows / key columns
          (``None``: all). The tile is ``exp(s − lse)`` from each row's log-sum-exp: O(r · c) once the
          layer's :attr:`LayerRecord.lse` holds the rows (full validation fills it,
          :meth:`log_sum_exp` / ``LayerRecord.fill_lse()`` too), else the rows' log-sum-exp is
          computed first by one pass over their keys in tiles, O(r · key_pos), and — under the model's
          own settings (``causal=None``, ``scale=True``, ``temperature=1``) — kept on the record for
          next time. Other settings compute their rows' log-sum-exp each time; ``words=True`` slices
          the word map (rows and columns are words then). Indices outside the map are an
          :class:`OutOfRangeError`.

        Position biases (T5, ALiBi) are part of the scores; with learned sinks (gpt-oss) each row
        sums to less than 1, the rest being the sink's share (:meth:`sink_share`).
        """
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
            raise InputError(f"temperature must be a number > 0, got {temperature!r}")
        if rows is not None or cols is not None:
            if words:
                full = self.attention(
                    layer, head, part=part, causal=causal, scale=scale, temperature=temperature, words=True
                )
                n_q, n_k = full.shape[-2:]
                r, c = _rows(rows, n_q, "rows", "query words"), _span(cols, n_k, "cols", "key words")
                full = full.index_select(-2, r.to(full.device))
                return full[..., c] if isinstance(c, slice) else full.index_select(-1, c.to(full.device))
            return self._tile(layer, head, rows, cols, part, causal, scale, float(temperature))
        q, k, v, kwargs = self._sdpa_args(layer, head, causal, scale, part)
        _, weights = scaled_dot_product(q, k, v, temperature=float(temperature), **kwargs)
        weights = weights[0] if head is None else weights[0, 0]
        return self.to_words(weights, part) if words else weights

    def log_sum_exp(
        self, layer: int, head: int | None = None, *, part: str | None = None, rows: Span = None
    ) -> Tensor:  # [head, r], or [r] for one head
        """Each query row's log-sum-exp ``log Σ_j exp(s_ij)`` (with sinks, their term included) under the
        model's own settings: ``exp(s_ij − lse_i)`` is the weight :meth:`attention` gives. Read from the
        layer's :attr:`LayerRecord.lse`; rows it does not hold yet are computed by one key-tiled pass
        (:func:`attnviz.attention.online_attention`) and kept there."""
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part)
        lse = rec.log_sum_exp(_rows(rows, rec.n_queries, "rows", "query rows"), head)
        return lse if head is None else lse[0]

    def _tile(
        self,
        layer: int,
        head: int | None,
        rows: Span,
        cols: Span,
        part: str | None,
        causal: bool | None,
        scale: bool | float,
        temperature: float,
    ) -> Tensor:  # [head, r, c] or [r, c]
        part = self.resolve_part(part)
        rec = self.layer(layer, part)
        self.check_head(head, part)
        r = _rows(rows, rec.n_queries, "rows", "query rows")
        c = _span(cols, rec.n_keys, "cols", "key columns")
        _check_causal(causal, part)
        args = rec.sdpa_arguments(head)
        args["scale"] = _factor(scale, rec.scaling)
        if causal is True:
            args.update(causal=True, window=rec.window if rec.causal else None, mask=None)
        elif causal is False:
            args.update(causal=False, window=None, mask=None)
        q, k, v = rec.head_qkv(head)
        if causal is None and scale is True and temperature == 1.0:
            lse = rec.log_sum_exp(r, head)  # the model's own: kept on the record
        else:
            _, lse = online_attention(q, k, v[..., :0], rows=r, temperature=temperature, **args)
        args.pop("sinks")  # inside lse
        weights = attention_tile(q, k, lse, rows=r, cols=c, temperature=temperature, **args)
        # a row whose every key an additive mask hides (its logits all ≈ float32's min) has a finite lse
        # that float32 cannot tell from its logits: its weights come from the whole map (one wait, rare)
        if bool(((lse < torch.finfo(torch.float32).min / 2) & torch.isfinite(lse)).any()):
            full = self.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature)
            full = full if head is None else full[None]
            full = full.index_select(1, r.to(full.device))
            weights = full[..., c] if isinstance(c, slice) else full.index_select(-1, c.to(full.device))
        return weights if head is None else weights[0]

    def value_norms(self, layer: int, *, part: str | None = None) -> Tensor:  # [head, key_pos]
        """‖f_h(x_j)‖ per head and key, float32: the norm of what head *h* would move from key *j*
        at weight 1 — ``f_h(x_j) = W_O^h v_j``, the head's slice of the layer's output projection
        applied to the value it reads (the value projection's bias included; the output
        projection's bias, added once per layer, is no head's). Kept while capturing."""
        return self._moved(layer, part).value_norms  # type: ignore[return-value]

    def _moved(self, layer: int, part: str | None) -> LayerRecord:
        rec = self.layer(layer, part)
        if rec.value_dots is None:
            raise InputError(
                f"this capture holds no value norms for layer {layer}: it was captured without them "
                f"(capture(..., keep=) or --keep without 'norms'), its attention module {rec.name!r} has no output "
                "projection attnviz could read, or the capture file was written before attnviz kept value norms; "
                "capture it again, or show the weights instead"
            )
        return rec

    def contributions(
        self,
        layer: int,
        head: int | None = None,
        *,
        part: str | None = None,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """What each head moves from each key into each query: ``‖α_ij · f_h(x_j)‖ = α_ij · ‖f_h(x_j)‖``
        (Kobayashi et al. 2020), float32, with the weights of :meth:`attention` under the same
        ``causal``, ``scale`` and ``temperature``.

        ``words=True`` gives ``[word, word]``: the norm of the *summed* vector a query word receives
        from a key word's tokens, ``‖Σ_{j∈J} β_Ij f_h(x_j)‖`` with ``β_Ij`` the query word's mean weight
        on token *j* — not the sum of the tokens' norms, which would count two tokens moving
        opposite vectors as moving twice as much when together they move nothing.
        """
        rec = self._moved(layer, part)
        assert rec.value_dots is not None  # _moved refuses a record without
        weights = self.attention(layer, head, part=part, causal=causal, scale=scale, temperature=temperature)
        dots = rec.value_dots if head is None else rec.value_dots[head : head + 1]
        weights = weights if head is None else weights[None]
        if words:
            moved = word_contributions(weights, dots, *self.sequences(part))
        else:
            moved = weights * dots[..., 0].clamp_min(0).sqrt().to(weights)[:, None, :]
        return moved if head is None else moved[0]

    def attention_rows(
        self, layer: int, rows: Sequence[int] | Tensor, *, part: str | None = None
    ) -> Tensor:  # [head, len(rows), key_pos]
        """Only these query rows of every head's weights, with the model's own mask, bias and sinks —
        computing just those rows (a pronoun's row, a generation step) instead of the n×n maps."""
        rec = self.layer(layer, part)
        index = torch.as_tensor(rows, dtype=torch.long).flatten()
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < rec.n_queries):
            raise OutOfRangeError(f"rows must lie in 0..{rec.n_queries - 1}, got {index.tolist()[:8]}")
        chunks = [
            weights
            for _, _, _, weights in attention_output(
                rec.q, rec.k, rec.v, rows=index, all_keys=True, **rec.sdpa_arguments()
            )
        ]
        return torch.cat(chunks, dim=1).float() if chunks else torch.zeros(rec.q.shape[0], 0, rec.n_keys)

    def sink_share(self, layer: int, head: int | None = None, *, part: str | None = None) -> Tensor | None:
        """The share of each query row that a learned sink takes (``1 - row sum``), or None without sinks."""
        if self.layer(layer, part).sinks is None:
            return None
        return 1.0 - self.attention(layer, head, part=part).sum(-1)

    def allowed(
        self, layer: int, *, part: str | None = None, causal: bool | None = None
    ) -> Tensor:  # [query_pos, key_pos] bool
        """Which (query, key) pairs the mask lets through (``causal`` as in :meth:`attention`)."""
        _, _, _, kwargs = self._sdpa_args(layer, None, causal, True, part)
        rec = self.layer(layer, part)
        n_q, n_k = rec.n_queries, rec.n_keys
        allowed = build_mask(n_q, n_k, causal=kwargs.get("causal", False), window=kwargs.get("window"))
        allowed = torch.ones(n_q, n_k, dtype=torch.bool) if allowed is None else allowed[0, 0].cpu()
        mask = kwargs.get("mask")
        if mask is not None:
            mask = mask[0].cpu()
            mask = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
            allowed = allowed & mask.all(0)
        return allowed

    def output(
        self, layer: int, head: int | None = None, *, part: str | None = None
    ) -> Tensor:  # [head, pos, d_head_v] or [pos, d_head_v]
        """A·V recomputed by attnviz's own SDPA with the model's mask, bias and scaling, in float32."""
        q, k, v, kwargs = self._sdpa_args(layer, head, None, True, part)
        out, _ = scaled_dot_product(q, k, v, **kwargs)
        return out[0] if head is None else out[0, 0]

    def scores(
        self, layer: int, head: int | None = None, *, part: str | None = None, scale: bool | float = True
    ) -> Tensor:
        """Pre-softmax scores Q·Kᵀ·scale + bias (no mask), float32: ``[head, q, k]`` or ``[q, k]``."""
        q, k, _, kwargs = self._sdpa_args(layer, head, None, scale, part)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        s = (q.float() @ k.float().transpose(-2, -1)) * kwargs["scale"]
        if kwargs["softcap"] is not None:
            s = torch.tanh(s / kwargs["softcap"]) * kwargs["softcap"]
        if kwargs["bias"] is not None:
            s = s + kwargs["bias"].float()
        return s[0] if head is None else s[0, 0]

    def to_words(
        self, weights: Tensor, part: str | None = None
    ) -> Tensor:  # [..., query_pos, key_pos] -> [..., word, word]
        """Merge a token × token matrix into word × word (to a word summed, from a word averaged)."""
        queries, keys = self.sequences(part)
        to_sum = group_matrix(keys.words, keys.n_tokens).to(weights)
        from_mean = group_matrix(queries.words, queries.n_tokens, mean=True).to(weights)
        return from_mean @ weights @ to_sum.T

    # ------------------------------------------------------------------ outputs
    def validate(self, **kwargs) -> ValidationReport:
        """Recomputed outputs (and weights) against the model's own, per part, layer and head."""
        return validate_capture(self, **kwargs)

    def to_pandas(
        self, layer: int | None = None, head: int | None = None, *, part: str | None = None, words: bool = False
    ) -> pd.DataFrame:
        """A tidy table: part, layer, head, query_pos, key_pos, query_token, key_token, weight,
        contribution (what the head moves, :meth:`contributions`; NaN for a layer without value norms).

        ``layer``/``head`` ``None`` means all captured layers / all heads (that computes every
        pattern asked for); ``part`` ``None`` means every part. With ``words=True`` positions and
        tokens are words. Masked pairs (weight exactly 0 by the mask) are kept, so every table is
        queries × keys per head.
        """
        return capture_table(self, layer, head, part=part, words=words)

    def to_bertviz(self, *, words: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``bertviz.head_view(**cap.to_bertviz())`` / ``model_view`` (see
        :func:`attnviz.data.interop.to_bertviz`)."""
        return to_bertviz(self, words=words)

    def to_circuitsvis(self, layer: int, *, part: str | None = None, words: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``circuitsvis.attention.attention_patterns(**cap.to_circuitsvis(3))``
        (see :func:`attnviz.data.interop.to_circuitsvis`)."""
        return to_circuitsvis(self, layer, part=part, words=words)

    def _repr_html_(self) -> str:
        return html_of(self)  # drawn by attnviz.views.html, which registers it (data.reprs)

    def save(self, path: str | Path) -> Path:
        """Write the capture as one safetensors file with JSON metadata (no pickle)."""
        from .io import save  # deferred: io builds Captures (a circle at module level)

        return save(self, path)

    def to(self, device: str | torch.device) -> Capture:
        """A copy with every tensor on ``device``."""
        records = {
            key: replace(
                r, **{name: getattr(r, name).to(device) for name in RECORD_TENSORS if getattr(r, name) is not None}
            )
            for key, r in self.records.items()
        }
        return replace(self, records=records)
