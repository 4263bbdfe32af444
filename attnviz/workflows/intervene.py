"""``intervene()`` and ``head_importance()``: what the model predicts when a head does something else.

:func:`intervene` captures the text (the attention as the model computed it and its prediction),
proves that attnviz's own SDPA in place of the model's kernel leaves the output unchanged on the
layers it will edit (so any change is the edit's doing), then runs the model with the edits —
capturing the attention as the edited model computed it — and returns both predictions.
:func:`head_importance` ablates every head in turn, a batch of heads per forward, and ranks the
heads by how much a continuation's log-probability drops.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..data.capture import Capture
from ..edits import Edit, LayerPlan, editing, plan
from ..errors import ArgumentTypeError, InputError, OutOfRangeError, ValidationError
from .runner import capture, keep_outputs, resolve_model

__all__ = ["Intervention", "Prediction", "TokenChoice", "head_importance", "intervene"]

#: how far the no-edit path through attnviz's SDPA may move the output (max |Δ logit|), per dtype
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 5e-2, torch.bfloat16: 2e-1}


class TokenChoice(NamedTuple):
    token: str  # the token as text
    id: int
    probability: float


def token_text(tokenizer: Any, token_id: int) -> str:
    """A token as text; a byte-level piece of a character (half of 好) as its bytes, e.g. ``\\xe5\\xa5``."""
    if tokenizer is None:
        return str(token_id)
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    decoder = _byte_decoder()
    if isinstance(piece, str) and piece and all(c in decoder for c in piece):
        return bytes(decoder[c] for c in piece).decode("utf-8", errors="backslashreplace")
    return piece if isinstance(piece, str) else text


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's character for each byte (GPT-2's table: printable bytes as themselves, the
    rest shifted past 255), inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in chars.items()}


def continuation_ids(tokenizer: Any, continuation: str | int | list[int], vocab: int) -> list[int]:
    """The token ids of a continuation: its text as it would follow the text, an id, or a list of ids."""
    if isinstance(continuation, int) and not isinstance(continuation, bool):
        continuation = [continuation]
    if isinstance(continuation, list) and continuation and all(isinstance(i, int) for i in continuation):
        for i in continuation:
            if not 0 <= i < vocab:
                raise OutOfRangeError(f"token id {i} is out of range: the vocabulary has {vocab}")
        return list(continuation)
    if not isinstance(continuation, str) or not continuation:
        raise InputError(
            f"give the continuation as a non-empty string, a token id or a list of ids, got {continuation!r}"
        )
    if tokenizer is None:
        raise InputError("this model has no tokenizer here: give the continuation as token ids")
    ids = list(tokenizer(continuation, add_special_tokens=False)["input_ids"])
    if not ids:
        raise InputError(f"{continuation!r} has no tokens for this tokenizer")
    return [int(i) for i in ids]


@dataclass
class Prediction:
    """The model's distribution over the next token (or over the masked token) at one position."""

    logprobs: Tensor  # [vocab] float32 log-softmax
    position: int  # the position in the (decoder's) sequence whose prediction this is
    tokenizer: Any

    def top_tokens(self, k: int = 5) -> list[TokenChoice]:
        """The ``k`` most probable tokens, with their probabilities."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"k must be a whole number ≥ 1, got {k!r}")
        values, ids = self.logprobs.topk(min(k, self.logprobs.numel()))
        return [TokenChoice(self._text(int(i)), int(i), float(v.exp())) for v, i in zip(values, ids)]

    def _text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)

    def token_id(self, continuation: str | int) -> int:
        """The id of a continuation given as one token's text (as it would follow the text) or as an id."""
        ids = continuation_ids(self.tokenizer, continuation, self.logprobs.numel())
        if len(ids) != 1:
            pieces = [self._text(i) for i in ids]
            raise InputError(
                f"{continuation!r} is {len(ids)} tokens for this tokenizer ({pieces}); a Prediction is one next "
                "token — give one of them or its id, or ask the Intervention (out.delta_logprob(…)), which "
                "scores a continuation of several tokens"
            )
        return ids[0]

    def logprob(self, continuation: str | int) -> float:
        """log P(continuation) as the next token."""
        return float(self.logprobs[self.token_id(continuation)])

    def probability(self, continuation: str | int) -> float:
        return float(self.logprobs[self.token_id(continuation)].exp())


