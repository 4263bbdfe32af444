"""Head statistics of a padded batch, reduced at once (what :func:`~attnviz.analysis.corpus_stats` runs).

:class:`BatchReducer` runs one forward under the taps and reduces each kept layer the moment its
kernel returns (:class:`ReducingRecorder`; families read through projection hooks after the
forward): one :func:`~attnviz.attention.scaled_dot_product` call recomputes the weights of every
text and head of the batch, with every padded key blocked (zero weight, whatever the model's own
mask says) and the padded query rows left out of every sum. From those weights, per layer:

- one A·V product (:func:`~attnviz.attention.weighted_values`) whose values carry three more
  columns, the key features ``first``, ``special``, ``punctuation``: each row's output for the
  self-check and its mass on those keys at once;
- ``distance`` and ``entropy`` row by row (one elementwise pass each), and the statistics that read
  single keys — ``self``, ``previous``, ``next`` and the detectors' (row, key) pairs — gathered;
- rows summed over keys in float32 (as :meth:`HeadStatsSums.add` sums a row), then over rows and
  texts in float64;
- the self-check: A·V of the sampled rows of each text (the first, the last and
  :data:`~attnviz.validate.SAMPLE_ROWS` more, as ``capture(check="sample")``) against the kernel's
  own output with the same tolerances (and an eager kernel's weights, compared while capturing); a
  mismatch raises :class:`~attnviz.ValidationError` with the text's own capture.

No per-text :class:`~attnviz.Capture` is made, and a layer's tensors go as soon as it is reduced.
The numbers are those of :func:`~attnviz.analysis.head_stats` over the same texts captured one by
one, to float rounding. Memory stays near :data:`BUDGET` floats of weights per step: long texts
are cut into chunks of query rows (a causal chunk computes only the keys its rows may see).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..attention import query_chunks, scaled_dot_product, weighted_values
from ..errors import AttnvizError, InputError, OutOfRangeError, ValidationError
from ..hooks import tap_projections
from ..inputs import Encoded, check_vocabulary, padded, tokenize
from ..records import check_calls
from ..runner import check_layers, max_positions, n_layers, resolve_model
from ..specs import PROJECTION_SPECS
from ..taps import _CALL_TENSORS, AttentionCall, Recorder, tap
from ..validate import SAMPLE_ROWS, TOLERANCES, ValidationReport, sample_rows
from .stats import DETECTORS, HeadStatsSums, pattern_rows, text_positions

__all__ = ["BUDGET", "BatchReducer"]

BUDGET = 1 << 22  # weights (floats) recomputed per step: a chunk of query rows of the whole batch
# detectors summed over their (row, key) pairs; previous_token is the "previous" statistic
PATTERNS = ("duplicate_token", "induction")
_TINY = torch.finfo(torch.float32).tiny


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
            for name in _CALL_TENSORS:  # this layer is done: its tensors go at once
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
        with torch.no_grad(), taps as recorder:
            if isinstance(recorder, ReducingRecorder):
                recorder.reduce = reduce
            model(**inputs)
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
COLUMNS = ("first", "special", "punctuation", "distance", "entropy", "self", "previous", "next") + PATTERNS
STATISTIC_COLUMNS = {**{name: COLUMNS.index(name) for name in COLUMNS}, "previous_token": COLUMNS.index("previous")}
assert set(STATISTIC_COLUMNS) >= set(DETECTORS)
KEYED = 3  # the first COLUMNS depend on the key alone: they ride along in A·V as extra value columns


@dataclass
class ReducingRecorder(Recorder):
    """A Recorder that hands each kept layer to ``reduce`` the moment its kernel returns (while its
    Q, K, V are still in the cache) instead of keeping it: one layer's tensors at a time."""

    reduce: Callable[[AttentionCall], None] | None = None

    def keep(self, call: AttentionCall) -> None:
        if self.reduce is None:
            super().keep(call)
            return
        self.reduce(call)
        self.calls.append(call)


