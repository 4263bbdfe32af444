"""What a head writes: each attention layer's output projection, read (never changed) and watched.

Head *h* adds to query *i* the vector ``Σ_j α_ij · f_h(x_j)`` with ``f_h(x_j) = W_O^h v_j`` — the
head's slice of the output projection applied to the value the query reads (Kobayashi et al.
2020). This module holds the two things the engine does for that:

- :func:`output_projection` finds an attention module's output projection from the facts in
  :data:`attnviz.engine.specs.OUTPUT_PROJECTIONS` and reads its weight as ``[hidden, head·d_v]``
  (:class:`OutputProjection`): the head slices, their Gram matrices ``W_O^hᵀ W_O^h``, the dot
  products of the ``f_h(x_j)`` a capture keeps (:meth:`OutputProjection.value_dots`), and the
  sum over heads that must give back the model's own projection output (:meth:`OutputProjection.apply`);
- :class:`ProjectionWatch` keeps a sample of query rows of each projection's *output* while a tap
  records, so the self-check can compare attnviz's reconstruction with what the model computed.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import SAMPLE_ROWS, spread_rows
from ..families import PROJECTION_SPECS
from .specs import OUTPUT_PROJECTIONS, TRANSPOSED_WEIGHTS

__all__ = [
    "OutputProjection",
    "ProjectionWatch",
    "output_projection",
    "projection_module",
    "rows_index",
    "watched_rows",
]

WATCHED_ROWS = SAMPLE_ROWS  # query rows kept of each projection call's output, besides its first and last


def watched_rows(n: int, device: torch.device | None = None) -> Tensor:  # [min(n, WATCHED_ROWS + 2)]
    """The rows of an ``n``-row projection call whose output is kept: the first, the last and
    :data:`WATCHED_ROWS` spread between them (every row of a short call, or of a generation step),
    made on ``device`` (:func:`attnviz.attention.spread_rows`: the host's list is the same rows)."""
    return spread_rows(n, WATCHED_ROWS, device)


_INDICES: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}  # the last lengths' rows, most recent last
_INDICES_KEPT = 64
_INDICES_LOCK = threading.Lock()


