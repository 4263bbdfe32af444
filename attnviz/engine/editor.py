"""The editor: computes the attention calls of chosen layers in the model's place, with edits applied.

For the length of an :func:`editing` block an :class:`Editor` is an
:class:`~attnviz.engine.listeners.Editing` listener of the model: every call of an edited layer —
caught by the AttentionInterface wrapper or, for a family that computes attention inline (GPT-Neo,
XGLM, GPT-1, Bloom, MPT, Falcon-ALiBi, DeBERTa-v2/v3), by the projection hooks — is computed by attnviz's own
:func:`~attnviz.attention.scaled_dot_product` with the layer's :class:`~attnviz.workflows.edits.LayerPlan`
applied (:func:`edited_attention`); every other call is the model's own kernel. For an inline
family the edited A·V goes to the output projection in place of the model's own (whose inline
scores are then unused; DeBERTa's relative terms enter as the bias the capture records, their value
for this input). Ablation needs no recomputation: the kernel runs and the head's output is
then zeroed (or replaced by its mean over the text), so ablating is exact whatever the backend.

Recorders active at the same time (a capture of the edited run) see the call as edited — the
editor says so in the same dispatch (:func:`attnviz.engine.listeners.dispatch`): the edited weights
travel as the call's bias (``log A`` with the scaling set to 0), so the capture's maps are exactly
the weights the edited model used, and its self-check proves it. After an ablation alone they see
the model's own A·V, before the ablation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..attention import build_mask, scaled_dot_product, weighted_values
from .listeners import Call, Seen, listening
from .taps import Recorder, attached

if TYPE_CHECKING:
    from ..workflows.edits import LayerPlan

__all__ = ["Editor", "edited_attention", "editing"]


class Editor:
    """Computes the attention calls of the layers in ``plans`` while it is active (see :func:`editing`)."""

    def __init__(self, model: nn.Module, plans: dict[tuple[str, int], LayerPlan]):
        self.reader = Recorder(model, keep_on_device=True, weight_mode="drop")  # places calls; records nothing
        self.plans = plans
        self.ran: set[tuple[str, int]] = set()

    def owns(self, module: nn.Module) -> bool:
        """Whether ``module`` is part of this editor's model."""
        return self.reader.owns(module)

    def run(self, call: Call, *, recorded: bool) -> tuple[Any, Seen | None]:
        """(what the model gets, the call as the recorders should see it, or None when not ``recorded``)."""
        read = call.terms(self.reader.dense_masks, unfold=True)
        where = self.reader.place(call.module, read["causal"], read["mask"], read.get("designed_causal"))
        p = self.plans.get(where)
        if p is None:
            result = call.own()
            return result, self.reader.as_made(call, result) if recorded else None
        self.ran.add(where)
        if not p.reweights:  # ablation only: the model's own kernel, then the heads' output changed
            result = call.own()
            out, weights = call.split(result)
            return call.join(_ablated(out, p), weights), self.reader.as_made(call, result) if recorded else None
        out, weights = edited_attention(read, p)
        model_out = (
            out.transpose(1, 2).to(call.dtype).contiguous()
        )  # [batch, query_pos, head, d_head_v], as kernels return
        returned = weights.to(call.dtype) if call.backend.endswith("eager") else None
        seen = {**_as_edited(read, weights), "out": model_out, "weights": None} if recorded else None
        return call.join(_ablated(model_out, p), returned), seen


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


def edited_attention(read: dict[str, Any], p: LayerPlan) -> tuple[Tensor, Tensor]:  # out [b,h,q,d_v], weights [b,h,q,k]
    """The edited call: attnviz's SDPA over the call's terms (``read``, as :meth:`Call.terms` gives
    them) with the plan's scaling, temperature, mask, and replaced patterns applied; (A·V, A)."""
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


def _as_edited(read: dict[str, Any], weights: Tensor) -> dict[str, Any]:
    """The edited call's terms as the recorders should see them: Q, K, V with scaling 0, ``log A`` as
    the bias and "may attend" as the mask, so that softmax(0·QKᵀ + log A) = A (with a sink, each
    row's bias shifted so the sink keeps its share)."""
    may, log_w = _log_weights(read, weights)
    return {
        **read,
        "mask": may,
        "key_padding": None,
        "bias": log_w,
        "scaling": 0.0,
        "causal": False,
        "window": None,
        "softcap": None,
        "sliding_window": None,
    }


@contextlib.contextmanager
def editing(model: nn.Module, plans: dict[tuple[str, int], LayerPlan]) -> Iterator[Editor]:
    """Within the block, the model's attention calls of the planned layers run edited (this context only).

    Nothing on the model changes; the AttentionInterface wrappers (or, for a family that computes
    attention inline, the hooks on its projections) are removed on exit, also when the block
    raises. After the block, ``editor.ran`` names the layers that were edited. Editors nest: the
    innermost one active that owns a module runs its calls. A configuration attnviz cannot read
    (Falcon with rotary embeddings, Bloom's ``slow_but_exact``) is refused with
    :class:`UnsupportedModelError`, as a capture of it is."""
    editor = Editor(model, plans)
    with attached(model), listening(editor):
        yield editor
