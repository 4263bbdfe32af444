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

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..engine.specs import PARTS
from ..errors import ArgumentTypeError, HeadNotKeptError, InputError, OutOfRangeError
from .images import ImageGrid, image_sequence
from .interop import to_bertviz, to_circuitsvis
from .moved import WhatMoves
from .recompute import Recomputation
from .records import LayerRecord
from .reprs import html_of, report_of
from .tables import capture_table
from .validate import ValidationReport
from .validate import validate as validate_capture
from .words import TokenSequence, Word

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


@dataclass
class Capture(Recomputation, WhatMoves):
    """One input's attention, as recorded from one forward of one model. Its maps are recomputed by
    :class:`~attnviz.data.recompute.Recomputation`, what its heads move by :class:`~attnviz.data.moved.WhatMoves`."""

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
        kept = sorted({h for p in self.parts for h in self.kept_heads(p)})
        if any(rec.heads is not None for rec in self.records.values()):  # capture(heads=): the model's numbers kept
            heads += f", kept heads {', '.join(map(str, kept))}"
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

    def check_head(self, head: int | None, part: str | None = None, layer: int | None = None) -> None:
        """Refuse a head that is not an int in range for ``part`` (None passes: every head), or one the
        capture did not keep (``capture(heads=)``: of ``layer``, or of any layer of the part) — a
        :class:`~attnviz.errors.HeadNotKeptError` naming the heads kept. Heads are the model's numbers."""
        if head is None:
            return
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"head must be an int or None, got {type(head).__name__}")
        n = self.info(part)["n_heads"]
        if not 0 <= head < n:
            raise OutOfRangeError(f"head {head} is out of range: this model has heads 0..{n - 1}")
        if layer is not None:
            self.layer(layer, part).head_index(head)
            return
        part = self.resolve_part(part)
        kept = self.kept_heads(part)
        if head not in kept:
            raise HeadNotKeptError(
                f"head {head} was not kept: this capture kept heads {', '.join(map(str, kept))} "
                f"(capture(..., heads=) / --heads); capture again with heads=None or including {head}"
            )

    def kept_heads(self, part: str | None = None) -> list[int]:
        """The model's numbers of the query heads this capture keeps of ``part``, in order: every head
        unless it was made with ``capture(heads=)`` (then those of any of its layers)."""
        part = self.resolve_part(part)
        records = [rec for (p, _), rec in self.records.items() if p == part]
        if all(rec.heads is None for rec in records):
            return list(range(self.info(part)["n_heads"]))
        return sorted({h for rec in records for h in rec.head_numbers})

    def head_index(self, layer: int, head: int, part: str | None = None) -> int:
        """Where the model's query head ``head`` of ``layer`` sits in that record's stacks (``cap.q(layer)``,
        ``cap.attention(layer)``…): itself for a capture of every head; a head not kept refused
        (:class:`~attnviz.errors.HeadNotKeptError`)."""
        self.check_head(head, part, layer)
        return self.layer(layer, part).head_index(head)

    def q(self, layer: int, part: str | None = None, head: int | None = None) -> Tensor:
        """The queries ``[head, query_pos, d_head]`` (the heads kept, :meth:`kept_heads`), or one
        ``head``'s ``[query_pos, d_head]`` by the model's number."""
        rec = self.layer(layer, part)
        return rec.q if head is None else rec.q[self.head_index(layer, head, part)]

    def k(self, layer: int, part: str | None = None, head: int | None = None) -> Tensor:
        """The keys ``[kv_head, key_pos, d_head]`` (the key/value heads the kept heads read), or the
        ``[key_pos, d_head]`` that query ``head`` (the model's number) reads."""
        rec = self.layer(layer, part)
        return rec.k if head is None else rec.k[rec.kv_index(self.head_index(layer, head, part))]

    def v(self, layer: int, part: str | None = None, head: int | None = None) -> Tensor:
        """The values ``[kv_head, key_pos, d_head_v]``, or the ``[key_pos, d_head_v]`` that query
        ``head`` (the model's number) reads."""
        rec = self.layer(layer, part)
        return rec.v if head is None else rec.v[rec.kv_index(self.head_index(layer, head, part))]

    def kv_head_of(self, head: int, part: str | None = None) -> int:
        """The key/value head a query head reads (GQA groups consecutive query heads)."""
        info = self.info(part)
        return head // (info["n_heads"] // info["n_kv_heads"])

    # ------------------------------------------------------------------ outputs
    def validate(self, **kwargs) -> ValidationReport:
        """Recomputed outputs (and weights) against the model's own, per part, layer and head."""
        return validate_capture(self, **kwargs)

    def to_pandas(
        self, layer: int | None = None, head: int | None = None, *, part: str | None = None, words: bool = False
    ) -> pd.DataFrame:
        """A tidy table: part, layer, head, query_pos, key_pos, query_token, key_token, weight,
        moved (what the head moves, :meth:`moved`; NaN for a layer without value norms).

        ``layer``/``head`` ``None`` means all captured layers / all heads (that computes every
        pattern asked for); ``part`` ``None`` means every part. With ``words=True`` positions and
        tokens are words. Masked pairs (weight exactly 0 by the mask) are kept, so every table is
        queries × keys per head. The table's ``.attrs["provenance"]`` is the capture's :attr:`provenance`.
        """
        return capture_table(self, layer, head, part=part, words=words)

    @property
    def provenance(self) -> dict[str, Any]:
        """Where this capture came from (``self.model["provenance"]``): the model, its revision, the sha256
        of the weights and of the tokenizer, the versions, device, dtype, backend, ``add_bos``, any edits and
        the self-check's verdict — ``attnviz.workflows.capture.provenance.FIELDS`` says what each field is.
        Empty for a capture saved before attnviz recorded it."""
        return dict(self.model.get("provenance") or {})

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

    def report(self, path: str | Path, **kwargs: Any) -> Path:
        """Write one self-contained HTML report of the capture to ``path`` (it opens offline: every view
        chosen in the page itself, no server) and return the path; the keywords are
        :func:`attnviz.figures.report`'s (``ranking=``, ``atlas=``, ``intervention=``, ``heads=``, …)."""
        return report_of(self, path, **kwargs)  # written by attnviz.views.report_page (data.reprs)

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
