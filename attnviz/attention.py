"""attnviz's own scaled-dot-product attention: ``softmax(Q·Kᵀ·scale + bias + M)·V``.

Every attention map attnviz shows is recomputed here, from the Q, K and V the model's attention
kernel received. The function reads like the formula; model quirks arrive as arguments, never as
model-specific branches: GPT-2's per-layer scaling (``scale``), T5's relative position bias and
ALiBi (``bias``), sliding windows (``window``), Gemma-2's soft-capping (``softcap``) and gpt-oss's
learned sinks (``sinks``: one extra logit per head in the softmax's denominator).

:func:`attention_output` computes the same A·V in query chunks, batched over heads, without ever
holding a layer's whole n×n matrix, and gives each chunk's weights. :func:`online_attention` computes
A·V in tiles of queries *and* keys with a running max and sum per row (online softmax, as
FlashAttention does) and returns each row's log-sum-exp; :func:`attention_tile` then gives any tile of
weights as ``exp(s − lse)`` in O(tile). Full validation runs through :func:`online_attention`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

# The unary functions ATen hands to oneMKL's vector math (VML) for a contiguous float32 / float64 tensor
# (aten/src/ATen/cpu/vml.h), each in each precision.
_VML_FUNCTIONS = (
    *("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp"),
    *("log", "log10", "log2", "sin", "sqrt", "tan", "tanh", "trunc"),
)


def resolve_vml_dispatch() -> None:
    """Call each function of :data:`_VML_FUNCTIONS` once, on one element, in this thread, in float32 and
    float64 — what attnviz does when it is imported, before it computes anything.

    oneMKL resolves each vector-math function's kernel on its first call; when that first call runs on
    several of torch's threads at once (a tensor over 2,048 elements, two or more threads), one thread
    may compute its whole share with a low-accuracy kernel: relative errors of ~1e-4 in float32 (~1e-9
    in float64) for that one call, silently (pytorch/pytorch#188792; oneMKL 2024.2, as torch 2.13's
    wheels bundle it). Here a fresh 2-thread process's first ``exp`` of a chunk's shifted scores was that
    far off in 5 runs of 24: weights 2.4e-5 from the exact softmax, which the self-check refused. One
    call on one element runs on the calling thread and resolves the kernel for the process; a torch
    without MKL, or with one that resolves safely, only pays the calls (~0.1 ms)."""
    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype)
        for name in _VML_FUNCTIONS:
            getattr(torch, name)(one)


resolve_vml_dispatch()

__all__ = [
    "SAMPLE_ROWS",
    "Scratch",
    "attention_output",
    "attention_tile",
    "build_mask",
    "head_max",
    "lse_from_weights",
    "online_attention",
    "row_entropy",
    "scaled_dot_product",
    "spread_rows",
    "weighted_values",
]


class Scratch:
    """Float32 buffers kept by name, each as large as the largest shape asked of it, that a chunked
    computation writes its weights-sized temporaries into instead of allocating them per chunk (on
    the CPU a fresh tensor of tens of MB is fresh pages from the system, faulted in again each time).
    Calling it gives a view of its buffer: the previous view's contents are overwritten."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], Tensor] = {}

    def __call__(self, name: str, shape: torch.Size | tuple[int, ...], device: torch.device | str) -> Tensor:
        size = math.prod(shape)
        return self.reserve(name, size, device)[:size].view(shape)

    def reserve(self, name: str, size: int, device: torch.device | str) -> Tensor:
        """The buffer ``name`` on ``device``, grown to at least ``size`` floats (a computation whose
        chunks grow reserves its largest first, so that the buffer is made once). A buffer outgrown is
        made at least twice as large: batches that grow one after another (texts by length) make it
        a few times, not once each."""
        key = (name, str(device))
        found = self._buffers.get(key)
        if found is None or found.numel() < size:
            grown = size if found is None else max(size, 2 * found.numel())
            self._buffers.pop(key, None)  # the old one freed first
            found = self._buffers[key] = torch.empty(grown, device=device)
        return found


