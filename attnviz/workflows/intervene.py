"""``intervene()`` and ``head_importance()``: what the model predicts when a head does something else.

:func:`intervene` captures the text (the attention as the model computed it and its prediction) —
or starts from a capture of it the caller holds, proved to be this model's and not tokenized again —
proves that attnviz's own SDPA in place of the model's kernel leaves the output unchanged on the
layers it will edit (so any change is the edit's doing), then runs the model with the edits —
capturing the attention as the edited model computed it — and returns both predictions.
:func:`head_importance` ablates every head in turn, a batch of heads per forward, and ranks the
heads by how much a continuation's log-probability drops.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data.capture import Capture
from ..data.predictions import Intervention, Prediction, continuation_ids, tokens_text
from ..edits import Edit, LayerPlan, editing, plan
from ..errors import ArgumentTypeError, InputError, OutOfRangeError, ValidationError
from .capture.from_capture import capture_inputs, verified_forward
from .capture.inputs import Encoded
from .capture.pipeline import Resolved, forward_inputs, resolve
from .capture.runner import TextInputs, capture_forward, encode_texts

__all__ = ["head_importance", "intervene"]

#: how far the no-edit path through attnviz's SDPA may move the output (max |Δ logit|), per dtype
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 5e-2, torch.bfloat16: 2e-1}


def _forward_inputs(resolved: Resolved, cap: Capture, copies: int = 1) -> dict[str, Tensor]:
    """The forward's inputs for the captured text (and target), ``copies`` times as one batch."""
    source: list[Encoded] = [(list(cap.token_ids), [], [])] * copies
    target: list[Encoded] | None = None if cap.target is None else [(list(cap.target.token_ids), [], [])] * copies
    return forward_inputs(resolved, source, target)[0]


def _main_output(output: Any) -> Tensor:  # [batch, pos, vocab or hidden]
    logits = getattr(output, "logits", None)
    return logits if logits is not None else output.last_hidden_state


def _position(cap: Capture, tokenizer: Any, at: int | None) -> int:
    seq = cap.target if cap.target is not None else cap.source
    n = len(seq.token_ids)
    if at is not None:
        if isinstance(at, bool) or not isinstance(at, int):
            raise ArgumentTypeError(f"at must be a token position, got {type(at).__name__}")
        if not -n <= at < n:
            raise OutOfRangeError(f"at={at} is out of range: the sequence has positions 0..{n - 1}")
        return at % n
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is not None and mask_id in seq.token_ids and cap.target is None:
        return seq.token_ids.index(mask_id)  # a masked language model predicts its [MASK]
    return n - 1


def _before(
    resolved: Resolved,
    text: str | Capture,
    what: str,
    *,
    target: str | None,
    add_bos: bool,
    layers: set[int] | None = None,
    check: str = "sample",
    target_name: str = "target",
) -> tuple[TextInputs, Capture, Any]:
    """(the inputs, the capture as the model is, the model's own output): the text tokenized and
    captured (``layers``, ``check``), or a :class:`Capture` of this model re-used as it is — its ids
    not tokenized again, one forward for the output, that proves the capture this model's."""
    if isinstance(text, Capture):
        if target is not None or add_bos:
            given = target_name if target is not None else "add_bos"
            raise InputError(
                f"{given}= reads a text, but {what} was given a capture, whose tokens are fixed (its target and "
                f"BOS included); leave {given} out, or pass the text"
            )
        inputs = capture_inputs(resolved, text, what)
        dtype = next(resolved.model.parameters()).dtype
        return inputs, text, verified_forward(resolved, text, inputs, TOLERANCE.get(dtype, 1e-4))
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a string or an attnviz.Capture, got {type(text).__name__}")
    inputs = encode_texts(resolved, text, target=target, add_bos=add_bos)
    [cap], output = capture_forward(resolved, inputs, layers=layers, check=check)
    return inputs, cap, output