def rows_index(n: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """(:func:`watched_rows` of ``n`` on the host, the same rows made on ``device``), kept for the last
    :data:`_INDICES_KEPT` lengths: a capture of a length seen before launches nothing to make them."""
    key = (n, str(device))
    with _INDICES_LOCK:
        found = _INDICES.pop(key, None)
        if found is None:
            found = (watched_rows(n), watched_rows(n, torch.device(device)))
        _INDICES[key] = found
        while len(_INDICES) > _INDICES_KEPT:
            _INDICES.pop(next(iter(_INDICES)))
    return found


def projection_module(model: nn.Module, attention_name: str) -> nn.Module | None:
    """The output projection of the attention module at ``attention_name``, by the family's spec
    (``ProjectionSpec.out``) or the first path of :data:`OUTPUT_PROJECTIONS` that names a module."""
    spec = PROJECTION_SPECS.get(getattr(getattr(model, "config", None), "model_type", ""))
    for path in (spec.out,) if spec is not None else OUTPUT_PROJECTIONS:
        where = attention_name
        for step in path.split("/"):
            where = where.rpartition(".")[0] if step == ".." else f"{where}.{step}" if where else step
        try:
            found = model.get_submodule(where)
        except AttributeError:
            continue
        if isinstance(getattr(found, "weight", None), Tensor):
            return found
    return None


@dataclass
class OutputProjection:
    """One attention layer's output projection, its weight as ``[hidden, head·d_v]`` in float32."""

    weight: Tensor  # [hidden, head·d_v]
    bias: Tensor | None  # [hidden]
    n_heads: int
    d_v: int
    _grams: Tensor | None = field(default=None, repr=False)
    _row_sizes: Tensor | None = field(default=None, repr=False)
    _size_bounds: Tensor | None = field(default=None, repr=False)

    @property
    def heads(self) -> Tensor:  # [head, hidden, d_v]: W_O^h, head h's columns of the weight
        return self.weight.view(self.weight.shape[0], self.n_heads, self.d_v).transpose(0, 1)

    @property
    def grams(self) -> Tensor:  # [head, d_v, d_v]: W_O^hᵀ W_O^h, so ‖W_O^h v‖² = vᵀ G_h v
        if self._grams is None:
            heads = self.heads
            self._grams = heads.transpose(-2, -1) @ heads
        return self._grams

    @staticmethod
    def per_head(v: Tensor, n_heads: int) -> Tensor:  # [kv_head, n, d_v] -> [head, n, d_v]
        """The value each query head reads: GQA groups consecutive query heads on one kv head."""
        groups = n_heads // v.shape[0]
        return v if groups == 1 else v.repeat_interleave(groups, dim=0)

    def value_dots(self, v: Tensor, width: int) -> Tensor:  # [head, key, width]
        """``[h, j, t] = f_h(x_j) · f_h(x_{j-t})`` for ``t < width`` (0 where ``j - t < 0``), with
        ``f_h(x_j) = W_O^h v_j``: ``[..., 0]`` is ``‖f_h(x_j)‖²``, the rest what a word of up to
        ``width`` tokens needs for the norm of its tokens' summed vectors."""
        vh = self.per_head(v.float(), self.n_heads)
        moved = vh @ self.grams.to(vh.device)  # [head, n, d_v]: G_h v_j
        if width <= 1:
            return moved.mul_(vh).sum(-1, keepdim=True).clamp_min_(0)
        n = vh.shape[1]
        dots = vh.new_zeros(self.n_heads, n, width)
        for t in range(1, min(width, n)):
            dots[:, t:, t] = torch.linalg.vecdot(moved[:, t:], vh[:, :-t])
        dots[..., 0] = moved.mul_(vh).sum(-1).clamp_min_(0)  # last: in place over G_h v_j
        return dots

    def apply(self, per_head: Tensor) -> Tensor:  # [head, rows, d_v] -> [rows, hidden], float32
        """``Σ_h W_O^h o_h + b``: what the projection outputs for the heads' outputs ``o_h`` (each
        ``Σ_j α_ij v_j`` with the value its head reads), through the same head slices (:attr:`heads`)
        the value norms are made of — so the self-check proves those."""
        out = torch.einsum("hrd,hed->re", per_head.float(), self.heads.to(per_head.device))
        return out if self.bias is None else out + self.bias.to(out.device)

    @property
    def row_sizes(self) -> Tensor:  # [hidden]: Σ_k |W[e, k]|
        if self._row_sizes is None:
            self._row_sizes = self.weight.abs().sum(-1)
        return self._row_sizes

    @property
    def size_bounds(self) -> Tensor:  # [2]: max_e Σ_k |W[e, k]|, max |b|
        """What :meth:`magnitude` multiplies and adds, as one tensor where the weight is (made once)."""
        if self._size_bounds is None:
            bias = self.weight.new_zeros(()) if self.bias is None else self.bias.abs().max().to(self.weight.device)
            self._size_bounds = torch.stack([self.row_sizes.max(), bias])
        return self._size_bounds

    def magnitude(self, per_head: Tensor) -> float:
        """A bound on the size of the terms any output entry sums, ``max_e Σ_k |W[e, k]| · max |o| +
        max |b|``: what a float dot product's error is proportional to, so the tolerance scales with it."""
        bias = 0.0 if self.bias is None else float(self.bias.abs().max())
        return float(self.row_sizes.max()) * float(per_head.abs().max()) + bias


#: per output projection module: (its weight's data pointer and version, what was derived from it) —
#: a model's Gram matrices are computed once, not per capture
_DERIVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def output_projection(model: nn.Module, attention_name: str, n_heads: int, d_v: int) -> OutputProjection | None:
    """The output projection of the attention module at ``attention_name`` as an
    :class:`OutputProjection`, or None when there is none whose input is ``n_heads × d_v`` wide.

    A module accelerate offloads (its weights on the meta device between its own forwards) is
    loaded for a copy of its weights; None when they cannot be read."""
    module = projection_module(model, attention_name)
    if module is None:
        return None
    if not hasattr(module, "_hf_hook"):
        return _read(module, n_heads, d_v, copy=False)
    from accelerate.utils import align_module_device  # deferred: accelerate is optional (attnviz[stats])

    # loaded outside inference mode, so that the copies are ordinary tensors
    with torch.inference_mode(False), align_module_device(module):
        found = _read(module, n_heads, d_v, copy=True)
    return None if found is None or found.weight.is_meta else found


def _read(module: nn.Module, n_heads: int, d_v: int, *, copy: bool) -> OutputProjection | None:
    weight: Tensor = module.weight.detach()  # type: ignore[operator]
    if type(module).__name__ in TRANSPOSED_WEIGHTS:
        weight = weight.t()
    if weight.dim() != 2 or weight.shape[1] != n_heads * d_v:
        return None
    bias = getattr(module, "bias", None)
    bias = bias.detach().float() if isinstance(bias, Tensor) else None
    if copy:  # weights that live only for this block (offloaded): nothing derived from them is kept
        return OutputProjection(weight.float().clone(), None if bias is None else bias.clone(), n_heads, d_v)
    try:
        key = (weight.data_ptr(), module.weight._version, n_heads, d_v)
    except RuntimeError:  # an inference tensor has no version counter: nothing is kept for it
        return OutputProjection(weight.float(), bias, n_heads, d_v)
    cached = _DERIVED.get(module)
    if cached is not None and cached[0] == key:
        return cached[1]
    found = OutputProjection(weight.float(), bias, n_heads, d_v)
    _DERIVED[module] = (key, found)
    return found


@dataclass
class ProjectionWatch:
    """A sample of query rows of each output projection's output while a tap records: per attention
    module name and layer, ``(positions [r], output [batch, r, hidden])`` per call, positions counted
    over that module's calls at that layer in this tap (a generation's steps follow its prompt; a
    module shared by several layers, ALBERT's, starts again at each layer)."""

    seen: dict[tuple[str, int], list[tuple[Tensor, Tensor]]] = field(default_factory=dict)
    handles: dict[int, Any] = field(default_factory=dict)  # id(projection) -> its hook's handle
    rows_before: dict[tuple[str, int], int] = field(default_factory=dict)
    # id(projection) -> the attention module (name, layer) it answers for next
    armed: dict[int, tuple[str, int]] = field(default_factory=dict)
    found: dict[str, nn.Module | None] = field(default_factory=dict)  # attention module name -> its projection

    @staticmethod
    def index(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """(the rows kept of an ``n``-row call on the host, the same on ``device``): :func:`rows_index`."""
        return rows_index(n, device)

    def arm(self, model: nn.Module, name: str, layer: int, listening: Any) -> None:
        """Keep the rows of the next output of the projection of the attention module at ``name``
        (hooked on first use), as ``layer``'s, when heard in a context where ``listening()`` is true."""
        if name not in self.found:
            self.found[name] = projection_module(model, name)
        projection = self.found[name]
        if projection is None:
            return
        key = id(projection)
        self.armed[key] = (name, layer)
        if key in self.handles:
            return

        @torch.compiler.disable  # read as written under torch.compile, as the attention calls are (listeners.dispatch)
        def keep(_module, _args, output):
            which = self.armed.pop(key, None)
            if which is None or not isinstance(output, Tensor) or not listening():
                return
            n = output.shape[-2]
            rows, on_device = self.index(n, output.device)
            start = self.rows_before.get(which, 0)
            self.rows_before[which] = start + n
            # a copy of its own (a static cache's step writes the same buffer again); moved to the host after the forward
            kept = output.detach().index_select(-2, on_device)
            self.seen.setdefault(which, []).append((rows + start, kept))

        self.handles[key] = projection.register_forward_hook(keep)

    def to_host(self, copies: Any) -> None:
        """Every kept row copied to the host by ``copies`` (an :class:`~attnviz.engine.transfer.HostCopies`)."""
        for calls in self.seen.values():
            calls[:] = [(positions, copies.copy(kept)) for positions, kept in calls]

    def remove(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        self.handles.clear()

    def rows(self, name: str, layer: int) -> tuple[Tensor, Tensor] | None:  # (positions [r], output [batch, r, hidden])
        """Every kept row of the projection of the module at ``name`` at ``layer``, in order, or None."""
        calls = self.seen.get((name, layer))
        if not calls:
            return None
        if len(calls) == 1:  # one forward's call
            return calls[0]
        return torch.cat([p for p, _ in calls]), torch.cat([o for _, o in calls], dim=-2)
