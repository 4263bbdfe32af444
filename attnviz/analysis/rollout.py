"""Attention rollout (Abnar & Zuidema 2020).

Per layer, average the heads, mix in the identity for the residual connection
(``Â = r·I + (1 - r)·A``, rows renormalised), and multiply through the layers:
``R_l = Â_l · R_{l-1}``. Row i of ``R_L`` estimates how much of token i's final representation
flows, through attention alone, from each input token.

What it is not: an attribution of the model's prediction. It ignores the MLPs, the values' norms
and the output projection, assumes every head matters equally, and for decoders it piles mass on
early tokens because they are visible to every later one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..deprecation import renamed
from ..errors import InputError

if TYPE_CHECKING:
    from ..data.capture import Capture

__all__ = [
    "FUSIONS",
    "ROLLOUT_CELLS",
    "RolloutStep",
    "block_means",
    "check_residual",
    "missing_layers",
    "rollout",
    "rollout_blocks",
    "rollout_rows",
]


ROLLOUT_CELLS = 512  # a rollout heatmap's cells per side at most (the rollout figure's and summarize's bound)


def missing_layers(cap: Capture) -> str | None:
    """Why rollout cannot run on this one-part capture (a layer or a head is not captured), or None."""
    layers = cap.layer_indices()
    if layers != list(range(cap.n_layers)):
        return f"rollout needs every layer; this capture has {layers} of {cap.n_layers}: capture with layers=None"
    kept = cap.kept_heads()
    if kept != list(range(cap.n_heads)):  # a fusion of some heads is not the layer's flow
        return (
            f"rollout fuses every head of a layer; this capture kept heads {', '.join(map(str, kept))} of "
            f"{cap.n_heads}: capture with heads=None"
        )
    return None


def check_residual(residual: float) -> None:
    if not 0.0 <= residual <= 1.0:
        raise InputError(f"residual must be in [0, 1], got {residual}")


FUSIONS = {"mean": lambda a: a.mean(0), "max": lambda a: a.max(0).values, "min": lambda a: a.min(0).values}


def _checked(cap: Capture, residual: float, head_fusion: str, part: str | None):
    cap = cap.select(part)
    missing = missing_layers(cap)
    if missing is not None:
        raise InputError(missing)
    check_residual(residual)
    if head_fusion not in FUSIONS:
        raise InputError(f"head_fusion must be one of {', '.join(FUSIONS)}, got {head_fusion!r}")
    return cap, cap.layer_indices(), FUSIONS[head_fusion]


def _mixed(cap: Capture, layer: int, fuse, residual: float) -> Tensor:  # Â = r·I + (1 - r)·A, rows renormalised
    a = _fused(cap, layer, fuse)
    a = (1 - residual) * a
    a.diagonal().add_(residual)
    return a / a.sum(-1, keepdim=True)


class RolloutStep:
    """A consumer of one layer's weight chunks (``rows, keys, weights [head, r, keys]``) that takes
    rollout's product one layer further to the left: given ``result`` ``[m, n]`` (rows already
    multiplied through the later layers), :attr:`result` becomes ``result · Â`` with
    ``Â = r·I + (1 - r)·fuse_heads(A)``, rows renormalised — each chunk adding
    ``result[:, rows] · Â[rows, keys]`` to the new product's ``keys`` columns, so Â never exists whole.
    A chunk must hold every key its rows may see (the others have weight 0): a row's sum is taken
    within its chunk. Chunks may come in any order."""

    def __init__(self, result: Tensor, *, residual: float = 0.5, fuse=FUSIONS["mean"]) -> None:
        self.previous = result  # [m, n] float32
        self.result = torch.zeros_like(result)
        self.residual = residual
        self.fuse = fuse

    def add(self, rows: Tensor, keys: slice, weights: Tensor, out: Tensor | None = None) -> None:
        rows = rows.cpu()
        a = (1 - self.residual) * self.fuse(weights.float().cpu())  # [r, keys]
        lo = keys.start
        inside = (rows >= lo) & (rows < keys.stop)  # the rows' own key (the diagonal) in this chunk
        a[torch.nonzero(inside).flatten(), rows[inside] - lo] += self.residual
        a = a / a.sum(-1, keepdim=True)
        first = int(rows[0])  # a chunk's rows are consecutive
        previous = self.previous[:, first : first + len(rows)]  # [m, r]
        # only the result's rows that reach these tokens: under a causal mask the earlier cells' are
        # exactly 0 (a product of lower-triangular maps), so about half of the product is skipped
        reached = previous.any(1).nonzero().flatten()
        if len(reached):
            lo, hi = int(reached[0]), int(reached[-1]) + 1
            self.result[lo:hi, keys] += previous[lo:hi] @ a


def rollout(
    cap: Capture,
    *,
    residual: float = 0.5,
    head_fusion: str = "mean",
    part: str | None = None,
) -> Tensor:  # [layer, query_pos, key_pos]
    """Cumulative rollout after each captured layer (all layers must be captured).

    ``head_fusion``: ``"mean"`` (the paper's), ``"max"`` or ``"min"`` over heads. ``part`` picks the
    encoder or the decoder of an encoder-decoder capture (its self-attention only). It costs
    layers·n³ and holds layers·n² floats: for long texts, :func:`rollout_rows` and
    :func:`rollout_blocks` give the final layer's rows or block means for layers·m·n².
    """
    cap, layers, fuse = _checked(cap, residual, head_fusion, part)
    result = torch.eye(cap.n_tokens)
    out = []
    for layer in layers:
        result = _mixed(cap, layer, fuse, residual) @ result
        out.append(result)
    return torch.stack(out)


def rollout_rows(
    cap: Capture,
    rows: Sequence[int] | Tensor,
    *,
    residual: float = 0.5,
    head_fusion: str = "mean",
    part: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_layer: Callable[[int, int], None] | None = None,
) -> Tensor:  # [len(rows) or m, key_pos]
    """Rows of the final layer's rollout (``rollout(cap)[-1][rows]``) without the n×n products.

    ``rows``: query positions, or a float ``[m, query_pos]`` matrix of row weights (each output row
    is that mix of the rollout's rows; :func:`rollout_blocks` passes block means). Computed right to
    left — ``W·R_L = (…((W·Â_L)·Â_{L-1})…)·Â_1`` — in layers·m·n² instead of layers·n³.
    ``on_progress(done, total)``: called after each layer (last to first); an exception it raises stops
    the computation (``on_layer=``: its old name, deprecated)."""
    on_progress = renamed("rollout_rows", "on_layer", on_layer, "on_progress", on_progress)
    cap, layers, fuse = _checked(cap, residual, head_fusion, part)
    n = cap.n_tokens
    weights = torch.as_tensor(rows)
    if weights.dtype.is_floating_point:
        if weights.dim() != 2 or weights.shape[1] != n:
            raise InputError(f"row weights must be a [rows, {n}] matrix, got {tuple(weights.shape)}")
        result = weights.float()
    else:
        index = weights.long().flatten()
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < n):
            raise InputError(f"rows must lie in 0..{n - 1}, got {weights.tolist()}")
        result = torch.eye(n)[index]
    for done, layer in enumerate(reversed(layers), 1):
        step = RolloutStep(result, residual=residual, fuse=fuse)
        for r, keys, w in cap.layer(layer).weight_chunks():
            step.add(r, keys, w)
        result = step.result
        if on_progress is not None:
            on_progress(done, len(layers))
    return result


def rollout_blocks(
    cap: Capture,
    block: int,
    *,
    residual: float = 0.5,
    head_fusion: str = "mean",
    part: str | None = None,
) -> Tensor:  # [ceil(n / block), ceil(n / block)]
    """The final layer's rollout averaged over blocks of ``block`` × ``block`` tokens (the last block of
    each side holds what is left), as a long text's heatmap shows it, in layers·(n/block)·n² instead of
    layers·n³ and never holding an n×n product."""
    n = cap.select(part).n_tokens
    means = block_means(n, block)  # [m, n]
    return rollout_rows(cap, means, residual=residual, head_fusion=head_fusion, part=part) @ means.T


def block_means(n: int, block: int) -> Tensor:  # [m, n]: row i averages tokens i·block … (i+1)·block - 1
    """The ``[ceil(n / block), n]`` matrix whose row i averages tokens ``i·block … (i+1)·block - 1``:
    :func:`rollout_blocks` is ``rollout_rows(cap, M) @ Mᵀ`` with it (``block`` checked here)."""
    if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= n:
        raise InputError(f"block must be a whole number of tokens in 1..{n}, got {block!r}")
    owner = torch.arange(n) // block
    means = torch.zeros(int(owner[-1]) + 1, n)
    means[owner, torch.arange(n)] = 1.0
    return means / means.sum(-1, keepdim=True)


def _fused(cap: Capture, layer: int, fuse) -> Tensor:  # [query_pos, key_pos]
    """The layer's heads fused into one map, a chunk of query rows at a time (``weight_chunks``: the
    keys a causal chunk leaves out are 0 in every head, so also in the fused map)."""
    rec = cap.layer(layer)
    fused = torch.zeros(rec.n_queries, rec.n_keys)
    for rows, keys, weights in rec.weight_chunks():
        fused[rows, keys] = fuse(weights.float().cpu())
    return fused
