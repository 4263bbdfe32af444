"""What one attention layer's kernel saw (:class:`LayerRecord`), and how recorded calls become the
records of one Capture.

Each text of a padded batch gets its own rows (in storage of its own), the mask the kernel applied
described as a causal flag and a sliding window (kept whole only when it is neither), T5's
relative bias kept as one row per head, and the checks that refuse an incomplete or mislabelled
picture (a module that ran twice, an encoder-decoder part that bypassed the taps).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..attention import attention_output, build_mask
from ..engine.specs import PARTS, supported_families
from ..engine.taps import AttentionCall
from ..errors import UnsupportedModelError

__all__ = ["LayerRecord", "build_records", "check_calls", "part_sizes"]


def _describe_mask(
    call: AttentionCall, mask: Tensor | None, n_q: int, n_k: int
) -> tuple[bool, int | None, Tensor | None]:
    """(causal, window, custom mask or None) for one item's mask cut to its ``n_q × n_k`` tokens."""
    structure = build_mask(
        n_q, n_k, causal=call.causal, window=call.window, device=None if mask is None else mask.device
    )
    if mask is None:
        return call.causal and n_q > 1, call.window, None
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


@dataclass
class LayerRecord:
    """What one attention layer's kernel saw and produced, for one input."""

    name: str  # the module's name in the model, e.g. "model.layers.3.self_attn"
    q: Tensor  # [head, query_pos, d_head], after RoPE
    k: Tensor  # [kv_head, key_pos, d_head], after RoPE, before GQA expansion
    v: Tensor  # [kv_head, key_pos, d_head_v]
    out: Tensor | None  # [head, query_pos, d_head_v], the model's own attention output (A·V)
    weights: Tensor | None  # [head, query_pos, key_pos], the model's own weights (eager, keep_weights=True)
    scaling: float  # the factor on Q·Kᵀ the model used
    causal: bool
    window: int | None = None  # sliding window, when the model used one
    softcap: float | None = None
    mask: Tensor | None = (
        None  # [query_pos, key_pos] or [head, q, k]: bool / additive, only when causal+window do not describe it
    )
    bias: Tensor | None = None  # [head or 1, query_pos or 1, key_pos] added to the scores (ALiBi, position bias)
    relative_bias: Tensor | None = (
        None  # [head, query_pos + key_pos - 1]: bias[h, i, j] = relative_bias[h, j - i + query_pos - 1]
    )
    sinks: Tensor | None = None  # [head] learned sink logits: one more entry in each row's softmax
    weight_error: Tensor | None = None  # [head] max |recomputed - model's weights|, measured while capturing
    weight_scale: Tensor | None = None  # [head] max |model's weights|

    @property
    def n_queries(self) -> int:
        return self.q.shape[-2]

    @property
    def n_keys(self) -> int:
        return self.k.shape[-2]

    def bias_part(self, rows: Tensor | None = None, keys: slice = slice(None)) -> Tensor | None:  # [head or 1, r, k]
        """The additive score bias for these query rows and keys (dense), or None."""
        if self.relative_bias is not None:
            n_q = self.n_queries
            i = torch.arange(n_q) if rows is None else rows.cpu()
            j = torch.arange(self.n_keys)[keys]
            index = (j[None, :] - i[:, None] + n_q - 1).to(self.relative_bias.device)
            return self.relative_bias[:, index]
        if self.bias is None:
            return None
        b = (
            self.bias
            if rows is None or self.bias.shape[-2] == 1
            else self.bias.index_select(-2, rows.to(self.bias.device))
        )
        return b[..., keys]

    def sdpa_arguments(self) -> dict:
        """The keyword arguments of :func:`attnviz.attention.attention_output` that recompute this
        layer as the model computed it (scaling, mask, window, bias, sinks, soft-cap)."""
        return dict(
            scale=self.scaling,
            causal=self.causal,
            window=self.window,
            mask=self.mask_part if self.mask is not None else None,
            bias=self.bias_part if self.bias is not None or self.relative_bias is not None else None,
            sinks=self.sinks,
            softcap=self.softcap,
        )

    def weight_chunks(self) -> Iterator[tuple[Tensor, slice, Tensor]]:  # rows [r], keys, weights [head, r, keys]
        """This layer's weights a chunk of query rows at a time, as the model computed them: no head's
        n×n map exists whole, no A·V is computed (values of width 0), and under a causal mask a chunk
        holds only the keys its rows may see (every other key's weight is 0)."""
        for rows, keys, _, weights in attention_output(self.q, self.k, self.v[..., :0], **self.sdpa_arguments()):
            yield rows, keys, weights

    def mask_part(self, rows: Tensor | None = None, keys: slice = slice(None)) -> Tensor | None:  # [head or 1, r, k]
        if self.mask is None:
            return None
        m = self.mask if self.mask.dim() == 3 else self.mask[None]
        m = m if rows is None else m.index_select(-2, rows.to(m.device))
        return m[..., keys]


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
            weight_scale=None if call.weight_scale is None else call.weight_scale[b].clone(),
        )
    return records


def check_calls(model: nn.Module, calls: list[AttentionCall], encoder_decoder: bool) -> None:
    """Refuse what would show an incomplete or mislabelled picture."""
    family = f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
    if not calls:
        raise UnsupportedModelError(
            f"{family} ran no attention that attnviz could tap (backend "
            f"{getattr(model.config, '_attn_implementation', None)!r}), so nothing was captured. "
            f"attnviz supports {supported_families()}. GPT-2 with reorder_and_upcast_attn under "
            "eager bypasses the interface: load with attn_implementation='sdpa'."
        )
    seen: dict[tuple[str, int], str] = {}
    for call in calls:
        key = (call.part, call.layer)
        if key in seen:
            what = "ran its attention twice" if seen[key] == call.name else f"and {seen[key]} both sit at"
            raise UnsupportedModelError(
                f"{family}: {call.name} {what} {call.part} layer {call.layer} in one forward (shared or "
                "nested attention modules, as ALBERT has); attnviz keys each layer by the module that ran it "
                "and will not guess which is which"
            )
        seen[key] = call.name
    if encoder_decoder:
        missing = [p for p in PARTS if p not in {c.part for c in calls}]
        if missing:
            raise UnsupportedModelError(
                f"{family}: the {' and '.join(missing)} attention did not go through transformers' "
                "AttentionInterface, so a capture would show only part of the model"
            )


def part_sizes(calls: list[AttentionCall]) -> dict[str, dict[str, int]]:
    parts: dict[str, dict[str, int]] = {}
    for part in PARTS:
        mine = [c for c in calls if c.part == part]
        if mine:
            parts[part] = {"n_layers": max(c.layer for c in mine) + 1, **mine[0].sizes}
    return parts