@dataclass
class Intervention:
    """A text run twice, as the model is and with edits: predictions and attention, before and after."""

    edits: list[Edit]
    capture_before: Capture  # the attention as the model computed it
    capture_after: Capture  # the attention as the edited model computed it (edited layers: the edited weights)
    before: Prediction | None  # None for a model without a language-model head (see similarity)
    after: Prediction | None
    similarity: Tensor  # [tokens] cosine between the final hidden states (or logits) after and before
    check_error: float  # max |Δ| of the output when attnviz's SDPA replaced the kernel without an edit
    check_tolerance: float
    edited_layers: list[tuple[str, int]]
    _score: Callable[[list[int]], tuple[float, float]] | None = field(default=None, repr=False)

    def logprob(self, continuation: str | int | list[int]) -> tuple[float, float]:
        """(before, after): log P(continuation | text), summed over its tokens (teacher-forced: one
        forward of text + continuation each way, edited and not; a one-token continuation is read
        from the predictions directly)."""
        before, after = self._predictions()
        ids = continuation_ids(before.tokenizer, continuation, before.logprobs.numel())
        if len(ids) == 1:
            return float(before.logprobs[ids[0]]), float(after.logprobs[ids[0]])
        assert self._score is not None
        return self._score(ids)

    def _predictions(self) -> tuple[Prediction, Prediction]:
        if self.before is None or self.after is None:
            raise InputError(
                f"{self.capture_before.model.get('name')} has no language-model head, so it predicts no tokens; "
                "see .similarity (cosine of each token's final hidden state, edited vs not)"
            )
        return self.before, self.after

    def delta_logprob(self, continuation: str | int | list[int]) -> float:
        """How the edits moved log P(continuation): after − before (negative: the edit made it less
        likely). A continuation of several tokens (好 is two byte pieces for SmolLM2) is scored whole."""
        before, after = self.logprob(continuation)
        return after - before

    def to_pandas(self, k: int = 5):
        """The top-``k`` next tokens before and after, side by side."""
        import pandas as pd

        before, after = self._predictions()
        rows = []
        for rank, (b, a) in enumerate(zip(before.top_tokens(k), after.top_tokens(k)), start=1):
            rows.append(
                {
                    "rank": rank,
                    "before": b.token,
                    "p_before": b.probability,
                    "after": a.token,
                    "p_after": a.probability,
                    "after_was": before.probability(a.id),
                }
            )
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        edits = "; ".join(map(str, self.edits))
        if self.before is not None and self.after is not None:
            b, a = self.before.top_tokens(1)[0], self.after.top_tokens(1)[0]
            change = f"next token {b.token!r} {b.probability:.2f} → {a.token!r} {a.probability:.2f}"
        else:
            change = f"final hidden states: cosine to the unedited ≥ {float(self.similarity.min()):.4f}"
        return (
            f"Intervention({self.capture_before.model.get('name')!r}, {edits}: {change}; "
            f"no-edit path max |Δ| {self.check_error:.1e} ≤ {self.check_tolerance:.0e})"
        )


def _forward_inputs(model: nn.Module, cap: Capture, copies: int = 1) -> dict[str, Tensor]:
    device = next(model.parameters()).device
    ids = torch.tensor([cap.token_ids] * copies, device=device)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if cap.target is not None:
        dec = torch.tensor([cap.target.token_ids] * copies, device=device)
        inputs.update(decoder_input_ids=dec, decoder_attention_mask=torch.ones_like(dec))
    if "use_cache" in _parameters(model):
        inputs["use_cache"] = False
    return inputs


def _parameters(model: nn.Module) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


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


def _load(model, tokenizer, device, dtype, attn_implementation):
    return resolve_model(model, tokenizer, device, dtype, attn_implementation)


