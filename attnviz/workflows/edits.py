"""Counterfactual attention: edits that change what chosen heads do while the model runs.

An edit names what to change and where (layers, heads, part); :func:`attnviz.workflows.intervene` runs the
model with it and reports what the model then predicts. The seeds' toggles act on the model
(:func:`no_scaling`, :func:`scale`, :func:`temperature`, :func:`no_causal_mask`), attention between
tokens can be blocked (:func:`knockout`), a head's output removed (:func:`ablate`), its pattern made
uniform (:func:`uniform`) or taken from another text (:func:`patch`). Edits compose, applied in this
order: scaling, temperature, mask (causal, knockouts), softmax, replaced patterns, A·V, ablation.

:func:`plan` resolves edits against a capture of the text into one :class:`LayerPlan` per layer;
the engine's :func:`attnviz.engine.editor.editing` runs a model with such plans (how the calls are
replaced is told there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..data.capture import Capture
from ..data.words import short_label
from ..errors import ArgumentTypeError, InputError, OutOfRangeError

if TYPE_CHECKING:
    from ..data.words import TokenSequence

__all__ = [
    "Edit",
    "LayerPlan",
    "ablate",
    "knockout",
    "no_causal_mask",
    "no_scaling",
    "patch",
    "plan",
    "scale",
    "temperature",
    "uniform",
]

Selection = int | Iterable[int] | None
Tokens = int | str | Iterable[int | str] | None


@dataclass(frozen=True, eq=False)
class Edit:
    """One change to what attention computes, for some layers and heads (``None``: all of them)."""

    kind: str  # scale, temperature, no_causal_mask, knockout, ablate, uniform, patch
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    part: str | None = None  # "encoder", "decoder", "cross"; None: every part (causal ones for no_causal_mask)
    value: float | None = None  # the scale factor or the temperature
    query: Any = None  # knockout: the query tokens (None: every query)
    key: Any = None  # knockout: the key tokens
    how: str = "zero"  # ablate: "zero" or "mean"
    source: Capture | None = None  # patch: the capture whose pattern is used

    def __str__(self) -> str:
        where = _where_label(self.layers, self.heads, self.part)
        if self.kind == "scale":
            what = "no ÷√d_k (scale 1)" if self.value == 1.0 else f"scale ×{self.value:g} on Q·Kᵀ"
        elif self.kind == "temperature":
            what = f"temperature {self.value:g}"
        elif self.kind == "knockout":
            what = f"knockout {_tokens_label(self.query)} ↛ {_tokens_label(self.key)}"
        elif self.kind == "ablate":
            what = f"{self.how}-ablate"
        elif self.kind == "patch":
            what = f"pattern from «{short_label(getattr(self.source, 'text', ''))}»"
        else:
            what = self.kind.replace("_", " ") + (" attention" if self.kind == "uniform" else "")
        return f"{what} at {where}"


def _tokens_label(tokens: Any) -> str:
    if tokens is None:
        return "every query"
    if isinstance(tokens, (str, int)):
        return str(tokens)
    return "/".join(str(t) for t in tokens)


def _where_label(layers, heads, part) -> str:
    layer = "every layer" if layers is None else "L" + ",".join(map(str, layers))
    head = "every head" if heads is None else "H" + ",".join(map(str, heads))
    return f"{layer}·{head}" + (f" ({part})" if part else "")


def _selection(value: Selection, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be an int, a list of ints or None, got {value!r}")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{what} must be an int, a list of ints or None, got {type(value).__name__}")
    items = tuple(value)
    if not items or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise ArgumentTypeError(f"{what} must be an int, a non-empty list of ints or None, got {value!r}")
    return items


def _part(part: str | None) -> str | None:
    if part not in (None, "encoder", "decoder", "cross"):
        raise InputError(f"part must be 'encoder', 'decoder', 'cross' or None, got {part!r}")
    return part


def _positive(x: Any, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise InputError(f"{what} must be a number > 0, got {x!r}")
    return float(x)


# ---------------------------------------------------------------- the edits
def no_scaling(*, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Compute the logits as Q·Kᵀ, without the model's ÷√d_k (the seeds' scaling switch)."""
    return Edit("scale", _selection(layer, "layer"), _selection(head, "head"), _part(part), value=1.0)