class BatchTexts:
    """What the statistics read of a padded batch's texts: the real tokens, each key's features
    (first, special, punctuation), the scored rows of each statistic, the rows the self-check samples,
    and per chunk of query rows the distances and the detectors' (query, key) pairs."""

    def __init__(self, encoded: list, texts: list[str], *, detectors: bool) -> None:
        self.lengths = [len(ids) for ids, _, _ in encoded]
        self.detectors = detectors
        b, n = len(encoded), max(self.lengths)
        self.ids = torch.zeros(b, n, dtype=torch.long)
        self.valid = torch.zeros(b, n, dtype=torch.bool)  # real tokens (keys and query rows)
        self.keyed = torch.zeros(b, n, KEYED)  # per key: first, special (after the first), punctuation
        self.has_special = torch.zeros(b, dtype=torch.bool)
        self.sampled = torch.zeros(b, n, dtype=torch.bool)  # the rows the self-check compares
        for i, ((row, offsets, _), text) in enumerate(zip(encoded, texts)):
            m = len(row)
            self.ids[i, :m] = torch.tensor(row, dtype=torch.long)
            self.valid[i, :m] = True
            special, punct = text_positions(text, offsets)
            self.keyed[i, 0, 0] = 1.0
            self.keyed[i, special, 1] = 1.0
            self.keyed[i, punct, 2] = 1.0
            self.has_special[i] = bool(special)
            self.sampled[i, sample_rows(m, SAMPLE_ROWS)] = True
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

    def on(self, name: str, device: torch.device) -> Tensor:
        """A per-batch tensor (``valid``, ``keyed``, ``sampled``) on ``device``, moved once."""
        key = (name, str(device))
        if key not in self._cache:
            self._cache[key] = getattr(self, name).to(device)
        return self._cache[key]

    def chunk(self, start: int, stop: int, keys: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """For query rows ``start:stop`` and keys ``:keys``: ``|i - j|`` ``[rows, keys]``, and the
        (text, local row, key) pairs ``[3, pairs]`` of the statistics that read single keys — self,
        previous, next and the detectors' patterns — with each pair's column of COLUMNS."""
        key = ("chunk", start, stop, keys, str(device))
        if key not in self._cache:
            i = torch.arange(start, stop)[:, None]
            j = torch.arange(keys)[None, :]
            real = self.valid[:, start:stop, None] & self.valid[:, None, :keys]  # [b, r, keys]
            patterns = [(j == i)[None], (j == i - 1)[None], (j == i + 1)[None]]
            if self.detectors:
                rows = self.ids[:, start:stop, None]
                shifted = torch.zeros_like(self.ids[:, :keys])  # token j - 1 at key j
                shifted[:, 1:] = self.ids[:, : keys - 1]
                before = (j < i)[None]
                patterns.append((rows == self.ids[:, None, :keys]) & before)  # duplicate_token
                patterns.append((rows == shifted[:, None, :]) & before & (j >= 1)[None])  # induction
            found = [torch.stack(torch.nonzero(m & real, as_tuple=True)) for m in patterns]
            columns = torch.cat([torch.full((f.shape[1],), 5 + c) for c, f in enumerate(found)])
            distance = (i - j).abs().float()
            self._cache[key] = (distance.to(device), torch.cat(found, 1).to(device), columns.to(device))
        return self._cache[key]

    def scratch(self, shape: torch.Size, device: torch.device) -> Tensor:
        """A float32 buffer of this shape: one per batch (as large as its largest chunk), that each
        layer's elementwise steps write into instead of allocating weights-sized memory again."""
        key = ("scratch", str(device))
        size = shape.numel()
        if key not in self._cache or self._cache[key].numel() < size:
            self._cache[key] = torch.empty(size, device=device)
        return self._cache[key][:size].view(shape)

    def additive_mask(self, call: AttentionCall, start: int, stop: int, keys: int) -> Tensor:
        """The model's mask for a chunk as added scores (0 / -inf, or the model's own additive
        values), with every padded key blocked: a text sees only its own tokens. Layers that share
        the model's mask share this too."""
        mask, padding = call.mask, call.key_padding
        key = ("mask", _identity(mask), _identity(padding), start, stop, keys)
        found = self._cache.get(key)
        if found is None:
            device = call.q.device if call.q is not None else torch.device("cpu")
            real = self.on("valid", device)[:, :keys]
            if padding is not None:
                real = real & padding[:, :keys].to(real.device).bool()
            blocked = ~real[:, None, None, :]
            part = _chunk(mask, start, stop, keys)
            if part is None:
                added = torch.zeros(blocked.shape, device=device).masked_fill_(blocked, float("-inf"))
            elif part.dtype == torch.bool:
                added = torch.zeros(torch.broadcast_shapes(part.shape, blocked.shape), device=device)
                added.masked_fill_(~part.to(device) | blocked, float("-inf"))
            else:
                added = part.to(device, torch.float32).masked_fill(blocked, float("-inf"))
            found = self._cache[key] = (mask, padding, added)  # the mask kept: its id stays its own
        return found[2]


def _identity(t: Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, str(t.device))


def reduce_layer(
    call: AttentionCall, batch: BatchTexts, budget: int = BUDGET
) -> tuple[Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """One layer of a padded batch: ``[column, head]`` float64 sums (COLUMNS) over every real query
    row of every text, and the self-check's ``{quantity: (max error, max |model|)}``, each
    ``[batch, head]``."""
    q, k, v, out = call.q, call.k, call.v, call.out
    assert q is not None and k is not None and v is not None
    b, h, n = q.shape[0], q.shape[1], q.shape[2]
    kv = k.shape[1]
    device = q.device
    valid = batch.on("valid", device)
    keyed = batch.on("keyed", device)
    sampled = batch.on("sampled", device)
    d = 0 if out is None else v.shape[-1]
    sums = torch.zeros(len(COLUMNS), h, dtype=torch.float64, device=device)
    err = torch.zeros(b, h, device=device)
    scale = torch.zeros(b, h, device=device)
    chunks = list(query_chunks(n, n, b * h, budget=budget))
    causal = len(chunks) > 1 and _keys_after_blocked(call)
    structured = call.causal or call.window is not None  # positions place a chunk's causal / window band
    positions = torch.arange(n, device=device)
    for start, stop in chunks:
        hi = stop if causal else n  # a causal chunk's rows see no key after its last row
        _, a = scaled_dot_product(
            q[:, :, start:stop],
            k[:, :, :hi],
            v[:, :, :hi, :0],  # the weights only: A·V comes next, with the key features beside V
            scale=call.scaling,
            causal=call.causal,
            window=call.window,
            mask=batch.additive_mask(call, start, stop, hi),
            bias=_chunk(call.bias, start, stop, hi),
            sinks=call.sinks,
            softcap=call.softcap,
            query_positions=positions[start:stop] if structured else None,
            key_positions=positions[:hi] if structured else None,
        )  # [b, h, r, hi]; padded keys 0
        rows = valid[:, start:stop].to(torch.float64)  # padded query rows count nothing
        values = torch.cat([v[:, :, :hi, :d].to(torch.float32), keyed[:, None, :hi].expand(b, kv, hi, KEYED)], -1)
        av = weighted_values(a, values)  # [b, h, r, d + KEYED]: A·V and the keyed sums
        distance, (t, i, j), columns = batch.chunk(start, stop, hi, device)
        scratch = batch.scratch(a.shape, device)  # one buffer per batch and shape, for every layer
        distances = torch.mul(a, distance, out=scratch).sum(-1)
        plogp = torch.clamp_min(a, _TINY, out=scratch).log_().mul_(a).sum(-1)  # -entropy of each row
        per_row = torch.cat([av[..., d:], distances[..., None], plogp[..., None]], -1)
        sums[:5] += torch.einsum("bhrf,br->fh", per_row.double(), rows)
        sums.index_add_(0, columns, a[t, :, i, j].double())  # self, previous, next, detectors: single keys
        if out is not None:
            theirs = out[:, start:stop].transpose(1, 2)  # [b, h, r, d]
            found = torch.stack([(av[..., :d] - theirs).abs_().amax(-1), theirs.abs().amax(-1).float()])
            found = found.masked_fill_(~sampled[:, None, start:stop], 0).amax(-1)  # over the sampled rows
            torch.maximum(err, found[0], out=err)
            torch.maximum(scale, found[1], out=scale)
    sums[COLUMNS.index("entropy")].neg_()
    errors = {"output": (err.cpu(), scale.cpu())} if out is not None else {}
    if call.weight_error is not None and call.weight_scale is not None:  # eager: measured while capturing
        errors["weights"] = (call.weight_error.float().cpu(), call.weight_scale.float().cpu())
    return sums.cpu(), errors


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
        from ..runner import capture as capture_text

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
