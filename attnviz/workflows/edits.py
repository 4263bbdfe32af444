"""Counterfactual attention: edits that change what chosen heads do while the model runs.

An edit names what to change and where (layers, heads, part); :func:`attnviz.workflows.intervene` runs the
model with it and reports what the model then predicts. The seeds' toggles act on the model
(:func:`no_scaling`, :func:`scale`, :func:`temperature`, :func:`no_causal_mask`), attention between
tokens can be blocked (:func:`knockout`), a head's output removed (:func:`ablate`), its pattern made
uniform (:func:`uniform`) or taken from another text (:func:`patch`). Edits compose, applied in this
order: scaling, temperature, mask (causal, knockouts), softmax, replaced patterns, A·V, ablation.

How it runs: for the duration of a forward an :class:`Editor` sits in the same AttentionInterface
slot as the taps. A call of an edited layer is computed by attnviz's own
:func:`~attnviz.attention.scaled_dot_product` with the edit applied — every other call is the
model's own kernel. Ablation needs no recomputation: the kernel runs and the head's output is then
zeroed (or replaced by its mean over the text), so ablating is exact whatever the backend.
Recorders active at the same time (a capture of the edited run) see the call as edited: the
edited weights travel as the call's bias (``log A`` with the scaling set to 0), so the capture's
maps are exactly the weights the edited model used, and its self-check proves it.

Families that compute attention inline (GPT-Neo, XGLM, GPT-1, Bloom, MPT, Falcon-ALiBi; see
:data:`attnviz.engine.specs.PROJECTION_SPECS`) have no kernel call to take over. There the editor uses the
capture's projection hooks (:func:`attnviz.engine.hooks.projection_hooks`): in an edited layer, a
pre-hook on the output projection rebuilds the call's Q, K, V, ALiBi bias and mask, computes the
edited A·V with the same SDPA, and hands it to the output projection in place of the model's own
(whose inline scores are then unused); ablation changes the heads' slice of the model's own A·V.
Every edit works there, the causal switch included, and the recorders see the edited call as above.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..attention import build_mask, scaled_dot_product, weighted_values
from ..engine.hooks import projection_hooks
from ..engine.interface import _ACTIVE, _EDITORS, wrapped
from ..engine.specs import PROJECTION_SPECS
from ..engine.taps import Recorder
from ..errors import ArgumentTypeError, InputError, OutOfRangeError

if TYPE_CHECKING:
    from ..data.capture import Capture
    from ..data.words import TokenSequence

__all__ = [
    "Edit",
    "Editor",
    "LayerPlan",
    "ablate",
    "editing",
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
            what = f"pattern from «{_short(getattr(self.source, 'text', ''))}»"
        else:
            what = self.kind.replace("_", " ") + (" attention" if self.kind == "uniform" else "")
        return f"{what} at {where}"


def _short(text: str, n: int = 24) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


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
    from ..data.capture import Capture

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


# ---------------------------------------------------------------- running them
class Editor:
    """Replaces the attention calls of the layers in ``plans`` while it is active (see :func:`editing`)."""

    def __init__(self, model: nn.Module, plans: dict[tuple[str, int], LayerPlan]):
        self.reader = Recorder(model, to_cpu=False, weight_mode="drop")
        self.plans = plans
        self.ran: set[tuple[str, int]] = set()
        # the inline call just edited, for the recorders' hooks that run next: (module id, call or None, A·V)
        self._seen: tuple[int, dict[str, Any] | None, Tensor] | None = None

    def owns(self, module: nn.Module) -> bool:
        return self.reader.owns(module)

    def runs(self, module: nn.Module) -> bool:
        """Whether this editor is active in the calling context and the innermost one owning ``module``."""
        return next((e for e in reversed(_EDITORS.get()) if e.owns(module)), None) is self

    def inline(self, module: nn.Module, read: dict[str, Any], out: Tensor) -> Tensor | None:
        """One call of an inline attention module (projection hooks): the output projection's input
        for the edited call ([batch, pos, head·d_v], ``out``'s dtype), or None for the model's own."""
        where = self.reader.place(module, read["causal"], read["mask"], read["designed_causal"])
        p = self.plans.get(where)
        if p is None:
            return None
        self.ran.add(where)
        b, n, width = out.shape
        heads = read["q"].shape[1]
        recorded = any(r.owns(module) for r in _ACTIVE.get())  # a capture of the edited run wants the call
        self._seen = None
        if not p.reweights:  # ablation only: the model's own A·V, the heads' slices changed
            if recorded:  # the recorders see the call as the model made it, before the ablation
                self._seen = (id(module), None, out)
            return _ablated(out.view(b, n, heads, -1), p).reshape(b, n, width)
        attended, weights = _edited_attention(read, p)
        model_out = attended.transpose(1, 2).to(out.dtype)  # [batch, query_pos, head, d_head_v]
        if recorded:
            self._seen = (id(module), _as_inline_call(read, weights), model_out.reshape(b, n, width))
        return _ablated(model_out, p).reshape(b, n, width)

    def seen(self, module: nn.Module) -> tuple[dict[str, Any] | None, Tensor] | None:
        """How the recorders should see the call of the inline ``module`` they are recording, when this
        editor changed it: (the call as :func:`attnviz.engine.hooks.projection_read` gives it — None: as
        the recorder read it itself —, the A·V before ablation), or None. The editor's pre-hook on
        the output projection runs first (prepended), so the recorders' hooks that run next on the
        same call find it here."""
        if self._seen is None or self._seen[0] != id(module):
            return None
        return self._seen[1], self._seen[2]

    def call(self, backend: str, module: nn.Module, fn: Callable, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
        """(what the model gets, (args, kwargs, result) as the recorders should see the call)."""
        read = self.reader.read(backend, module, args, kwargs)
        where = self.reader.place(module, read["causal"], read["mask"])
        p = self.plans.get(where)
        if p is None:
            result = fn(module, *args, **kwargs)
            return result, (args, kwargs, result)
        self.ran.add(where)
        if not p.reweights:  # ablation only: the model's own kernel, then the heads' output changed
            result = fn(module, *args, **kwargs)
            out, weights = result if isinstance(result, tuple) else (result, None)
            return (_ablated(out, p), weights), (args, kwargs, result)
        out, weights = _edited_attention(read, p)
        dtype = read["v"].dtype
        model_out = out.transpose(1, 2).to(dtype).contiguous()  # [batch, query_pos, head, d_head_v], as kernels return
        returned = weights.to(dtype) if backend.endswith("eager") else None
        seen_args, seen_kwargs = _as_call(read, weights)
        return (_ablated(model_out, p), returned), (seen_args, seen_kwargs, (model_out, None))


def _dense_allowed(read: dict[str, Any]) -> tuple[Tensor, Tensor | None]:
    """([batch|1, 1|head, query, key] bool "may attend", additive rest of a float mask or None)."""
    q, k = read["q"], read["k"]
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = build_mask(
        n_q, n_k, causal=read["causal"], window=read["window"], key_padding=read["key_padding"], device=q.device
    )
    if allowed is None:
        allowed = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=q.device)
    rest = None
    mask = read["mask"]
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            blocked = mask <= torch.finfo(mask.dtype).min / 2
            allowed = allowed & ~blocked
            extra = mask.masked_fill(blocked, 0)
            if bool(extra.any()):
                rest = extra.float()
    return allowed, rest


def _edited_attention(
    read: dict[str, Any], p: LayerPlan
) -> tuple[Tensor, Tensor]:  # out [b,h,q,d_v], weights [b,h,q,k]
    q, k, v = read["q"], read["k"], read["v"]
    n_head, n_q, n_k = q.shape[1], q.shape[-2], k.shape[-2]
    allowed, rest = _dense_allowed(read)
    if p.uncausal or p.knock:
        allowed = allowed.expand(allowed.shape[0], n_head, n_q, n_k).clone()
        if p.uncausal:  # the keys after each query, where they are real tokens
            i = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
            later = (torch.arange(n_k, device=q.device)[None, :] > i)[None, None]
            if read["key_padding"] is not None:
                later = later & read["key_padding"].bool()[:, None, None, :]
            allowed[:, sorted(p.uncausal)] |= later
        for knocked, queries, keys in p.knock:
            rows = slice(None) if queries is None else torch.tensor(queries, device=q.device)[:, None]
            for h in knocked:
                allowed[:, h][(slice(None), rows, torch.tensor(keys, device=q.device))] = False
    scale_by: float | Tensor = read["scaling"]
    if p.scale:
        scale_by = torch.full((n_head,), float(read["scaling"]))
        for h, x in p.scale.items():
            scale_by[h] = x
    temp: float | Tensor = 1.0
    if p.temperature:
        temp = torch.ones(n_head)
        for h, t in p.temperature.items():
            temp[h] = t
    bias = read["bias"]
    if rest is not None:
        bias = rest if bias is None else bias.float() + rest
    _, weights = scaled_dot_product(
        q, k, v, scale=scale_by, mask=allowed, bias=bias, sinks=read["sinks"], softcap=read["softcap"], temperature=temp
    )
    for h, how in p.replace.items():
        if isinstance(how, str):  # uniform over what each query may see
            may = allowed[:, 0 if allowed.shape[1] == 1 else h].float().expand(weights.shape[0], n_q, n_k)
            weights[:, h] = may / may.sum(-1, keepdim=True).clamp_min(1)
        else:
            weights[:, h] = how.to(weights.device)
    return weighted_values(weights, v), weights


def _ablated(out: Tensor, p: LayerPlan) -> Tensor:  # out [batch, query_pos, head, d_v]
    if not p.ablate:
        return out
    out = out.clone()
    for (item, head), how in p.ablate.items():
        rows = slice(None) if item is None else slice(item, item + 1)
        if how == "zero":
            out[rows, :, head] = 0
        else:
            out[rows, :, head] = out[rows, :, head].mean(dim=1, keepdim=True)
    return out


def _log_weights(read: dict[str, Any], weights: Tensor) -> tuple[Tensor, Tensor]:
    """("may attend", a bias B with softmax(B) = A on it): ``log A`` (with a sink, each row shifted so
    the sink keeps its share)."""
    may = weights > 0
    log_w = torch.where(may, weights.clamp_min(torch.finfo(weights.dtype).tiny).log(), torch.zeros_like(weights))
    sinks = read["sinks"]
    if sinks is not None:
        share = (1 - weights.sum(-1, keepdim=True)).clamp_min(torch.finfo(weights.dtype).tiny)
        log_w = log_w + sinks.float().view(1, -1, 1, 1) - share.log()
    return may, log_w


def _as_call(read: dict[str, Any], weights: Tensor) -> tuple[tuple, dict]:
    """The edited call as the recorders should see it: Q, K, V with scaling 0 and ``log A`` as the bias,
    so that softmax(0·QKᵀ + log A) = A (with a sink, each row's bias shifted so the sink keeps its share)."""
    may, log_w = _log_weights(read, weights)
    kwargs: dict[str, Any] = {"scaling": 0.0, "is_causal": False, "position_bias": log_w}
    if read["sinks"] is not None:
        kwargs["s_aux"] = read["sinks"]
    return (read["q"], read["k"], read["v"], may), kwargs


def _as_inline_call(read: dict[str, Any], weights: Tensor) -> dict[str, Any]:
    """:func:`_as_call` for an inline module: the call as :func:`attnviz.engine.hooks.projection_read` gives
    it, with scaling 0, ``log A`` as the bias and "may attend" as the mask."""
    may, log_w = _log_weights(read, weights)
    return {**read, "mask": may, "bias": log_w, "scaling": 0.0, "causal": False, "window": None}


@contextlib.contextmanager
def _in_place_of_attention(model: nn.Module, editor: Editor) -> Iterator[None]:
    """The editor where the model computes attention: the AttentionInterface slot, or, for a family
    that computes it inline, the output projections (through the capture's projection hooks)."""
    spec = PROJECTION_SPECS.get(getattr(getattr(model, "config", None), "model_type", ""))
    if spec is None:
        with wrapped(model):
            yield
        return
    with projection_hooks(model, spec, editor.inline, active=editor.runs, first=True, unfold_mask=True):
        yield


@contextlib.contextmanager
def editing(model: nn.Module, plans: dict[tuple[str, int], LayerPlan]) -> Iterator[Editor]:
    """Within the block, the model's attention calls of the planned layers run edited (this context only).

    Nothing on the model changes; the AttentionInterface wrappers (or, for a family that computes
    attention inline, the hooks on its projections) are removed on exit, also when the block
    raises. After the block, ``editor.ran`` names the layers that were edited. A configuration the
    projection hooks cannot read (Falcon with rotary embeddings, Bloom's ``slow_but_exact``) is
    refused with :class:`UnsupportedModelError`, as a capture of it is."""
    editor = Editor(model, plans)
    token = _EDITORS.set(_EDITORS.get() + (editor,))
    try:
        with _in_place_of_attention(model, editor):
            yield editor
    finally:
        _EDITORS.reset(token)
        editor._seen = None
