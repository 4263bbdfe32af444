"""Head statistics of a padded batch, reduced at once (what :func:`~attnviz.analysis.corpus_stats` runs).

:class:`BatchReducer` takes the pipeline's front half (:mod:`attnviz.workflows.capture.pipeline`: the model
resolved, the batch's forward inputs, the forward under the taps, the checked calls) and, instead
of keeping records, reduces each kept layer the moment its kernel returns (:class:`ReducingRecorder`;
families read through projection hooks after the forward) with
:func:`~attnviz.analysis.layer_reduction.reduce_layer` over the batch's
:class:`~attnviz.analysis.batch_texts.BatchTexts`. The self-check compares the sampled rows of each
text (the first, the last and :data:`~attnviz.data.validate.SAMPLE_ROWS` more, as
``capture(check="sample")``) with the kernel's own output at the same tolerances; a mismatch raises
:class:`~attnviz.ValidationError` with the text's own capture.

Nothing the model computes after the last wanted layer's attention feeds a statistic, so the
forward stops there (unless a module has forward hooks, as accelerate's offloading does). No
per-text :class:`~attnviz.Capture` is made, and a layer's tensors go as soon as it is reduced.
The numbers are those of :func:`~attnviz.analysis.head_stats` over the same texts captured one by
one, to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...analysis.batch_texts import STATISTIC_COLUMNS, BatchTexts
from ...analysis.head_tally import HeadTally
from ...analysis.layer_reduction import BUDGET, PickedRows, reduce_layer, wanted_columns
from ...analysis.stats import HeadStatsSums
from ...attention import Scratch
from ...data.validate import TOLERANCES, ValidationReport, sample_rows
from ...engine.projections import OutputProjection, output_projection
from ...engine.taps import CALL_TENSORS, AttentionCall, Recorder, tap
from ...errors import AttnvizError, InputError, ValidationError
from ...families import PROJECTION_SPECS
from ..capture.inputs import Encoded, tokenize
from ..capture.pipeline import forward_inputs, n_layers, resolve, tapped
from ..capture.runner import capture_forward, encode_texts

__all__ = ["BatchReducer", "ReducingRecorder"]


class BatchReducer:
    """Adds batches of texts to :class:`HeadStatsSums`, each batch in one forward and one reduction
    per layer. One-stack models (encoders, decoders); an encoder-decoder needs per-text captures."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        layers: Iterable[int] | None = None,
        max_length: int | None = None,
        add_bos: bool = False,
        part: str | None = None,
        detectors: bool = True,
        moved: bool = True,
        statistics: bool | Collection[str] = True,
        patterns: bool = False,
        budget: int = BUDGET,
    ) -> None:
        self.resolved = resolved = resolve(model, tokenizer)
        if resolved.encoder_decoder:
            raise InputError("BatchReducer reduces one-stack models; an encoder-decoder's parts need captures")
        model = resolved.model
        self.model, self.tokenizer, self.name = model, resolved.tokenizer, resolved.name
        self.layers = resolved.layers(layers)
        self.limit = resolved.limit
        self.max_length = max_length
        self.add_bos = add_bos
        self.part = part
        self.detectors = detectors
        self.moved = moved  # False: no value norms read (the _moved sums stay NaN), for a caller that needs none
        # False: every sum NaN — the check and the picked rows only (probe sets); names: those statistics
        # alone, the others NaN (the head atlas' six), checked here before any forward
        if isinstance(statistics, str):
            statistics = (statistics,)
        wanted_columns(statistics, patterns)
        self.statistics = statistics if isinstance(statistics, bool) else tuple(statistics)
        self.patterns = patterns  # with statistics=False, the detectors' sums still added (the atlas' induction)
        self.budget = budget
        self.inline = getattr(model.config, "model_type", "") in PROJECTION_SPECS  # reduced after the forward
        # The forward stops after the last wanted layer's attention unless a module's hooks (forward
        # hooks, accelerate's offloading) may expect every forward they start to finish.
        count = n_layers(model.config)
        hooked = any(m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook") for m in model.modules())
        wanted = self.layers if self.layers is not None else set(range(count)) if count else None
        self.stop_after = None if hooked or not wanted else frozenset(wanted)
        self.projections: dict[str, OutputProjection | None] = {}  # attention module -> its output projection
        # the weights-sized buffers every batch's layers write into, kept from batch to batch: on the CPU a
        # batch's own would be fresh pages from the system each time, faulted in again (and the freed ones
        # make the model's own allocations fault too)
        self.scratch = Scratch()

    def value_norms(self, call: AttentionCall) -> Tensor | None:  # [batch, head, key]
        """‖f_h(x_j)‖ of every text, head and key of a call, from its module's output projection
        (what a capture keeps as ``LayerRecord.value_norms``), or None where the module has none
        attnviz can read (those layers' ``_moved`` statistics are NaN)."""
        assert call.q is not None and call.v is not None
        if call.name not in self.projections:
            self.projections[call.name] = output_projection(self.model, call.name, call.q.shape[1], call.v.shape[-1])
        projection = self.projections[call.name]
        if projection is None:
            return None
        return torch.stack([projection.value_dots(v, 1)[..., 0] for v in call.v]).sqrt_()

    def encode(self, text: str) -> Encoded:
        """One text tokenized as :meth:`add` tokenizes it, but never cut (its full length)."""
        return tokenize(self.tokenizer, [text], None, None, self.name, self.add_bos)[0]

    def add(
        self,
        sums: HeadStatsSums | None,
        texts: list[str],
        given: list[Encoded | None] | None = None,
        picked: PickedRows | None = None,
        tally: HeadTally | None = None,
    ) -> tuple[HeadStatsSums, list[int]]:
        """Capture ``texts`` in one padded forward and add them to ``sums`` (made on the first call);
        returns the sums and each text's token count. ``given``: texts already tokenized by
        :meth:`encode` (None where not, or where the text must be cut at ``max_length``). ``picked``:
        query rows of each text whose weights every layer also keeps whole (:class:`PickedRows`).
        ``tally``: where each row's maximum falls, added in the same reduction (:class:`HeadTally`)."""
        model = self.model
        known: list[Encoded | None] = list(given) if given is not None else [None] * len(texts)
        missing = [text for text, enc in zip(texts, known) if enc is None]
        made = iter(tokenize(self.tokenizer, missing, self.max_length, self.limit, self.name, self.add_bos))
        encoded: list[Encoded] = [enc if enc is not None else next(made) for enc in known]
        inputs, lengths_by_part = forward_inputs(self.resolved, encoded)
        lengths = lengths_by_part["encoder"]
        batch = BatchTexts(encoded, texts, detectors=self.detectors, scratch=self.scratch)
        if tally is not None:
            tally.batch(batch.ids, texts)
        reduced: list[tuple[AttentionCall, Tensor, dict[str, tuple[Tensor, Tensor]]]] = []
        dtypes: set[str] = set()

        def reduce(call: AttentionCall) -> None:
            assert call.q is not None
            dtypes.add(str(call.q.dtype).removeprefix("torch."))
            norms = self.value_norms(call) if self.moved else None
            values, errors = reduce_layer(
                call, batch, self.budget, norms, picked, self.statistics, tally, self.patterns
            )
            reduced.append((call, values, errors))
            for name in CALL_TENSORS:  # this layer is done: its tensors go at once
                setattr(call, name, None)

        def run(recorder: Recorder) -> None:
            assert isinstance(recorder, ReducingRecorder)
            if not self.inline:  # the inline families' layers are reduced after the forward
                recorder.reduce = reduce
                recorder.awaited = None if self.stop_after is None else set(self.stop_after)
            try:
                model(**inputs)
            except _LastLayerReduced:
                pass

        taps = tap(
            model,
            layers=self.layers,
            keep_on_device=True,
            weight_mode="compare",
            lengths=lengths_by_part,
            recorder_class=ReducingRecorder,
        )
        with torch.inference_mode():  # nothing here is ever differentiated: no autograd bookkeeping
            recorder, _ = tapped(self.resolved, taps, run, self.layers)
            for call in recorder.calls:
                if call.q is not None:
                    reduce(call)
            if tally is not None:
                tally.flush()  # what the tally read of this batch's layers, added for all of them at once
        calls = recorder.calls
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


@dataclass
class ReducingRecorder(Recorder):
    """A Recorder that hands each kept layer to ``reduce`` the moment its kernel returns (while its
    Q, K, V are still in the cache) instead of keeping it: one layer's tensors at a time."""

    reduce: Callable[[AttentionCall], None] | None = None
    awaited: set[int] | None = None  # layers still to come; once none is left the forward stops (None: never)
    proves_projections: ClassVar[bool] = False  # no record is made: nothing reads the projections' rows
    reads_in_forward: ClassVar[bool] = True  # each layer is reduced as its kernel returns

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
        inputs = encode_texts(reducer.resolved, text, max_length=reducer.max_length, add_bos=reducer.add_bos)
        capture = capture_forward(reducer.resolved, inputs, layers=reducer.layers, check="off")[0][0]
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