def scale(x: float, *, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Use ``x`` as the factor on Q·Kᵀ instead of the model's own (1/√d_k for most models)."""
    return Edit("scale", _selection(layer, "layer"), _selection(head, "head"), _part(part), value=_positive(x, "scale"))


def temperature(t: float, *, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Divide the logits by ``t`` before the softmax: > 1 flattens the pattern, < 1 sharpens it."""
    return Edit(
        "temperature", _selection(layer, "layer"), _selection(head, "head"), _part(part), value=_positive(t, "t")
    )


def no_causal_mask(*, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Let every query see the keys after it (a decoder's causal mask removed; windows and padding stay)."""
    return Edit("no_causal_mask", _selection(layer, "layer"), _selection(head, "head"), _part(part))


def knockout(
    *, key: Tokens, query: Tokens = None, layer: Selection = None, head: Selection = None, part: str | None = None
) -> Edit:
    """Block attention from ``query`` to ``key`` (Geva et al. 2023's knockout): those weights become 0
    and the rest of each row renormalises. Tokens are positions (ints) or words of the text (strings;
    every token of the word), or lists of them; ``query=None`` blocks the keys for every query."""
    if key is None:
        raise InputError("knockout needs key=…: the token(s) or word(s) that may not be seen")
    return Edit(
        "knockout",
        _selection(layer, "layer"),
        _selection(head, "head"),
        _part(part),
        query=_token_spec(query, "query"),
        key=_token_spec(key, "key"),
    )


def ablate(*, layer: Selection = None, head: Selection = None, how: str = "zero", part: str | None = None) -> Edit:
    """Remove the heads' output: ``how="zero"`` sets it to 0, ``"mean"`` to its mean over the text's positions."""
    if how not in ("zero", "mean"):
        raise InputError(f"how must be 'zero' or 'mean', got {how!r}")
    return Edit("ablate", _selection(layer, "layer"), _selection(head, "head"), _part(part), how=how)


def uniform(*, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Replace the heads' pattern by uniform attention over the keys each query may see."""
    return Edit("uniform", _selection(layer, "layer"), _selection(head, "head"), _part(part))


def patch(*, source: Capture, layer: Selection = None, head: Selection = None, part: str | None = None) -> Edit:
    """Use the heads' attention pattern from ``source`` — a capture of another text of the same
    length by the same model (the Winograd pair: *too big* / *too small*) — with this text's values."""
    if not isinstance(source, Capture):
        raise ArgumentTypeError(f"source must be a Capture (attnviz.capture(...)), got {type(source).__name__}")
    return Edit("patch", _selection(layer, "layer"), _selection(head, "head"), _part(part), source=source)


def _token_spec(tokens: Tokens, what: str) -> Any:
    if tokens is None:
        return None
    if isinstance(tokens, bool):
        raise ArgumentTypeError(f"{what} must be a token position, a word, or a list of them; got {tokens!r}")
    if isinstance(tokens, (int, str)):
        return tokens
    if isinstance(tokens, Iterable):
        items = tuple(tokens)
        if not items or not all(isinstance(t, (int, str)) and not isinstance(t, bool) for t in items):
            raise ArgumentTypeError(f"{what} must be a token position, a word, or a list of them; got {tokens!r}")
        return items
    raise ArgumentTypeError(f"{what} must be a token position, a word, or a list of them; got {type(tokens).__name__}")


# ---------------------------------------------------------------- resolving edits against a text
@dataclass
class LayerPlan:
    """What to change in one layer's attention call (heads by index; ``item`` None = every batch item)."""

    n_heads: int
    scale: dict[int, float] = field(default_factory=dict)  # head -> factor on Q·Kᵀ
    temperature: dict[int, float] = field(default_factory=dict)
    uncausal: set[int] = field(default_factory=set)
    knock: list[tuple[tuple[int, ...], list[int] | None, list[int]]] = field(
        default_factory=list
    )  # heads, queries, keys
    replace: dict[int, str | Tensor] = field(default_factory=dict)  # head -> "uniform" or [query, key] weights
    ablate: dict[tuple[int | None, int], str] = field(default_factory=dict)  # (item, head) -> "zero" | "mean"
    recompute: bool = False  # run attnviz's SDPA even without a weight edit (the no-edit check)

    @property
    def reweights(self) -> bool:
        """Whether the call runs through attnviz's SDPA (any edit before the output, or the check)."""
        return bool(self.recompute or self.scale or self.temperature or self.uncausal or self.knock or self.replace)


def _tokens(spec: Any, seq: TokenSequence, what: str) -> list[int]:
    items = spec if isinstance(spec, tuple) else (spec,)
    found: list[int] = []
    for item in items:
        if isinstance(item, int):
            if not 0 <= item < seq.n_tokens:
                raise OutOfRangeError(
                    f"{what} token {item} is out of range: this text has tokens 0..{seq.n_tokens - 1}"
                )
            found.append(item)
            continue
        words = [w for w in seq.words if w.text == item]
        if not words:  # a piece of a word, or a word the segmenter split otherwise: match tokens
            labels = seq.token_labels
            tokens = [i for i, label in enumerate(labels) if label.strip() == item]
            if not tokens:
                raise InputError(
                    f"no word or token {item!r} in this text ({what}); its words are {seq.word_labels}. "
                    "Give a word, a token label, or a token position"
                )
            found.extend(tokens)
        else:
            for w in words:
                found.extend(w.tokens)
    return sorted(set(found))


def plan(edits: Iterable[Edit] | Edit, cap: Capture) -> dict[tuple[str, int], LayerPlan]:
    """Resolve edits against a capture of the text: which layers, heads and tokens each changes.

    Raises :class:`OutOfRangeError` for a layer or head the model does not have, :class:`InputError`
    for a token not in the text, an edit the part cannot take (no causal mask in an encoder) or a
    patch from a capture of another model or length."""
    if isinstance(edits, Edit):
        edits = [edits]
    edits = list(edits)
    if not edits:
        raise InputError("give at least one edit, e.g. attnviz.edits.knockout(layer=3, head=1, key='cat')")
    for e in edits:
        if not isinstance(e, Edit):
            raise ArgumentTypeError(
                f"edits must be attnviz.edits objects (knockout(…), ablate(…)…), got {type(e).__name__}"
            )
    plans: dict[tuple[str, int], LayerPlan] = {}
    for edit in edits:
        for part in _parts_of(edit, cap):
            info = cap.info(part)
            n_layers, n_heads = int(info["n_layers"]), int(info["n_heads"])
            layers = _checked(edit.layers, n_layers, "layer", part)
            heads = _checked(edit.heads, n_heads, "head", part)
            queries_seq, keys_seq = cap.sequences(part)
            for layer in layers:
                p = plans.setdefault((part, layer), LayerPlan(n_heads))
                _add(p, edit, heads, queries_seq, keys_seq, cap, part, layer)
    return plans


def _parts_of(edit: Edit, cap: Capture) -> list[str]:
    parts = list(cap.parts)
    if edit.part is not None:
        if edit.part not in parts:
            raise InputError(f"this model has no {edit.part} attention; its parts are {', '.join(parts)}")
        parts = [edit.part]
    if edit.kind == "no_causal_mask":
        causal = [p for p in parts if p == "decoder"]
        if not causal:
            raise InputError(
                f"the {' and '.join(parts)} attention of this model is not causal: there is no causal mask to remove"
            )
        return causal
    return parts


def _checked(selection: tuple[int, ...] | None, n: int, what: str, part: str) -> list[int]:
    if selection is None:
        return list(range(n))
    for i in selection:
        if not 0 <= i < n:
            raise OutOfRangeError(f"{what} {i} is out of range: this model has {what}s 0..{n - 1} ({part})")
    return sorted(set(selection))


def _add(p: LayerPlan, edit: Edit, heads: list[int], queries: TokenSequence, keys: TokenSequence, cap, part, layer):
    if edit.kind == "scale":
        p.scale.update({h: float(edit.value or 1.0) for h in heads})
    elif edit.kind == "temperature":
        for h in heads:
            p.temperature[h] = p.temperature.get(h, 1.0) * float(edit.value or 1.0)
    elif edit.kind == "no_causal_mask":
        p.uncausal.update(heads)
    elif edit.kind == "knockout":
        q = None if edit.query is None else _tokens(edit.query, queries, "query")
        k = _tokens(edit.key, keys, "key")
        p.knock.append((tuple(heads), q, k))
    elif edit.kind == "ablate":
        p.ablate.update({(None, h): edit.how for h in heads})
    elif edit.kind in ("uniform", "patch"):
        for h in heads:
            if h in p.replace:
                raise InputError(f"two edits replace the pattern of L{layer}·H{h} ({part}); keep one")
            p.replace[h] = "uniform" if edit.kind == "uniform" else _patched(edit.source, cap, part, layer, h)


def _patched(source: Any, cap: Capture, part: str, layer: int, head: int) -> Tensor:
    same_model = source.model.get("name") == cap.model.get("name") and source.model.get("parts") == cap.model.get(
        "parts"
    )
    if not same_model:
        raise InputError(
            f"patch: the source capture is of {source.model.get('name')!r}, this text runs on "
            f"{cap.model.get('name')!r}; a pattern can only move between texts of one model"
        )
    want = tuple(len(s.tokens) for s in cap.sequences(part))
    got = tuple(len(s.tokens) for s in source.sequences(part))
    if want != got:
        raise InputError(
            f"patch: the source text has {got[0]} tokens, this one {want[0]} ({part}); a pattern moves only "
            "between texts of the same length — pad the shorter or choose a pair of equal length"
        )
    if (part, layer) not in source.records:
        raise InputError(f"patch: the source capture does not hold layer {layer} ({part}); capture it with layers=None")
    return source.attention(layer, head, part=part).float()
