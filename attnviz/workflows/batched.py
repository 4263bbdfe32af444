"""Head statistics of a padded batch, reduced at once (what :func:`~attnviz.analysis.corpus_stats` runs).

:class:`BatchReducer` runs one forward under the taps and reduces each kept layer the moment its
kernel returns (:class:`ReducingRecorder`; families read through projection hooks after the
forward). One recomputation gives the weights of every text and head of the batch, with every
padded key blocked (zero weight, whatever the model's own mask says) and every padded query row
set to zero weights, so that each sum below reads the real rows alone:

- where the mask only allows or blocks and no bias, sinks or soft-cap apply (most models),
  :func:`_weights_and_entropy`: the GEMM, the mask and the softmax of
  :func:`~attnviz.attention.scaled_dot_product`, and each row's entropy as ``Σ a (lse - s)`` from
  the scores (``lse`` read at the row's own key) — no logarithm per weight; otherwise
  :func:`~attnviz.attention.scaled_dot_product` itself and ``-Σ a log a``;
- the mass on each key class (``first``, ``special``, ``punctuation``): the weights summed over
  rows, times the texts' key features; ``distance``, ``self``, ``previous``, ``next``: the weights
  summed over texts, times the (row, key) features — each one product, in float64;
- the detectors' (row, key) pairs gathered;
- the self-check: A·V of the sampled rows of each text (the first, the last and
  :data:`~attnviz.data.validate.SAMPLE_ROWS` more, as ``capture(check="sample")``) against the kernel's
  own output with the same tolerances (and an eager kernel's weights, compared while capturing); a
  mismatch raises :class:`~attnviz.ValidationError` with the text's own capture.

Nothing the model computes after the last wanted layer's attention feeds a statistic, so the
forward stops there (unless a module has forward hooks, as accelerate's offloading does). No
per-text :class:`~attnviz.Capture` is made, and a layer's tensors go as soon as it is reduced.
The numbers are those of :func:`~attnviz.analysis.head_stats` over the same texts captured one by
one, to float rounding. Memory stays near :data:`BUDGET` floats of weights per step: long texts
are cut into chunks of query rows (a causal chunk computes only the keys its rows may see).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..analysis.stats import DETECTORS, HeadStatsSums, pattern_rows
from ..analysis.stats import is_punct as stats_is_punct
from ..attention import build_mask, query_chunks, scaled_dot_product, weighted_values
from ..data.records import check_calls
from ..data.validate import SAMPLE_ROWS, TOLERANCES, ValidationReport, sample_rows
from ..engine.hooks import tap_projections
from ..engine.specs import PROJECTION_SPECS
from ..engine.taps import CALL_TENSORS, AttentionCall, Recorder, tap
from ..errors import AttnvizError, InputError, OutOfRangeError, ValidationError
from .inputs import Encoded, check_vocabulary, padded, tokenize
from .runner import check_layers, max_positions, n_layers, resolve_model

__all__ = ["BUDGET", "BatchReducer"]

BUDGET = 1 << 22  # weights (floats) recomputed per step: a chunk of query rows of the whole batch
# detectors summed over their (row, key) pairs; previous_token is the "previous" statistic
PATTERNS = ("duplicate_token", "induction")
_TINY = torch.finfo(torch.float32).tiny
BLOCKED = -1e30  # a blocked score in _weights_and_entropy: finite (its weight × its score is 0, not NaN)
_SAFE_REF = 1e-30  # a reference weight above this reads its logarithm to float precision


class BatchReducer:
    """Adds batches of texts to :class:`HeadStatsSums`, each batch in one forward and one reduction
    per layer. One-stack models (encoders, decoders); an encoder-decoder needs per-text captures."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        layers: Iterable[int] | None = None,
        max_length: int | None = None,
        add_bos: bool = False,
        part: str | None = None,
        detectors: bool = True,
        budget: int = BUDGET,
    ) -> None:
        model, tokenizer, name = resolve_model(model, tokenizer, None, None, None)
        if getattr(model.config, "is_encoder_decoder", False):
            raise InputError("BatchReducer reduces one-stack models; an encoder-decoder's parts need captures")
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.layers = check_layers(layers, n_layers(model.config))
        self.limit = max_positions(model.config)
        self.max_length = max_length
        self.add_bos = add_bos
        self.part = part
        self.detectors = detectors
        self.budget = budget
        self.use_cache = "use_cache" in inspect.signature(model.forward).parameters
        # The forward stops after the last wanted layer's attention unless a module's hooks (forward
        # hooks, accelerate's offloading) may expect every forward they start to finish.
        count = n_layers(model.config)
        hooked = any(m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook") for m in model.modules())
        wanted = self.layers if self.layers is not None else set(range(count)) if count else None
        self.stop_after = None if hooked or not wanted else frozenset(wanted)

    def encode(self, text: str) -> Encoded:
        """One text tokenized as :meth:`add` tokenizes it, but never cut (its full length)."""
        return tokenize(self.tokenizer, [text], None, None, self.name, self.add_bos)[0]

    def add(
        self, sums: HeadStatsSums | None, texts: list[str], given: list[Encoded | None] | None = None
    ) -> tuple[HeadStatsSums, list[int]]:
        """Capture ``texts`` in one padded forward and add them to ``sums`` (made on the first call);
        returns the sums and each text's token count. ``given``: texts already tokenized by
        :meth:`encode` (None where not, or where the text must be cut at ``max_length``)."""
        model = self.model
        known: list[Encoded | None] = list(given) if given is not None else [None] * len(texts)
        missing = [text for text, enc in zip(texts, known) if enc is None]
        made = iter(tokenize(self.tokenizer, missing, self.max_length, self.limit, self.name, self.add_bos))
        encoded: list[Encoded] = [enc if enc is not None else next(made) for enc in known]
        check_vocabulary(model, encoded, "input_ids")
        lengths = [len(ids) for ids, _, _ in encoded]
        ids, attention_mask = padded(encoded, next(model.parameters()).device)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": attention_mask}
        if self.use_cache:
            inputs["use_cache"] = False
        batch = BatchTexts(encoded, texts, detectors=self.detectors)
        reduced: list[tuple[AttentionCall, Tensor, dict[str, tuple[Tensor, Tensor]]]] = []
        dtypes: set[str] = set()

        def reduce(call: AttentionCall) -> None:
            assert call.q is not None
            dtypes.add(str(call.q.dtype).removeprefix("torch."))
            values, errors = reduce_layer(call, batch, self.budget)
            reduced.append((call, values, errors))
            for name in CALL_TENSORS:  # this layer is done: its tensors go at once
                setattr(call, name, None)

        lengths_by_part = {"encoder": lengths, "decoder": lengths}
        spec = PROJECTION_SPECS.get(getattr(model.config, "model_type", ""))
        if spec is None:
            taps = tap(
                model,
                layers=self.layers,
                to_cpu=False,
                weight_mode="compare",
                lengths=lengths_by_part,
                recorder_class=ReducingRecorder,
            )
        else:  # projection hooks record into a plain Recorder: its layers are reduced after the forward
            taps = tap_projections(
                model, spec, layers=self.layers, to_cpu=False, weight_mode="compare", lengths=lengths_by_part
            )
        with torch.inference_mode():  # nothing here is ever differentiated: no autograd bookkeeping
            with taps as recorder:
                if isinstance(recorder, ReducingRecorder):
                    recorder.reduce = reduce
                    recorder.awaited = None if self.stop_after is None else set(self.stop_after)
                try:
                    model(**inputs)
                except _LastLayerReduced:
                    pass
            for call in recorder.calls:
                if call.q is not None:
                    reduce(call)
        calls = recorder.calls
        check_calls(model, calls, False)
        if not reduced:
            raise OutOfRangeError(
                f"none of layers {sorted(self.layers or [])} ran; this model has {len(calls)} attention layers"
            )
        parts = sorted({c.part for c in calls})
        if self.part is not None and self.part not in parts:
            raise InputError(f"no part {self.part!r} in this capture; its parts are {', '.join(parts)}")
        if len(parts) > 1:
            raise InputError(f"this model has the parts {', '.join(parts)}; corpus statistics read one-stack models")
        reduced.sort(key=lambda item: item[0].layer)
        layers = [call.layer for call, _, _ in reduced]
        n_heads = reduced[0][0].sizes["n_heads"]
        if sums is None:
            sums = HeadStatsSums(layers, n_heads, detectors=self.detectors)
        elif sums.layers != layers or sums.n_heads != n_heads:
            raise InputError(
                f"a batch with layers {layers} × {n_heads} heads cannot be added to statistics "
                f"of layers {sums.layers} × {sums.n_heads} heads: use one model and the same layers"
            )
        dtype = dtypes.pop() if len(dtypes) == 1 else "float32"
        atol, rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
        columns = torch.tensor([STATISTIC_COLUMNS[key] for key in sums.keys])
        layer_sums = torch.stack([values[columns] for _, values, _ in reduced], 1)  # [statistic, layer, head]
        checks = [(call, errors) for call, _, errors in reduced]
        _raise_on_mismatch(self, checks, texts, lengths, atol, rtol, dtype)
        sums.add_reduced(layer_sums, batch.rows(sums.keys), texts=len(texts), tokens=sum(lengths))
        return sums, lengths


# The columns of reduce_layer's [column, head] sums, and the column each statistic reads.
COLUMNS = ("first", "special", "punctuation", "distance", "self", "previous", "next", "entropy") + PATTERNS
STATISTIC_COLUMNS = {**{name: COLUMNS.index(name) for name in COLUMNS}, "previous_token": COLUMNS.index("previous")}
assert set(STATISTIC_COLUMNS) >= set(DETECTORS)
KEYED = 3  # the first COLUMNS depend on the key alone (its features): a product with the weights' column sums
POSITIONAL = 4  # the next depend on the query and key positions alone: a product with the weights summed over texts


@dataclass
class ReducingRecorder(Recorder):
    """A Recorder that hands each kept layer to ``reduce`` the moment its kernel returns (while its
    Q, K, V are still in the cache) instead of keeping it: one layer's tensors at a time."""

    reduce: Callable[[AttentionCall], None] | None = None
    awaited: set[int] | None = None  # layers still to come; once none is left the forward stops (None: never)

    def keep(self, call: AttentionCall) -> None:
        if self.reduce is None:
            super().keep(call)
            return
        self.reduce(call)
        self.calls.append(call)
        if self.awaited is not None:
            self.awaited.discard(call.layer)
            if not self.awaited:
                self.awaited = None
                raise _LastLayerReduced


class _LastLayerReduced(Exception):
    """Raised from inside the forward once every wanted layer is reduced: what the model would
    compute after it (the last layer's MLP, the final norm, a pooler) feeds no statistic."""


class BatchTexts:
    """What the statistics read of a padded batch's texts: the real tokens, each key's features
    (first, special, punctuation), the scored rows of each statistic, the rows the self-check samples,
    and per chunk of query rows what its reduction reads (:class:`Chunk`) and its mask."""

    def __init__(self, encoded: list, texts: list[str], *, detectors: bool) -> None:
        self.lengths = [len(ids) for ids, _, _ in encoded]
        self.detectors = detectors
        b, n = len(encoded), max(self.lengths)
        self.ids = torch.tensor([list(ids) + [0] * (n - len(ids)) for ids, _, _ in encoded], dtype=torch.long)
        self.valid = torch.arange(n)[None, :] < torch.tensor(self.lengths)[:, None]  # real tokens (keys and rows)
        where: list[list[int]] = [[], [], []]  # (text, key, feature) of every key feature that is 1
        has_special = []
        for i, ((_, offsets, _), text) in enumerate(zip(encoded, texts)):
            special, punct = _text_positions(text, offsets)
            for feature, keys in enumerate(([0], special, punct)):
                where[0] += [i] * len(keys)
                where[1] += keys
                where[2] += [feature] * len(keys)
            has_special.append(bool(special))
        # per key: first, special (after the first), punctuation
        self.keyed = torch.zeros(b, n, KEYED, dtype=torch.float64)
        self.keyed[where[0], where[1], where[2]] = 1.0
        self.has_special = torch.tensor(has_special)
        self.samples = [_sample_rows(m) for m in self.lengths]  # the rows the self-check compares, per text
        self._cache: dict[tuple, Any] = {}

    def rows(self, keys: list[str]) -> Tensor:  # [statistic] float64: scored query rows over the batch
        n = torch.tensor(self.lengths, dtype=torch.float64)
        counts = {
            "first": n.sum(),
            "special": (n * self.has_special).sum(),
            "punctuation": n.sum(),
            "self": n.sum(),
            "previous": (n - 1).sum(),
            "next": (n - 1).sum(),
            "distance": n.sum(),
            "entropy": n.sum(),
            "previous_token": (n - 1).sum(),
        }
        if self.detectors:
            found = [pattern_rows(self.ids[i, :m].tolist()) for i, m in enumerate(self.lengths)]
            for p, name in enumerate(PATTERNS):
                counts[name] = torch.tensor(float(sum(f[p] for f in found)), dtype=torch.float64)
        return torch.stack([counts[k].double() for k in keys])

    def chunk(self, start: int, stop: int, keys: int, device: torch.device) -> Chunk:
        """What query rows ``start:stop`` over keys ``:keys`` read (:class:`Chunk`), made once per
        batch and shape: every layer shares it."""
        key = ("chunk", start, stop, keys, str(device))
        found = self._cache.get(key)
        if found is None:
            i = torch.arange(start, stop)[:, None]
            j = torch.arange(keys)[None, :]
            pairs, columns = torch.zeros(3, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
            if self.detectors:
                rows = self.ids[:, start:stop, None]
                shifted = torch.zeros_like(self.ids[:, :keys])  # token j - 1 at key j
                shifted[:, 1:] = self.ids[:, : keys - 1]
                before = (j < i)[None] & self.valid[:, start:stop, None] & self.valid[:, None, :keys]
                patterns = [
                    (rows == self.ids[:, None, :keys]) & before,  # duplicate_token
                    (rows == shifted[:, None, :]) & before & (j >= 1)[None],  # induction
                ]
                each = [torch.stack(torch.nonzero(m, as_tuple=True)) for m in patterns]
                pairs = torch.cat(each, 1)
                columns = torch.cat([torch.full((f.shape[1],), COLUMNS.index(p)) for p, f in zip(PATTERNS, each)])
            r = stop - start
            local = [[row - start for row in rows if start <= row < stop] for rows in self.samples]
            checked = None  # every text samples every row of the chunk: the check reads the weights as they are
            if any(len(rows) < r for rows in local):  # each text's own rows, its last repeated to the longest list
                width = max(1, max(len(rows) for rows in local))
                checked = torch.tensor([rows + [rows[-1] if rows else 0] * (width - len(rows)) for rows in local])
            positional = torch.stack([(i - j).abs(), j == i, j == i - 1, j == i + 1]).to(torch.float64)
            found = self._cache[key] = Chunk(
                positional=positional.view(POSITIONAL, -1).to(device),
                keyed=self.keyed[:, :keys].to(device),
                padded=~self.valid[:, None, start:stop].to(device),
                pairs=pairs.to(device),
                columns=columns.to(device),
                checked=None if checked is None else checked.to(device),
                checks=any(local),
                unchecked=None if all(local) else torch.tensor([not rows for rows in local]).to(device),
            )
        return found

    def scratch(self, name: str, shape: torch.Size, device: torch.device) -> Tensor:
        """A float32 buffer of this shape: one per name and batch (as large as its largest chunk), that
        each layer writes into instead of allocating weights-sized memory again."""
        key = ("scratch", name, str(device))
        size = shape.numel()
        if key not in self._cache or self._cache[key].numel() < size:
            self._cache[key] = torch.empty(size, device=device)
        return self._cache[key][:size].view(shape)

    def additive_mask(self, call: AttentionCall, start: int, stop: int, keys: int) -> Tensor:
        """The model's mask for a chunk as added scores ``[batch, 1, rows, keys]`` (0 / -inf, or the
        model's own additive values), with every padded key and every padded query row blocked: a
        text sees only its own tokens, and a padded row gets zero weights (its softmax is NaN, set
        to 0). With ``call``'s causal and window structure folded in. Layers that share the model's
        mask share this too."""
        mask, padding = call.mask, call.key_padding
        key = ("mask", _identity(mask), _identity(padding), call.causal, call.window, start, stop, keys)
        found = self._cache.get(key)
        if found is None:
            device = call.q.device if call.q is not None else torch.device("cpu")
            valid = self.on("valid", device)
            real = valid[:, :keys]
            if padding is not None:
                real = real & padding[:, :keys].to(real.device).bool()
            blocked = ~(real[:, None, None, :] & valid[:, None, start:stop, None])  # [b, 1, r, keys]
            if call.causal or call.window is not None:
                allowed = build_mask(
                    stop - start,
                    keys,
                    causal=call.causal,
                    window=call.window,
                    query_positions=torch.arange(start, stop),
                    key_positions=torch.arange(keys),
                    device=device,
                )
                assert allowed is not None
                blocked = blocked | ~allowed
            part = _chunk(mask, start, stop, keys)
            if part is None:
                added = torch.zeros(blocked.shape, device=device).masked_fill_(blocked, float("-inf"))
            elif part.dtype == torch.bool:
                added = torch.zeros(torch.broadcast_shapes(part.shape, blocked.shape), device=device)
                added.masked_fill_(~part.to(device) | blocked, float("-inf"))
            else:
                shape = torch.broadcast_shapes(part.shape, blocked.shape)
                added = part.to(device, torch.float32).expand(shape).masked_fill(blocked, float("-inf"))
            found = self._cache[key] = (mask, padding, added)  # the mask kept: its id stays its own
        return found[2]

    def score_mask(self, call: AttentionCall, start: int, stop: int, keys: int) -> ScoreMask | None:
        """:meth:`additive_mask` for :func:`_weights_and_entropy` when it only allows or blocks (0, or
        at most half the float's lowest) and every real row may see some key; else None. Blocked
        scores become ``BLOCKED``, a finite number."""
        mask, padding = _identity(call.mask), _identity(call.key_padding)
        key = ("score mask", mask, padding, call.causal, call.window, start, stop, keys)
        if key not in self._cache:
            added = self.additive_mask(call, start, stop, keys)
            allowed = added == 0
            blocked = added <= torch.finfo(torch.float32).min / 2
            rows = self.on("valid", added.device)[:, None, start:stop]  # [b, 1, r]
            plain = bool((allowed | blocked).all()) and bool((allowed.any(-1) | ~rows).all())
            found = None
            if plain:
                scores = torch.zeros(added.shape, device=added.device).masked_fill_(blocked, BLOCKED)
                real = rows[..., None].float()  # [b, 1, r, 1]
                padded = int((~rows).sum())
                found = ScoreMask(scores, real if padded else None, padded)
            self._cache[key] = (call.mask, call.key_padding, found)
        return self._cache[key][2]

    def on(self, name: str, device: torch.device) -> Tensor:
        """A per-batch tensor (``valid``) on ``device``, moved once."""
        key = (name, str(device))
        if key not in self._cache:
            self._cache[key] = getattr(self, name).to(device)
        return self._cache[key]


@dataclass
class ScoreMask:
    """The mask :func:`_weights_and_entropy` adds: ``scores`` 0 or ``BLOCKED`` ``[b, 1, r, keys]``,
    and ``real`` 1 on the real query rows, 0 on the padded ones ``[b, 1, r, 1]``, that the weights
    are multiplied by (None when the chunk has no padded row), and how many rows are padded."""

    scores: Tensor
    real: Tensor | None
    padded_rows: int


@dataclass
class Chunk:
    """What a chunk of query rows reads of its batch, on the layers' device: ``positional`` the
    POSITIONAL features of each (row, key) ``[feature, rows·keys]`` (float64: ``|i - j|`` and whether
    ``j`` is ``i``, ``i - 1``, ``i + 1``); ``keyed`` the key features ``[batch, keys, KEYED]``
    (float64); ``padded`` the padded query rows ``[batch, 1, rows]``; ``pairs`` the detectors'
    (text, local row, key) ``[3, pairs]`` with each pair's column of COLUMNS; ``checked`` the local
    rows each text's self-check reads ``[batch, rows]`` (None: every row of every text), ``checks``
    whether any text samples a row of the chunk and ``unchecked`` the texts that sample none (None:
    none)."""

    positional: Tensor
    keyed: Tensor
    padded: Tensor
    pairs: Tensor
    columns: Tensor
    checked: Tensor | None
    checks: bool
    unchecked: Tensor | None
    _picked: dict[int, Tensor] = field(default_factory=dict)

    def picked(self, heads: int) -> Tensor:
        """The ``checked`` rows as indices into ``[batch·heads·rows]`` (each text's rows in each head)."""
        found = self._picked.get(heads)
        if found is None:
            assert self.checked is not None
            b, rows = self.checked.shape[0], self.padded.shape[-1]
            first = torch.arange(b * heads, device=self.checked.device).view(b, heads, 1) * rows
            found = self._picked[heads] = (first + self.checked[:, None]).view(-1)
        return found


@functools.lru_cache(maxsize=1 << 16)
def _is_punct(text: str) -> bool:  # stats' own test, remembered: a corpus repeats its punctuation
    return stats_is_punct(text)


def _text_positions(text: str, offsets: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """:func:`~attnviz.analysis.stats.text_positions`, with the punctuation test remembered."""
    special = [i for i, (start, end) in enumerate(offsets) if start == end and i != 0]
    punct = [i for i, (s, e) in enumerate(offsets) if e > s and _is_punct(text[s:e])]
    return special, punct


@functools.lru_cache(maxsize=4096)
def _sample_rows(n: int) -> list[int]:
    return sample_rows(n, SAMPLE_ROWS).tolist()


def _identity(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, str(t.device))


@torch.inference_mode()
def reduce_layer(
    call: AttentionCall, batch: BatchTexts, budget: int = BUDGET
) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """One layer of a padded batch: ``[column, head]`` float64 sums (COLUMNS) over every real query
    row of every text, and the self-check's ``{quantity: (max error, max |model|)}``, each
    ``[batch, head]``."""
    q, k, v, out = call.q, call.k, call.v, call.out
    assert q is not None and k is not None and v is not None
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    device = q.device
    sums = torch.zeros(len(COLUMNS), h, dtype=torch.float64, device=device)
    found: list[Tensor] = []  # per chunk: the check's [2, b, h] (max error, max |model|)
    chunks = list(query_chunks(n, n, b * h, budget=budget))
    causal = len(chunks) > 1 and _keys_after_blocked(call)
    plain = call.bias is None and call.sinks is None and call.softcap is None
    for start, stop in chunks:
        hi = stop if causal else n  # a causal chunk's rows see no key after its last row
        part = batch.chunk(start, stop, hi, device)
        mask = batch.score_mask(call, start, stop, hi) if plain else None
        if mask is not None:
            a, entropy = _weights_and_entropy(call, start, stop, hi, mask, batch.scratch)
        else:
            a, entropy = _weights_then_entropy(
                call, start, stop, hi, batch.additive_mask(call, start, stop, hi), batch.scratch
            )
        # a [b, h, r, hi]: the padded rows and keys 0, so each sum reads the real rows alone
        keyed = torch.bmm(a.sum(2).double(), part.keyed).sum(0)  # [h, KEYED]: mass on each key class
        by_position = a.sum(0, dtype=torch.float64).view(h, -1)  # [h, r·hi]: summed over the texts, exactly
        positional = torch.mm(part.positional, by_position.T)  # [POSITIONAL, h]: distance, self, previous, next
        entropy = entropy.masked_fill_(part.padded, 0).sum((0, 2))  # padded rows: NaN or not, 0
        sums[: -len(PATTERNS)] += torch.cat([keyed.T, positional, entropy[None]])
        t, i, j = part.pairs
        sums.index_add_(0, part.columns, a[t, :, i, j].double())  # the detectors' single keys
        if out is not None and part.checks:  # the self-check: A·V of the sampled rows against the kernel's
            theirs = out[:, start:stop]  # [b, r, h, d]
            if part.checked is not None:  # each text's own sampled rows, picked as whole rows of memory
                u = part.checked.shape[1]
                a = a.reshape(-1, hi).index_select(0, part.picked(h)).view(b, h, u, hi)
                theirs = theirs.reshape(-1, theirs[0, 0].numel()).index_select(0, part.picked(1))
                theirs = theirs.view(b, u, *out.shape[2:])
            theirs = theirs.float()  # [b, rows, h, d]
            mine = weighted_values(a, v[:, :, :hi])  # [b, h, rows, d]
            now = torch.stack([(mine - theirs.transpose(1, 2)).abs_().amax((2, 3)), theirs.abs().amax((1, 3))])
            found.append(now if part.unchecked is None else now.masked_fill_(part.unchecked[:, None], 0))
    errors = {}
    if found:
        err, scale = (found[0] if len(found) == 1 else torch.stack(found).amax(0)).cpu()
        errors["output"] = (err, scale)
    if call.weight_error is not None and call.weight_scale is not None:  # eager: measured while capturing
        errors["weights"] = (call.weight_error.float().cpu(), call.weight_scale.float().cpu())
    return sums.cpu(), errors


def _weights_and_entropy(
    call: AttentionCall, start: int, stop: int, hi: int, mask: ScoreMask, scratch: Callable[..., Tensor]
) -> tuple[Tensor, Tensor]:
    """The weights ``softmax(Q·Kᵀ·scale + mask)`` ``[b, h, r, hi]`` of rows ``start:stop`` (as
    :func:`~attnviz.attention.scaled_dot_product` computes them: one GEMM, the mask, a softmax; the
    padded rows then set to 0) and each row's entropy ``[b, h, r]`` (float64; NaN on padded rows)
    without a logarithm per weight. The mask adds nothing to an allowed score, so
    ``-log a_j = lse - s_j`` for every key with weight and the entropy is ``Σ a_j (lse - s_j)``:
    terms ≥ 0, summed without cancellation. ``lse = s_i - log a_ii`` is read at the row's own key
    (its diagonal), in float64; its float32 rounding is added back afterwards. A real row whose own
    key weighs under ``_SAFE_REF`` (its logarithm imprecise) sends the chunk to ``-Σ a log a``."""
    q, k = call.q, call.k
    assert q is not None and k is not None
    b, h, kv, dh = q.shape[0], q.shape[1], k.shape[1], q.shape[-1]
    r, groups = stop - start, h // kv
    shape = torch.Size((b, h, r, hi))
    q3 = q[:, :, start:stop].float().reshape(b * kv, groups * r, dh)  # GQA: a key/value head's queries at once
    k3 = k[:, :, :hi].float().reshape(b * kv, hi, dh)
    scores = scratch("scores", shape, q.device).view(b * kv, groups * r, hi)
    torch.baddbmm(scores, q3, k3.transpose(1, 2), beta=0, alpha=call.scaling, out=scores)
    scores = scores.view(shape).add_(mask.scores)
    a = torch.ops.aten._softmax.out(scores, -1, False, out=scratch("weights", shape, q.device))
    own = a.diagonal(start, -2, -1)  # [b, h, r]: each row's weight on its own key
    if mask.real is not None:  # a padded row's scores are all BLOCKED: its weights, even, become 0
        a.mul_(mask.real)
    if int(torch.count_nonzero(own < _SAFE_REF)) > mask.padded_rows * h:  # padded rows' are 0: a real one is tiny
        return a, _row_entropy(a, scratch)
    lse = scores.diagonal(start, -2, -1).double().sub_(own.double().log_())  # padded rows: inf
    lse32 = lse.float()
    entropy = torch.sub(lse32[..., None], scores, out=scores).mul_(a).sum(-1)  # blocked: (lse - BLOCKED)·0
    return a, entropy.double().add_(lse.sub_(lse32))  # each real row's weights sum to 1


def _weights_then_entropy(
    call: AttentionCall, start: int, stop: int, hi: int, mask: Tensor, scratch: Callable[..., Tensor]
) -> tuple[Tensor, Tensor]:
    """The weights by :func:`~attnviz.attention.scaled_dot_product` (any bias, sinks, soft-cap or
    mask) and each row's entropy from them (``-Σ a log a``, one logarithm per weight)."""
    q, k, v = call.q, call.k, call.v
    assert q is not None and k is not None and v is not None
    _, a = scaled_dot_product(
        q[:, :, start:stop],
        k[:, :, :hi],
        v[:, :, :hi, :0],  # the weights only
        scale=call.scaling,
        mask=mask,  # with the causal / window structure
        bias=_chunk(call.bias, start, stop, hi),
        sinks=call.sinks,
        softcap=call.softcap,
    )  # [b, h, r, hi]; padded rows and keys 0
    return a, _row_entropy(a, scratch)


def _row_entropy(a: Tensor, scratch: Callable[..., Tensor]) -> Tensor:  # [b, h, r] float64
    return torch.clamp_min(a, _TINY, out=scratch("work", a.shape, a.device)).log_().mul_(a).sum(-1).neg_().double()


def _chunk(t: Tensor | None, start: int, stop: int, keys: int) -> Tensor | None:
    """Rows ``start:stop`` and keys ``:keys`` of a ``[batch|1, head|1, query|1, key]`` mask or bias."""
    if t is None:
        return None
    return t[..., start:stop, :keys] if t.shape[-2] > 1 else t[..., :keys]


def _keys_after_blocked(call: AttentionCall) -> bool:
    """Whether no query row sees a key after itself (then a chunk of rows needs no later key)."""
    if call.causal:
        return True
    mask = call.mask
    if mask is None or mask.shape[-2] != mask.shape[-1]:
        return False
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    later = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).triu(1)
    return not bool((allowed & later).any())


def _raise_on_mismatch(
    reducer: BatchReducer, checks: list, texts: list[str], lengths: list[int], atol: float, rtol: float, dtype: str
) -> None:
    """ValidationError for the first text whose recomputation missed the kernel's numbers."""
    failed = None
    for _call, errors in checks:
        for err, scale in errors.values():
            bad = (err > atol + rtol * scale).any(1)
            if bool(bad.any()):
                index = int(bad.nonzero()[0])
                failed = index if failed is None else min(failed, index)
    if failed is None:
        return
    rows = []
    for call, errors in checks:
        for quantity, (err, scale) in errors.items():
            for head, (e, s) in enumerate(zip(err[failed].tolist(), scale[failed].tolist())):
                tol = atol + rtol * s
                rows.append(
                    {
                        "part": call.part,
                        "layer": call.layer,
                        "head": head,
                        "quantity": quantity,
                        "rows": len(sample_rows(lengths[failed])),
                        "max_abs_error": e,
                        "rel_error": e / s if s > 0 else e,
                        "tolerance": tol,
                        "passed": e <= tol,
                    }
                )
    backend = checks[0][0].backend
    report = ValidationReport(rows, reducer.name, backend, dtype, atol, rtol, sample=True)
    text = texts[failed]
    capture = None
    try:  # the failing text's own capture, for a look at what differs
        from .runner import capture as capture_text

        capture = capture_text(
            reducer.model,
            text,
            reducer.tokenizer,
            layers=reducer.layers,
            max_length=reducer.max_length,
            add_bos=reducer.add_bos,
            check="off",
        )
    except AttnvizError:
        pass
    shown = text if len(text) <= 60 else text[:57] + "…"
    raise ValidationError(
        f"attnviz could not reproduce what the model computed for the corpus text {shown!r}, so it will not "
        f"count these maps: {report}. The text's capture is on this error (.capture, .report); please report "
        "the model.",
        report,
        capture,
    )