def build_mask(
    query_len: int,
    key_len: int,
    *,
    causal: bool,
    window: int | None = None,
    key_padding: Tensor | None = None,  # [batch, key_pos] bool, True = a real token
    query_positions: Tensor | None = None,  # [query_pos] absolute position of each query
    key_positions: Tensor | None = None,  # [key_pos] absolute position of each key
    device: torch.device | str | None = None,
) -> Tensor | None:  # [batch or 1, 1, query_pos, key_pos] bool, True = may attend; None = all allowed
    """The boolean "may attend" mask for a causal flag, a sliding window and key padding.

    Positions default to a prefill: keys ``0..key_len-1`` and queries aligned with the *last* keys
    (query i is at position ``i + key_len - query_len``), as a decoder with a cache does. Give
    ``query_positions`` / ``key_positions`` for any other rows or columns (a chunk, a sample).
    Causal keeps keys ``j ≤ i``; ``window`` keeps ``i - j < window``.
    """
    if not causal and window is None and key_padding is None:
        return None
    if query_positions is None:
        query_positions = torch.arange(query_len, device=device) + (key_len - query_len)
    if key_positions is None:
        key_positions = torch.arange(key_len, device=device)
    i = query_positions.to(device)[:, None]
    j = key_positions.to(device)[None, :]
    allowed = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= (i - j) < window
    allowed = allowed[None, None]
    if key_padding is not None:
        allowed = allowed & key_padding.to(device=allowed.device, dtype=torch.bool)[:, None, None, :]
    return allowed