def intervene(
    model: str | Path | nn.Module,
    text: str | Capture,
    edits: Iterable[Edit] | Edit,
    tokenizer: Any = None,
    *,
    target: str | None = None,
    at: int | None = None,
    add_bos: bool = False,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    check: str = "sample",
    tolerance: float | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Intervention:
    """Run ``text`` through ``model`` as it is and with ``edits`` (:mod:`attnviz.edits`); compare.

    >>> from attnviz import edits
    >>> out = attnviz.intervene("smollm2", "我家的小猫很可爱，它很", [
    ...     edits.knockout(layer=15, head=3, query="它", key="小猫")])
    >>> out.before.top_tokens(5), out.after.top_tokens(5)
    >>> out.delta_logprob("好"), out.capture_after.attention(15, head=3)

    - ``text``: the text, or a :class:`Capture` of it by this model (``attnviz.intervene(model, cap,
      edits)``): the capture is the "before" as it is, its tokens (and target) are not tokenized again,
      and one forward of its ids gives the prediction — and proves the capture this model's (a layer's
      Q and output must be the capture's), else :class:`CaptureMismatchError`, as for a generation's
      capture. ``target=`` and ``add_bos=`` belong to a text. The result equals the text's.
    - The prediction is the next token after the text (the decoder's ``target`` for an
      encoder-decoder model; the ``[MASK]`` for a masked LM; any position with ``at=``). A model
      without a language-model head (MiniLM) predicts no tokens: ``.similarity`` gives each token's
      cosine between its final hidden state edited and not.
    - Before editing, the edited layers run through attnviz's SDPA *without* an edit and the output
      must stay within ``tolerance`` of the model's own (max |Δ logit| ≤ 1e-4 in float32), else
      :class:`ValidationError`: a change in prediction is then the edit's, not the recomputation's.
      Ablation alone keeps the model's kernel and needs no such check.
    - ``on_progress(done, total)``: called after each forward it runs — the text as it is (or the proof of
      a capture), the recomputation's check when an edit reweights, the edited capture — ``total`` of them.
    - The model is unmodified afterwards, also when a forward raises.
    """
    resolved = resolve(model, tokenizer, device, dtype, attn_implementation)
    lm, tokenizer = resolved.model, resolved.tokenizer
    inputs, cap_before, output = _before(resolved, text, "intervene", target=target, add_bos=add_bos, check=check)
    plans = plan(edits, cap_before)
    edit_list = [edits] if isinstance(edits, Edit) else list(edits)
    reference = _main_output(output).float()
    position = _position(cap_before, tokenizer, at)

    # the no-edit path: attnviz's SDPA in place of the kernel on every layer that will be recomputed
    recomputed = {key: LayerPlan(p.n_heads, recompute=True) for key, p in plans.items() if p.reweights}
    forwards = 2 + bool(recomputed)  # before, [the recomputation's check,] after

    def report(done: int) -> None:
        if on_progress is not None:
            on_progress(done, forwards)

    report(1)
    error = 0.0
    dtype_now = next(lm.parameters()).dtype
    limit = tolerance if tolerance is not None else TOLERANCE.get(dtype_now, 1e-4)
    if recomputed:
        with torch.no_grad(), editing(lm, recomputed):
            same = _main_output(lm(**_forward_inputs(resolved, cap_before))).float()
        error = float((same - reference).abs().max())
        if not error <= limit:
            raise ValidationError(
                f"with attnviz's SDPA in place of the model's attention on layers {sorted(recomputed)} and no edit, "
                f"the output moved by {error:.2e} (tolerance {limit:.0e}); an edit's effect could not be told "
                "from the recomputation's, so attnviz will not report one. Try dtype='float32', or report the model."
            )
        report(2)

    with editing(lm, plans) as editor:
        [cap_after], output_after = capture_forward(resolved, inputs, check=check)
    report(forwards)
    missing = sorted(set(plans) - editor.ran)
    if missing:  # pragma: no cover - every planned layer exists in the capture the plan was made from
        raise InputError(f"the edits name layers that did not run: {missing}")
    edited = _main_output(output_after).float()
    cap_after.model["edits"] = [str(e) for e in edit_list]
    cap_after.model["edited_layers"] = [list(key) for key in sorted(plans)]
    cap_after.model["provenance"]["edits"] = "; ".join(cap_after.model["edits"])
    similarity = torch.nn.functional.cosine_similarity(edited[0], reference[0], dim=-1).cpu()
    has_head = getattr(output, "logits", None) is not None
    before = after = None
    if has_head:
        before = Prediction(torch.log_softmax(reference[0, position], -1).cpu(), position, tokenizer)
        after = Prediction(torch.log_softmax(edited[0, position], -1).cpu(), position, tokenizer)
    scorer = _scorer(resolved, cap_before, plans, edit_list, position) if has_head else None
    return Intervention(
        edit_list, cap_before, cap_after, before, after, similarity, error, limit, sorted(plans), scorer
    )


def _scorer(resolved: Resolved, cap: Capture, plans: dict, edit_list: list[Edit], position: int):
    """log P(ids after the text), plain and edited: one teacher-forced forward each."""

    def score(ids: list[int]) -> tuple[float, float]:
        refused = {e.kind for e in edit_list} & {"no_causal_mask", "patch"}
        if refused:
            raise InputError(
                f"a continuation of {len(ids)} tokens is scored by appending it to the text; with "
                f"{' and '.join(sorted(refused))} the text would then see (or be shaped by) the continuation. "
                "Score its first token, or give it as one token id"
            )
        inputs, rows, wanted = _continued(resolved, cap, ids, position)
        model = resolved.model
        results = []
        for edited in (False, True):
            with torch.no_grad(), editing(model, plans if edited else {}):
                logits = model(**inputs).logits
            results.append(float(_summed(logits, rows, wanted)[0]))
        return results[0], results[1]

    return score


def _continued(resolved: Resolved, cap: Capture, ids: list[int], position: int, copies: int = 1):
    """(forward inputs of the text followed by the continuation ``ids`` but its last, the rows
    whose predictions read it, the ids they should predict)."""
    seq = cap.target if cap.target is not None else cap.source
    if len(ids) > 1 and position != len(seq.token_ids) - 1:
        raise InputError("a continuation of several tokens follows the end of the text; at= reads one token")
    inputs = _forward_inputs(resolved, cap, copies)
    key, mask_key = (
        ("decoder_input_ids", "decoder_attention_mask") if cap.target is not None else ("input_ids", "attention_mask")
    )
    if len(ids) > 1:
        extra = torch.tensor([ids[:-1]] * copies, device=inputs[key].device, dtype=inputs[key].dtype)
        inputs[key] = torch.cat([inputs[key], extra], dim=1)
        inputs[mask_key] = torch.ones_like(inputs[key])
    return inputs, torch.arange(position, position + len(ids)), torch.tensor(ids)


def _summed(logits: Tensor, rows: Tensor, wanted: Tensor) -> Tensor:  # [batch]
    """Σ log P(wanted[i]) at rows[i], per batch item (float32, on the CPU)."""
    logprobs = torch.log_softmax(logits[:, rows.to(logits.device)].float(), -1).cpu()
    return logprobs[:, torch.arange(len(wanted)), wanted].sum(-1)


def head_importance(
    model: str | Path | nn.Module,
    text: str | Capture,
    target: str | int,
    tokenizer: Any = None,
    *,
    how: str = "zero",
    part: str | None = None,
    layers: Iterable[int] | None = None,
    at: int | None = None,
    add_bos: bool = False,
    batch_size: int = 16,
    progress: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    decoder_text: str | None = None,
):
    """Ablate each head in turn and rank the heads by how much log P(``target``) drops.

    ``target`` is the continuation: its text as it would follow ``text`` (several tokens are scored
    together, teacher-forced: log P of each given the ones before), a token id or a list of ids. Heads are
    ablated ``how="zero"`` (output set to 0) or ``"mean"`` (its mean over the positions read), ``batch_size``
    heads per forward (the text repeated, each copy with another head removed), with the model's
    own kernels throughout. Returns a DataFrame — ``part, layer, head, logprob, logprob_drop`` (the drop =
    log P before − after: how much the prediction needs that head) — sorted by the drop, with
    ``attrs["logprob"]`` the unedited log P and ``attrs["target"]``. ``on_progress(done, total)``
    is called after each batch; ``progress`` shows a bar on stderr. For an encoder-decoder model
    ``decoder_text`` is what the decoder has written so far (``target`` is its next token). ``text`` may
    be a :class:`Capture` of it by this model instead, as for :func:`intervene` (not tokenized again; its
    decoder's tokens are ``decoder_text``).
    """
    import pandas as pd  # deferred: pandas is heavy and only tables need it

    if how not in ("zero", "mean"):
        raise InputError(f"how must be 'zero' or 'mean', got {how!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}")
    resolved = resolve(model, tokenizer, device, dtype, attn_implementation)
    lm, tokenizer, name = resolved.model, resolved.tokenizer, resolved.name
    _, cap, output = _before(
        resolved,
        text,
        "head_importance",
        target=decoder_text,
        add_bos=add_bos,
        layers=resolved.layers([0]),
        check="off",
        target_name="decoder_text",
    )
    if getattr(output, "logits", None) is None:
        raise InputError(
            f"{name} has no language-model head, so no continuation has a probability to drop; "
            "head_importance needs a model that predicts tokens (a causal or seq2seq LM)"
        )
    position = _position(cap, tokenizer, at)
    vocab = int(output.logits.shape[-1])
    target_ids = continuation_ids(tokenizer, target, vocab)
    scored, rows_read, wanted_ids = _continued(resolved, cap, target_ids, position)
    with torch.no_grad():
        reference = float(_summed(lm(**scored).logits, rows_read, wanted_ids)[0])
    wanted = None if layers is None else set(layers)
    parts = [part] if part is not None else list(cap.parts)
    heads: list[tuple[str, int, int]] = []
    for p in parts:
        info = cap.info(p)
        for layer in range(int(info["n_layers"])):
            if wanted is None or layer in wanted:
                heads.extend((p, layer, h) for h in range(int(info["n_heads"])))
    if not heads:
        raise OutOfRangeError(f"no heads to ablate: layers {sorted(wanted or [])} are not in this model")
    rows = []
    bar = _progress_bar(len(heads), progress)
    try:
        for start in range(0, len(heads), batch_size):
            chunk = heads[start : start + batch_size]
            plans: dict[tuple[str, int], LayerPlan] = {}
            for item, (p, layer, h) in enumerate(chunk):
                info = cap.info(p)
                plans.setdefault((p, layer), LayerPlan(int(info["n_heads"]))).ablate[(item, h)] = how
            batch, _, _ = _continued(resolved, cap, target_ids, position, copies=len(chunk))
            with torch.no_grad(), editing(lm, plans):
                logprobs = _summed(lm(**batch).logits, rows_read, wanted_ids)
            for (p, layer, h), lp in zip(chunk, logprobs.tolist()):
                rows.append({"part": p, "layer": layer, "head": h, "logprob": lp, "logprob_drop": reference - lp})
            done = min(start + batch_size, len(heads))
            if bar is not None:
                bar.update(len(chunk))
            if on_progress is not None:
                on_progress(done, len(heads))
    finally:
        if bar is not None:
            bar.close()
    df = pd.DataFrame(rows).sort_values("logprob_drop", ascending=False, kind="stable").reset_index(drop=True)
    if len(parts) == 1:
        df = df.drop(columns="part")
    df.attrs.update(
        target=target if isinstance(target, str) else tokens_text(tokenizer, target_ids),
        target_ids=target_ids,
        logprob=reference,
        how=how,
        model=name,
    )
    return df


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm  # deferred: only a progress bar needs it
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return None
    return tqdm(total=total, desc="ablating heads", unit="head", file=sys.stderr)
