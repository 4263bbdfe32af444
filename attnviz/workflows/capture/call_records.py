"""How the calls a tap recorded become the :class:`~attnviz.data.records.LayerRecord` s of one Capture.

Each text of a padded batch gets its own rows (in storage of its own), the mask the kernel applied
described as a causal flag and a sliding window (kept whole only when it is neither), and T5's
relative bias kept as one row per head.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...attention import build_mask
from ...data.records import LayerRecord
from ...engine.taps import AttentionCall

__all__ = ["build_records"]


def _describe_mask(
    call: AttentionCall, mask: Tensor | None, n_q: int, n_k: int
) -> tuple[bool, int | None, Tensor | None]:
    """(causal, window, custom mask or None) for one item's mask cut to its ``n_q × n_k`` tokens.
    Without a mask nothing is built: the causal flag and the window say it all."""
    if mask is None:
        return call.causal and n_q > 1, call.window, None
    structure = build_mask(n_q, n_k, causal=call.causal, window=call.window, device=mask.device)
    if mask.is_floating_point():
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if bool((mask.masked_fill(blocked, 0) != 0).any()):  # carries a bias (ALiBi folded into the mask)
            kept = mask if structure is None else mask.masked_fill(~structure[0], float("-inf"))
            return False, None, kept.clone()
        allowed = ~blocked
    else:
        allowed = mask.bool()
    allowed = allowed.expand(-1, n_q, n_k)
    if structure is not None:
        allowed = allowed & structure[0]
    if allowed.shape[0] > 1 and bool((allowed == allowed[:1]).all()):
        allowed = allowed[:1]
    if allowed.shape[0] == 1:
        flat = allowed[0]
        for causal in (True, False):
            window = call.window if causal else None
            candidate = build_mask(n_q, n_k, causal=causal, window=window, device=flat.device)
            if (candidate is None and bool(flat.all())) or (
                candidate is not None and torch.equal(candidate[0, 0], flat)
            ):
                return causal and n_q > 1, window, None
        if window_size := _fits_window(flat):
            return True, window_size, None
        return False, None, flat.clone()
    return False, None, allowed.clone()


def _fits_window(allowed: Tensor) -> int | None:
    """The sliding window a causal mask implements, if it is one."""
    n_q, n_k = allowed.shape
    w = int(allowed.sum(-1).max())
    structure = build_mask(n_q, n_k, causal=True, window=w, device=allowed.device)
    return w if structure is not None and torch.equal(structure[0, 0], allowed) else None


def _compact_bias(bias: Tensor) -> tuple[Tensor | None, Tensor | None]:  # (dense, relative)
    """A bias that depends only on ``key - query`` (T5's buckets) is kept as one row per head."""
    heads, n_q, n_k = bias.shape
    if n_q == 1 or heads == 0:
        return bias.clone(), None
    relative = torch.cat([bias[:, :, 0].flip(-1), bias[:, 0, 1:]], dim=-1)  # offsets -(n_q-1) .. n_k-1
    index = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None] + n_q - 1
    if torch.equal(relative[:, index.to(relative.device)], bias):
        return None, relative.clone()
    return bias.clone(), None


def _owned(t: Tensor, batched: bool = True) -> Tensor:
    """A tensor with storage of its own (a cut of a batch must not keep the batch alive). A batch of
    one is its own: its views (GPT-2's q/k/v of one fused projection) stay views, copied never."""
    if not batched:
        return t
    if not t.is_contiguous():
        return t.contiguous()  # a new storage of its own size
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def _same(t: Tensor | None) -> tuple | None:
    """What makes two recorded tensors the same one (the recorder hands out new views of it)."""
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


def build_records(
    calls: list[AttentionCall], b: int, lengths: dict[str, tuple[int, int]], batched: bool
) -> dict[tuple[str, int], LayerRecord]:
    masks: dict = {}
    biases: dict = {}
    records = {}
    for call in calls:
        if call.q is None:
            continue
        n_q, n_k = lengths[call.part]
        item = call.item(b)
        mask = item["mask"]
        key = (_same(call.mask), _same(call.key_padding), b, call.causal, call.window, n_q, n_k)
        if key not in masks:
            cut = None if mask is None else mask[..., : n_q if mask.shape[-2] > 1 else 1, :n_k]
            masks[key] = _describe_mask(call, cut, n_q, n_k)
        causal, window, custom = masks[key]
        bias = relative = None
        if item["bias"] is not None:
            bkey = (_same(call.bias), b, n_q, n_k)
            if bkey not in biases:
                raw = item["bias"][..., : n_q if item["bias"].shape[-2] > 1 else 1, :n_k]
                biases[bkey] = _compact_bias(raw) if raw.shape[-2] > 1 else (raw.clone(), None)
            bias, relative = biases[bkey]
        weights = None if call.weights is None else _owned(call.weights[b, :, :n_q, :n_k], batched)
        records[(call.part, call.layer)] = LayerRecord(
            name=call.name,
            q=_owned(item["q"][:, :n_q], batched),
            k=_owned(item["k"][:, :n_k], batched),
            v=_owned(item["v"][:, :n_k], batched),
            out=_owned(item["out"][:, :n_q], batched),
            weights=weights,
            scaling=call.scaling,
            causal=causal,
            window=window,
            softcap=call.softcap,
            mask=custom,
            bias=bias,
            relative_bias=relative,
            sinks=None if call.sinks is None else call.sinks.float().clone(),
            weight_error=None if call.weight_error is None else call.weight_error[b].clone(),
            sampled_weights=None if call.sampled_weights is None else call.sampled_weights[b][..., :n_k],
            weight_scale=None if call.weight_scale is None else call.weight_scale[b].clone(),
        )
    return records