def _grouped(x: Tensor, groups: int) -> Tensor:  # [batch, head, q, ·] -> [batch, kv_head, groups·q, ·]
    b, h, n, d = x.shape
    return x.reshape(b, h // groups, groups * n, d)


def scaled_dot_product(
    q: Tensor,  # [batch, head, query_pos, d_head]
    k: Tensor,  # [batch, kv_head, key_pos, d_head]
    v: Tensor,  # [batch, kv_head, key_pos, d_head_v]
    *,
    scale: float | Tensor | None = None,  # a number, or one per head [head]
    causal: bool = False,
    mask: Tensor | None = None,  # bool (True = may attend) or additive, broadcastable to [batch, head, q, k]
    bias: Tensor | None = None,  # additive, broadcastable to [batch, head, q, k]
    window: int | None = None,
    sinks: Tensor | None = None,  # [head]: one extra logit per head in the softmax denominator
    temperature: float | Tensor = 1.0,  # a number, or one per head [head]
    softcap: float | None = None,
    query_positions: Tensor | None = None,  # [query_pos]
    key_positions: Tensor | None = None,  # [key_pos]
    dtype: torch.dtype | None = torch.float32,
    scratch: Scratch | None = None,
) -> tuple[Tensor, Tensor]:  # out [batch, head, query_pos, d_head_v], weights [batch, head, query_pos, key_pos]
    """Scaled dot-product attention, returning the output and the attention weights.

    The logits are ``s = softcap(Q·Kᵀ·scale) + bias``, divided by ``temperature``, then masked
    (``mask``, ``causal``, ``window``) and normalised by a softmax over the keys — plus, with
    ``sinks``, one more logit per head that takes its share of the softmax and is then dropped, so
    those rows sum to less than 1 (the sink's share is the rest).

    - ``scale``: the factor on Q·Kᵀ; ``None`` means ``1/√d_head``. Pass ``1.0`` to switch scaling off.
      ``scale`` and ``temperature`` may also be ``[head]`` tensors, one value per query head.
    - ``causal``: query i sees only keys ≤ i (aligned at the end when key_pos > query_pos, or as
      ``query_positions`` / ``key_positions`` say).
    - ``window``: sliding-window size (query i sees keys with ``i - j < window``).
    - GQA: query head h uses key/value head ``h // (head / kv_head)``, as ``repeat_kv`` does — read
      through a reshape, never copied.
    - ``dtype``: the precision of the computation (fp32 by default); ``None`` keeps q's dtype.
    - ``scratch``: a :class:`Scratch` whose buffers hold the scores and the weights (float32 only):
      the weights returned are then a view of it, overwritten by the next call with that scratch.

    A query row with every key masked gets all-zero weights (not NaN).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"expected 4-d tensors [batch, head, pos, d_head], got q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    n_head, n_kv = q.shape[1], k.shape[1]
    if n_head % n_kv:
        raise ValueError(f"{n_head} query heads cannot share {n_kv} key/value heads evenly")
    if not bool(torch.all(torch.as_tensor(temperature) > 0)):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    batch, _, n_q, _ = q.shape
    n_k = k.shape[-2]
    groups = n_head // n_kv

    rows = max(batch, k.shape[0])
    q3 = _grouped(q, groups).expand(rows, -1, -1, -1).reshape(rows * n_kv, groups * n_q, q.shape[-1])
    k3 = k.expand(rows, -1, -1, -1).reshape(rows * n_kv, n_k, k.shape[-1])
    # Q·Kᵀ·scale in one GEMM (the scale applied inside it), all heads of a key/value group at once
    alpha = 1.0 if isinstance(scale, Tensor) else float(scale)
    if scratch is not None and q3.dtype != torch.float32:
        raise ValueError(f"a Scratch holds float32 buffers; the computation is in {q3.dtype}")
    if scratch is None:
        scores = torch.baddbmm(q3.new_zeros(1, 1, 1), q3, k3.transpose(1, 2), beta=0, alpha=alpha)
    else:
        scores = scratch("scores", (q3.shape[0], q3.shape[1], n_k), q3.device)
        torch.baddbmm(scores, q3, k3.transpose(1, 2), beta=0, alpha=alpha, out=scores)
    scores = scores.view(rows, n_head, n_q, n_k)
    if isinstance(scale, Tensor):  # one factor per head
        scores *= scale.to(scores).view(1, n_head, 1, 1)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores += bias.to(scores.dtype)
    if isinstance(temperature, Tensor):
        temperature = temperature.to(scores).view(1, n_head, 1, 1)
        scores /= temperature
    elif temperature != 1.0:
        scores /= temperature
    if mask is not None:
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores += mask.to(scores.dtype)
    if causal or window is not None:
        _mask_structure(scores, query_positions, key_positions, causal=causal, window=window)

    if sinks is not None:
        sink = (sinks.to(scores).view(1, n_head, 1, 1) / temperature).expand(scores.shape[0], n_head, n_q, 1)
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    elif scratch is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scratch("weights", scores.shape, scores.device))
    if mask is not None or window is not None or (causal and n_q > n_k):
        weights = weights.nan_to_num_(nan=0.0)  # rows with every key masked
    return weighted_values(weights, v), weights


def weighted_values(
    weights: Tensor,  # [batch, head, query_pos, key_pos]
    v: Tensor,  # [batch or 1, kv_head, key_pos, d_head_v]
) -> Tensor:  # [batch, head, query_pos, d_head_v]
    """A·V: each query head's weights times the values of its key/value head (GQA read in place)."""
    rows, n_head, n_q, n_k = weights.shape
    n_kv = v.shape[1]
    groups = n_head // n_kv
    v = v.to(weights.dtype)
    out = torch.bmm(
        weights.reshape(rows * n_kv, groups * n_q, n_k), v.expand(rows, -1, -1, -1).reshape(rows * n_kv, n_k, -1)
    )
    return out.view(rows, n_head, n_q, v.shape[-1])


def _mask_structure(
    scores: Tensor, query_positions: Tensor | None, key_positions: Tensor | None, *, causal: bool, window: int | None
) -> None:
    """Set the causal / sliding-window blocked scores to -inf, in place, touching only the key
    columns that some query row blocks (for a chunk of rows, the diagonal band)."""
    n_q, n_k = scores.shape[-2:]
    qpos = torch.arange(n_q) + (n_k - n_q) if query_positions is None else query_positions.cpu()
    kpos = torch.arange(n_k) if key_positions is None else key_positions.cpu()
    blocked_somewhere = torch.zeros(n_k, dtype=torch.bool)
    if causal:
        blocked_somewhere |= kpos > qpos.min()
    if window is not None:
        blocked_somewhere |= kpos <= qpos.max() - window
    columns = torch.nonzero(blocked_somewhere).flatten()
    if len(columns) == 0:
        return
    lo, hi = int(columns.min()), int(columns.max()) + 1
    allowed = build_mask(
        n_q,
        hi - lo,
        causal=causal,
        window=window,
        query_positions=qpos,
        key_positions=kpos[lo:hi],
        device=scores.device,
    )
    assert allowed is not None  # causal or window: there is a structure
    scores[..., lo:hi].masked_fill_(~allowed, float("-inf"))


def row_entropy(weights: Tensor, work: Tensor) -> Tensor:  # [..., keys] -> [...]
    """Each row's entropy ``−Σ_k a·ln a`` in nats over the last dimension, a weight of 0 adding 0
    (its logarithm is taken at the smallest normal float, times 0): one clamp, one logarithm, one
    product and one sum over the weights (``xlogy`` and ``special.entr`` took 2–3× longer here).
    ``work``: a tensor of the weights' shape and dtype to compute in (the weights are kept)."""
    tiny = torch.finfo(weights.dtype).tiny
    return torch.clamp_min(weights, tiny, out=work).log_().mul_(weights).sum(-1).neg_()


#: the query rows the default self-check recomputes, besides the first and the last (:func:`spread_rows`)
SAMPLE_ROWS = 32


def spread_rows(n: int, count: int, device: torch.device | str | None = None) -> Tensor:  # [min(n, count + 2)]
    """The first and the last of ``n`` rows and ``count`` more spread evenly between them — row ``i`` of
    ``m`` is ``round(i · (n - 1) / (m - 1))``, halves up, in integer arithmetic: the same rows whether
    made on the host or on ``device`` (made there: nothing is copied to it)."""
    m = min(n, count + 2)
    if m <= 1:
        return torch.zeros(max(m, 0), dtype=torch.long, device=device)
    i = torch.arange(m, device=device)
    return (i * (2 * (n - 1)) + (m - 1)) // (2 * (m - 1))


def head_max(x: Tensor) -> Tensor:  # [head, ...] -> [head]
    """max |x| per head (0 for an empty ``x``): how a recomputation's distance from the model is measured."""
    return x.abs().flatten(1).amax(dim=1) if x.numel() else torch.zeros(x.shape[0])


def query_chunks(n_query: int, n_key: int, n_head: int, *, budget: int = 1 << 21) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges so that one chunk's scores stay near ``budget`` elements."""
    rows = max(1, min(n_query, budget // max(1, n_head * n_key)))
    for start in range(0, n_query, rows):
        yield start, min(n_query, start + rows)


def attention_output(
    q: Tensor,  # [head, query_pos, d_head]
    k: Tensor,  # [kv_head, key_pos, d_head]
    v: Tensor,  # [kv_head, key_pos, d_head_v]
    *,
    rows: Tensor | None = None,  # [r] the query rows to compute (default: all)
    scale: float,
    causal: bool,
    window: int | None = None,
    mask: Tensor | Callable[[Tensor, slice], Tensor | None] | None = None,  # [head or 1, query_pos, key_pos]
    bias: Tensor | Callable[[Tensor, slice], Tensor | None] | None = None,  # [head or 1, query_pos, key_pos]
    sinks: Tensor | None = None,
    softcap: float | None = None,
    all_keys: bool = False,
    budget: int = 1 << 21,
    scratch: Scratch | None = None,
) -> Iterator[
    tuple[Tensor, slice, Tensor, Tensor]
]:  # per chunk: rows [r], keys, out [head, r, d_v], weights [head, r, keys]
    """A·V (and the weights) for the given query rows, in chunks, all heads at once, in float32.

    ``mask`` and ``bias`` are tensors or functions ``(rows, keys) -> [head or 1, r, k]`` that give
    just the chunk's part. When the mask is the causal (and window) structure, each chunk computes
    only the keys its rows may see — the upper triangle is never computed — unless ``all_keys``.
    Memory stays near ``budget`` floats per chunk whatever the length. Queries align with the
    keys as in a prefill. With a ``scratch`` (:class:`Scratch`) each chunk's weights are written into
    its buffers: a chunk's weights are valid until the next chunk is asked for.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    offset = n_k - n_q
    rows = torch.arange(n_q) if rows is None else rows.cpu()
    chunks = list(query_chunks(len(rows), n_k, q.shape[0], budget=budget))
    if scratch is not None:  # the largest chunk's (a causal chunk's keys grow with its rows): made once
        largest = max(stop - start for start, stop in chunks) * q.shape[0] * n_k
        for name in ("scores", "weights"):
            scratch.reserve(name, largest, q.device)
    for start, stop in chunks:
        r = rows[start:stop]
        positions = r + offset
        lo, hi = 0, n_k
        if mask is None and causal and not all_keys:
            hi = int(positions.max()) + 1
            if window is not None:
                lo = max(0, int(positions.min()) - window + 1)
        keys = slice(lo, hi)
        rd = r.to(q.device)
        out, weights = scaled_dot_product(
            q[None, :, rd],
            k[None, :, keys],
            v[None, :, keys],
            scale=scale,
            causal=causal,
            window=window,
            mask=_part(mask, rd, keys),
            bias=_part(bias, rd, keys),
            sinks=sinks,
            softcap=softcap,
            query_positions=positions.to(q.device),
            key_positions=torch.arange(lo, hi, device=q.device),
            scratch=scratch,
        )
        yield r, keys, out[0], weights[0]


def _part(t: Tensor | Callable[[Tensor, slice], Tensor | None] | None, rows: Tensor, keys: slice) -> Tensor | None:
    """The chunk ``[1, head or 1, r, k]`` of a mask or bias given whole or as a function."""
    if t is None:
        return None
    if callable(t) and not isinstance(t, Tensor):
        part = t(rows, keys)
        return None if part is None else part[None]
    t = t if t.dim() == 3 else t[None]
    t = t if t.shape[-2] == 1 else t.index_select(-2, rows.to(t.device))
    return t[..., keys][None]


#: a mask or bias given whole ``[head or 1, query_pos, key_pos]`` or as a function ``(rows, keys) -> [head or 1, r, k]``
Part = Tensor | Callable[[Tensor, slice | Tensor], Tensor | None] | None


def _piece(t: Part, rows: Tensor, keys: slice | Tensor) -> Tensor | None:  # [head or 1, r, k]
    """A tile of a mask or bias: the function's answer, or the whole tensor's keys first, then its rows
    (so a tile reads ``r × k`` numbers, not ``r × key_pos``)."""
    if t is None:
        return None
    if callable(t) and not isinstance(t, Tensor):
        return t(rows, keys)
    t = t if t.dim() == 3 else t[None]
    t = t[..., keys] if isinstance(keys, slice) else t.index_select(-1, keys.to(t.device))
    return t if t.shape[-2] == 1 else t.index_select(-2, rows.to(t.device))


def _tile_scores(
    q: Tensor,  # [head, r, d] float32, the tile's rows
    k: Tensor,  # [kv_head, c, d] float32, the tile's keys
    rows: Tensor,  # [r] on q's device
    keys: slice | Tensor,  # the tile's key columns (a slice, or [c] on q's device)
    query_positions: Tensor,  # [r] on q's device
    key_positions: Tensor,  # [c] on q's device
    *,
    scale: float,
    mask: Part,
    bias: Part,
    softcap: float | None,
    temperature: float,
    structure: tuple[bool, int | None],  # (causal, window) to apply to this tile; (False, None): none blocks here
) -> Tensor:  # [head, r, c]: the scores as scaled_dot_product makes them, blocked pairs -inf
    """One tile's logits in :func:`scaled_dot_product`'s order: Q·Kᵀ·scale (one GEMM per key/value
    group, GQA through a reshape), soft-cap, bias, temperature, mask, causal / window structure."""
    n_head, r, d = q.shape
    n_kv, c = k.shape[0], k.shape[1]
    groups = n_head // n_kv
    s = torch.baddbmm(q.new_zeros(1, 1, 1), q.reshape(n_kv, groups * r, d), k.transpose(1, 2), beta=0, alpha=scale)
    s = s.view(n_head, r, c)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    b = _piece(bias, rows, keys)
    if b is not None:
        s += b.to(s.dtype)
    if temperature != 1.0:
        s /= temperature
    m = _piece(mask, rows, keys)
    if m is not None:
        if m.dtype == torch.bool:
            s.masked_fill_(~m, float("-inf"))
        else:
            s += m.to(s.dtype)
    causal, window = structure
    if causal or window is not None:
        i, j = query_positions[:, None], key_positions[None, :]
        blocked = torch.zeros(r, c, dtype=torch.bool, device=s.device)
        if causal:
            blocked |= j > i
        if window is not None:
            blocked |= (i - j) >= window
        s.masked_fill_(blocked, float("-inf"))
    return s


def _key_tiles(
    positions: Tensor, n_k: int, block_keys: int, *, causal: bool, window: int | None
) -> Iterator[tuple[int, int, tuple[bool, int | None]]]:
    """The key tiles ``(start, stop, structure)`` some row at ``positions`` (host, [r]) may see; each
    tile's structure is what must still be masked in it — tiles the causal / window structure blocks
    for every row are skipped, tiles it blocks for no row are not masked."""
    lo, hi = int(positions.min()), int(positions.max())
    for start in range(0, n_k, block_keys):
        stop = min(n_k, start + block_keys)
        if causal and start > hi:
            break
        if window is not None and stop - 1 <= lo - window:
            continue
        yield start, stop, (causal and stop - 1 > lo, window if window is not None and start <= hi - window else None)


def online_attention(
    q: Tensor,  # [head, query_pos, d_head]
    k: Tensor,  # [kv_head, key_pos, d_head]
    v: Tensor,  # [kv_head, key_pos, d_head_v] (width 0: only the log-sum-exp)
    *,
    rows: Tensor | None = None,  # [r] the query rows to compute (default: all)
    scale: float,
    causal: bool,
    window: int | None = None,
    mask: Part = None,  # [head or 1, query_pos, key_pos], or (rows, keys) -> [head or 1, r, k]
    bias: Part = None,  # [head or 1, query_pos, key_pos], or (rows, keys) -> [head or 1, r, k]
    sinks: Tensor | None = None,  # [head]
    softcap: float | None = None,
    temperature: float = 1.0,
    budget: int = 1 << 21,
    block_keys: int = 1024,
) -> tuple[Tensor, Tensor]:  # out [head, r, d_head_v], lse [head, r]
    """A·V and each row's log-sum-exp, in tiles of queries and keys (online softmax, as FlashAttention
    computes it), all heads at once, in float32.

    Each tile of rows walks the key tiles with a running max ``m`` and sum ``l`` per row (a new tile's
    max rescales what was summed before), so no row's weights exist whole: memory stays near
    ``budget`` floats per tile (``block_keys`` keys × as many rows as fit) whatever the length. Key
    tiles the causal / window structure blocks for every row of a tile are never computed; queries
    align with the last keys, as in a prefill. Everything :func:`attention_output` honours is honoured
    the same way: ``scale``, ``causal``, ``window``, ``mask`` / ``bias`` as tensors or functions
    ``(rows, keys) -> [head or 1, r, k]`` (``keys`` a slice), GQA (query head h reads key/value head
    ``h // (head / kv_head)``, through a reshape), ``softcap``, ``temperature`` and learned ``sinks``
    (one more logit per head in each row's denominator).

    ``lse[h, i] = log Σ_j exp(s_ij)`` over the row's keys — plus ``exp(sink_h)`` with sinks — so
    ``exp(s_ij − lse[h, i])`` is the weight the softmax gives (:func:`attention_tile`). A row whose every
    key is masked gets output 0 and ``lse = -inf`` (its weights 0, not NaN). ``rows`` on any device;
    the tiles are planned on the host from one copy of them, and nothing inside the loop waits for the
    device (given functions of ``mask`` / ``bias`` must not either).
    """
    n_head, n_q, _ = q.shape
    n_kv, n_k, d_v = v.shape
    if n_head % n_kv:
        raise ValueError(f"{n_head} query heads cannot share {n_kv} key/value heads evenly")
    device = q.device
    host_rows = torch.arange(n_q) if rows is None else rows.cpu().long()
    offset = n_k - n_q
    qf, kf, vf = q.float(), k.float(), v.float()
    groups = n_head // n_kv
    block_keys = max(1, min(block_keys, n_k))
    n_r = len(host_rows)
    out = torch.zeros(n_head, n_r, d_v, device=device)
    lse = torch.full((n_head, n_r), float("-inf"), device=device)
    if n_r == 0 or n_k == 0:
        return out, lse
    all_rows = host_rows.to(device)
    key_positions = torch.arange(n_k, device=device)
    sink = None if sinks is None else sinks.to(device=device, dtype=torch.float32)[:, None] / temperature
    for start, stop in query_chunks(n_r, block_keys, n_head, budget=budget):
        r = all_rows[start:stop]
        positions = host_rows[start:stop] + offset
        qpos = r + offset
        q_t = qf.index_select(1, r)
        m = torch.full((n_head, stop - start), float("-inf"), device=device)
        total = torch.zeros(n_head, stop - start, device=device)
        acc = out[:, start:stop]
        for k0, k1, structure in _key_tiles(positions, n_k, block_keys, causal=causal, window=window):
            keys = slice(k0, k1)
            s = _tile_scores(
                q_t, kf[:, keys], r, keys, qpos, key_positions[keys],
                scale=scale, mask=mask, bias=bias, softcap=softcap, temperature=temperature, structure=structure,
            )  # fmt: skip
            if not d_v:  # the log-sum-exp alone: one fused logsumexp per tile, added to the running one
                m = torch.logaddexp(m, torch.logsumexp(s, -1))
                continue
            new_m = torch.maximum(m, s.amax(-1))
            shift = new_m.nan_to_num(neginf=0.0)  # a row with no key yet: nothing to shift (exp(-inf) = 0)
            p = s.sub_(shift[..., None]).exp_()
            rescale = (m - shift).exp_()
            total.mul_(rescale).add_(p.sum(-1))
            if d_v:
                pv = torch.bmm(p.view(n_kv, groups * (stop - start), k1 - k0), vf[:, keys])
                acc.mul_(rescale[..., None]).add_(pv.view(n_head, stop - start, d_v))
            m = new_m
        if not d_v:  # m is the running log-sum-exp itself
            lse[:, start:stop] = m if sink is None else torch.logaddexp(m, sink)
            continue
        if sink is not None:  # the sink's logit joins each row's denominator
            new_m = torch.maximum(m, sink)
            rescale = (m - new_m).exp_()
            total.mul_(rescale).add_((sink - new_m).exp_())
            acc.mul_(rescale[..., None])
            m = new_m
        if d_v:
            acc.div_(total.clamp_min(torch.finfo(torch.float32).tiny)[..., None])  # a row with no key: 0 / tiny = 0
        lse[:, start:stop] = m + total.log()
    return out, lse


def lse_from_weights(
    q: Tensor,  # [head, query_pos, d_head]
    k: Tensor,  # [kv_head, key_pos, d_head]
    weights: Tensor,  # [head, r, c]: the softmax weights of rows × keys (an attention_output chunk's)
    *,
    rows: Tensor,  # [r] query rows
    keys: slice,  # the chunk's key columns
    scale: float,
    mask: Part = None,
    bias: Part = None,
    softcap: float | None = None,
    largest: tuple[Tensor, Tensor]
    | None = None,  # ([head, r] each row's largest weight, [head, r] its key in the chunk)
) -> Tensor:  # [head, r] float32
    """Each row's log-sum-exp (:func:`online_attention`'s, sinks included) from weights already computed
    over every key the row may see: ``lse_i = s_ij − log w_ij`` at the row's largest weight (≥ 1 / keys,
    so its logarithm is well conditioned), whose one logit is computed in O(r · d) — a pass that has the
    weights (the dashboard's overview) gets the rows' log-sum-exp for nothing. A row whose every weight
    is 0 (every key masked) gets ``-inf``. ``largest``: those weights and keys, where the caller found them
    already (the overview's block maxima), else read here."""
    device = weights.device
    r = rows.to(device)
    # [head, r]: each row's largest weight and its key (in the chunk)
    top, at = weights.float().max(-1) if largest is None else (largest[0].to(device), largest[1].to(device))
    n_head, n_kv = q.shape[0], k.shape[0]
    key = at + (keys.start or 0)  # [head, r]: the model's key position
    kv = torch.arange(n_head, device=device) // (n_head // n_kv)
    qs = q.index_select(1, r.to(q.device)).float().to(device)  # [head, r, d]
    ks = k.float().to(device)[kv[:, None], key]  # [head, r, d]: each row's key at its largest weight
    s = (qs * ks).sum(-1) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    for part, additive in ((bias, True), (mask, False)):
        piece = _piece(part, r, keys)  # [head or 1, r, c]
        if piece is None or (not additive and piece.dtype == torch.bool):
            continue  # a bool mask lets the largest weight's key through
        piece = piece.to(device).float().expand(n_head, top.shape[1], -1)
        s = s + piece.gather(-1, at[..., None])[..., 0]
    return torch.where(top > 0, s - top.log(), torch.full_like(s, float("-inf")))


def attention_tile(
    q: Tensor,  # [head, query_pos, d_head]
    k: Tensor,  # [kv_head, key_pos, d_head]
    lse: Tensor,  # [head, r]: the rows' log-sum-exp (online_attention's, with the same arguments)
    *,
    rows: Tensor,  # [r] query rows
    cols: slice | Tensor,  # the key columns: a slice, or [c] indices
    scale: float,
    causal: bool,
    window: int | None = None,
    mask: Part = None,
    bias: Part = None,
    softcap: float | None = None,
    temperature: float = 1.0,
) -> Tensor:  # [head, r, c] float32
    """The weights of rows × cols, ``exp(s − lse)``, from the rows' log-sum-exp (:func:`online_attention`
    with the same arguments; its sinks are inside ``lse``): O(r · c · d), whatever the length. A row
    whose every key is masked (``lse = -inf``) gets weights 0."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    device = q.device
    r = rows.to(device)
    key_positions = torch.arange(n_k, device=device)[cols] if isinstance(cols, slice) else cols.to(device)
    s = _tile_scores(
        q.index_select(1, r).float(), (k[:, cols] if isinstance(cols, slice) else k.index_select(1, key_positions)).float(),
        r, cols if isinstance(cols, slice) else key_positions, r + (n_k - n_q), key_positions,
        scale=scale, mask=mask, bias=bias, softcap=softcap, temperature=temperature, structure=(causal, window),
    )  # fmt: skip
    return s.sub_(lse.to(device=device, dtype=torch.float32)[..., None]).exp_().nan_to_num_(nan=0.0)