def intervene(
    model: str | Path | nn.Module,
    text: str,
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
) -> Intervention:
    """Run ``text`` through ``model`` as it is and with ``edits`` (:mod:`attnviz.edits`); compare.

    >>> from attnviz import edits
    >>> out = attnviz.intervene("smollm2", "我家的小猫很可爱，它很", [
    ...     edits.knockout(layer=15, head=3, query="它", key="小猫")])
    >>> out.before.top_tokens(5), out.after.top_tokens(5)
    >>> out.delta_logprob("好"), out.capture_after.attention(15, head=3)

    - The prediction is the next token after the text (the decoder's ``target`` for an
      encoder-decoder model; the ``[MASK]`` for a masked LM; any position with ``at=``). A model
      without a language-model head (MiniLM) predicts no tokens: ``.similarity`` gives each token's
      cosine between its final hidden state edited and not.
    - Before editing, the edited layers run through attnviz's SDPA *without* an edit and the output
      must stay within ``tolerance`` of the model's own (max |Δ logit| ≤ 1e-4 in float32), else
      :class:`ValidationError`: a change in prediction is then the edit's, not the recomputation's.
      Ablation alone keeps the model's kernel and needs no such check.
    - The model is unmodified afterwards, also when a forward raises.
    """
    lm, tokenizer, _ = _load(model, tokenizer, device, dtype, attn_implementation)
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a string, got {type(text).__name__}")
    with keep_outputs() as kept:
        cap_before = capture(lm, text, tokenizer, target=target, add_bos=add_bos, check=check)
    assert isinstance(cap_before, Capture)
    plans = plan(edits, cap_before)
    edit_list = [edits] if isinstance(edits, Edit) else list(edits)
    reference = _main_output(kept[0]).float()
    position = _position(cap_before, tokenizer, at)

    # the no-edit path: attnviz's SDPA in place of the kernel on every layer that will be recomputed
    recomputed = {key: LayerPlan(p.n_heads, recompute=True) for key, p in plans.items() if p.reweights}
    error = 0.0
    dtype_now = next(lm.parameters()).dtype
    limit = tolerance if tolerance is not None else TOLERANCE.get(dtype_now, 1e-4)
    if recomputed:
        with torch.no_grad(), editing(lm, recomputed):
            same = _main_output(lm(**_forward_inputs(lm, cap_before))).float()
        error = float((same - reference).abs().max())
        if not error <= limit:
            raise ValidationError(
                f"with attnviz's SDPA in place of the model's attention on layers {sorted(recomputed)} and no edit, "
                f"the output moved by {error:.2e} (tolerance {limit:.0e}); an edit's effect could not be told "
                "from the recomputation's, so attnviz will not report one. Try dtype='float32', or report the model."
            )

    with keep_outputs() as kept_after, editing(lm, plans) as editor:
        cap_after = capture(lm, text, tokenizer, target=target, add_bos=add_bos, check=check)
    assert isinstance(cap_after, Capture)
    missing = sorted(set(plans) - editor.ran)
    if missing:  # pragma: no cover - every planned layer exists in the capture the plan was made from
        raise InputError(f"the edits name layers that did not run: {missing}")
    edited = _main_output(kept_after[0]).float()
    cap_after.model["edits"] = [str(e) for e in edit_list]
    cap_after.model["edited_layers"] = [list(key) for key in sorted(plans)]
    similarity = torch.nn.functional.cosine_similarity(edited[0], reference[0], dim=-1).cpu()
    has_head = getattr(kept[0], "logits", None) is not None
    before = after = None
    if has_head:
        before = Prediction(torch.log_softmax(reference[0, position], -1).cpu(), position, tokenizer)
        after = Prediction(torch.log_softmax(edited[0, position], -1).cpu(), position, tokenizer)
    scorer = _scorer(lm, cap_before, plans, edit_list, position) if has_head else None
    return Intervention(
        edit_list, cap_before, cap_after, before, after, similarity, error, limit, sorted(plans), scorer
    )


def _scorer(model: nn.Module, cap: Capture, plans: dict, edit_list: list[Edit], position: int):
    """log P(ids after the text), plain and edited: one teacher-forced forward each."""

    def score(ids: list[int]) -> tuple[float, float]:
        refused = {e.kind for e in edit_list} & {"no_causal_mask", "patch"}
        if refused:
            raise InputError(
                f"a continuation of {len(ids)} tokens is scored by appending it to the text; with "
                f"{' and '.join(sorted(refused))} the text would then see (or be shaped by) the continuation. "
                "Score its first token, or give it as one token id"
            )
        inputs, rows, wanted = _continued(model, cap, ids, position)
        results = []
        for edited in (False, True):
            with torch.no_grad(), editing(model, plans if edited else {}):
                logits = model(**inputs).logits
            results.append(float(_summed(logits, rows, wanted)[0]))
        return results[0], results[1]

    return score


def _continued(model: nn.Module, cap: Capture, ids: list[int], position: int, copies: int = 1):
    """(forward inputs of the text followed by the continuation ``ids`` but its last, the rows
    whose predictions read it, the ids they should predict)."""
    seq = cap.target if cap.target is not None else cap.source
    if len(ids) > 1 and position != len(seq.token_ids) - 1:
        raise InputError("a continuation of several tokens follows the end of the text; at= reads one token")
    inputs = _forward_inputs(model, cap, copies)
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
    text: str,
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
    ``decoder_text`` is what the decoder has written so far (``target`` is its next token).
    """
    import pandas as pd

    if how not in ("zero", "mean"):
        raise InputError(f"how must be 'zero' or 'mean', got {how!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}")
    lm, tokenizer, name = _load(model, tokenizer, device, dtype, attn_implementation)
    with keep_outputs() as kept:
        cap = capture(lm, text, tokenizer, target=decoder_text, add_bos=add_bos, layers=[0], check="off")
    assert isinstance(cap, Capture)
    if getattr(kept[0], "logits", None) is None:
        raise InputError(
            f"{name} has no language-model head, so no continuation has a probability to drop; "
            "head_importance needs a model that predicts tokens (a causal or seq2seq LM)"
        )
    position = _position(cap, tokenizer, at)
    vocab = int(kept[0].logits.shape[-1])
    target_ids = continuation_ids(tokenizer, target, vocab)
    inputs, rows_read, wanted_ids = _continued(lm, cap, target_ids, position)
    with torch.no_grad():
        reference = float(_summed(lm(**inputs).logits, rows_read, wanted_ids)[0])
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
            inputs, _, _ = _continued(lm, cap, target_ids, position, copies=len(chunk))
            with torch.no_grad(), editing(lm, plans):
                logprobs = _summed(lm(**inputs).logits, rows_read, wanted_ids)
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
        target=target if isinstance(target, str) else "".join(token_text(tokenizer, i) for i in target_ids),
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
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return None
    return tqdm(total=total, desc="ablating heads", unit="head", file=sys.stderr)
