"""``capture()``: run a model once on a text and turn what the taps recorded into Captures.

The inputs (:mod:`attnviz.workflows.inputs`: each text tokenized alone and right-padded here, the target of
an encoder-decoder model shifted right as the model does with labels), the forward
under :func:`attnviz.engine.taps.tap_model`, the per-text cut of padded batches (each Capture owns only
its own rows), the records built from the recorded calls (:mod:`attnviz.data.records`), and the self-check every
capture runs before it is returned.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data.capture import Capture, TokenSequence
from ..data.records import build_records, check_calls, part_sizes
from ..data.validate import SAMPLE_ROWS, ValidationError, validate
from ..data.words import words_from_offsets
from ..engine.specs import RESERVED_POSITIONS, refusal, supported_families
from ..engine.taps import AttentionCall, tap_model
from ..errors import (
    ArgumentTypeError,
    InputError,
    InputTooLongError,
    ModelInTrainingModeError,
    OutOfRangeError,
    UnsupportedModelError,
)
from .inputs import Encoded, check_texts, check_vocabulary, decoder_inputs, ids_rows, padded, tokenize
from .models import load_model, resolve_dtype

__all__ = ["capture"]

CHECKS = ("sample", "full", "off")


def max_positions(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value - RESERVED_POSITIONS.get(getattr(config, "model_type", ""), 0)
    return None


def n_layers(config) -> int | None:
    counts = [
        getattr(config, name, None)
        for name in (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "encoder_layers",
            "decoder_layers",
            "num_decoder_layers",
        )
    ]
    found = [c for c in counts if isinstance(c, int)]
    return max(found) if found else None


#: a list that capture() appends the model's forward output to (see keep_outputs)
_OUTPUTS: contextvars.ContextVar[list | None] = contextvars.ContextVar("attnviz_outputs", default=None)


@contextlib.contextmanager
def keep_outputs() -> Iterator[list]:
    """Within the block, :func:`capture` also appends its forward's output (logits…) to the list."""
    kept: list = []
    token = _OUTPUTS.set(kept)
    try:
        yield kept
    finally:
        _OUTPUTS.reset(token)


# ---------------------------------------------------------------- capture()
def capture(
    model: str | Path | nn.Module,
    text: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    *,
    target: str | Sequence[str] | None = None,
    layers: Iterable[int] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_length: int | None = None,
    keep_on_device: bool = False,
    attn_implementation: str | None = None,
    add_bos: bool = False,
    input_ids: Tensor | None = None,
    decoder_input_ids: Tensor | None = None,
    check: str = "sample",
    keep_weights: bool = False,
    tokenized: Sequence[Encoded] | None = None,
) -> Capture | list[Capture]:
    """Run ``model`` once and record Q, K, V and attention of every (or each given) layer and part.

    - ``model``: an embedded alias (``"smollm2"``, ``"minilm"``), a hub name, a local folder, or a
      transformers model object (then pass its ``tokenizer``). Names are loaded in eval mode, on
      ``device`` in ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``) with ``attn_implementation``.
    - ``text``: a string gives a :class:`Capture`; a list gives a list (one batched, padded forward;
      each capture holds only its own tokens). ``input_ids`` (``[batch, pos]``) replaces text and
      tokenizer for models without one.
    - ``target`` (encoder-decoder models): the decoder's text, teacher-forced as the model's forward
      does with labels (shifted right behind the decoder start token). Without it the decoder gets
      its start token only. ``decoder_input_ids`` gives the decoder's ids exactly instead.
    - ``layers``: capture only these layers (0-based, in every part).
    - ``max_length``: truncate to this many tokens instead of raising :class:`InputTooLongError`.
    - ``keep_on_device``: keep captured tensors on the model's device (default: move to CPU).
    - ``add_bos``: prepend the tokenizer's BOS token (its EOS if it has no BOS, as GPT-2) when it
      does not add one itself. Decoders park most attention on the first token (an attention
      sink); with a BOS there, the sink is not one of the text's words.
    - ``check``: ``"sample"`` (default) recomputes the first, the last and 32 more query rows of every
      layer and head and compares them with the kernel's own output; ``"full"`` compares every row;
      ``"off"`` skips it. A mismatch raises :class:`ValidationError` carrying the report and the
      capture.
    - ``keep_weights``: keep the n×n weights an eager backend returns (default: compare them with
      the recomputation while capturing and keep only the errors; with ``check="off"``, drop them).
    - ``tokenized``: the texts as :func:`attnviz.workflows.inputs.tokenize` encoded them (with this
      tokenizer and ``add_bos``), one per text, for a caller that had to count tokens first: they are
      not tokenized again.

    The model runs unmodified on whatever backend it has (eager, sdpa, flash, flex…); the taps are
    gone afterwards, also if forward raises.
    """
    if check not in CHECKS:
        raise InputError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise InputError(f"max_length must be a whole number ≥ 1, got {max_length!r}")
    model, tokenizer, name = resolve_model(model, tokenizer, device, dtype, attn_implementation)
    config = model.config
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    wanted = check_layers(layers, n_layers(config))
    limit = max_positions(config)

    if input_ids is not None:
        if text is not None:
            raise InputError("pass either text or input_ids, not both")
        texts = None
        encoded = ids_rows(input_ids, "input_ids")
        if limit is not None and input_ids.shape[1] > limit:
            raise InputTooLongError(f"input_ids has {input_ids.shape[1]:,} tokens; {name} accepts at most {limit:,}")
    else:
        if text is None:
            raise InputError("give a text to capture (or input_ids)")
        texts = check_texts(text)
        if tokenizer is None:
            source = getattr(config, "_name_or_path", "") or "the model's name or folder"
            raise InputError(f"pass tokenizer= with a model object (e.g. AutoTokenizer.from_pretrained({source!r}))")
        if not callable(tokenizer):
            raise ArgumentTypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        if tokenized is None:
            encoded = tokenize(tokenizer, texts, max_length, limit, name, add_bos)
        else:
            encoded = list(tokenized)
            if len(encoded) != len(texts):
                raise InputError(f"tokenized holds {len(encoded)} texts for {len(texts)}; give one per text")
            longest = max(len(ids) for ids, _, _ in encoded)
            if limit is not None and longest > limit:
                raise InputTooLongError(f"The text has {longest:,} tokens; {name} accepts at most {limit:,}")

    targets, decoded = decoder_inputs(
        model, tokenizer, encoded, target, decoder_input_ids, encoder_decoder, max_length, limit, name
    )
    check_vocabulary(model, encoded, "input_ids")
    if encoder_decoder:
        get_decoder: Any = getattr(model, "get_decoder", None)
        check_vocabulary(get_decoder() if get_decoder is not None else model, decoded, "decoder input")
    model_device = next(model.parameters()).device
    ids, attention_mask = padded(encoded, model_device)
    forward_kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": attention_mask}
    lengths = {"encoder": [len(e[0]) for e in encoded], "decoder": [len(e[0]) for e in encoded]}
    if encoder_decoder:
        dec_ids, dec_mask = padded(decoded, model_device)
        forward_kwargs.update(decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
        lengths.update(decoder=[len(d[0]) for d in decoded], cross=[len(d[0]) for d in decoded])
    if "use_cache" in _forward_parameters(model):
        forward_kwargs["use_cache"] = False

    weight_mode = "keep" if keep_weights else "drop" if check == "off" else "compare"
    with (
        torch.no_grad(),
        tap_model(
            model, layers=wanted, to_cpu=not keep_on_device, weight_mode=weight_mode, lengths=lengths
        ) as recorder,
    ):
        output = model(**forward_kwargs)
    kept_outputs = _OUTPUTS.get()
    if kept_outputs is not None:
        kept_outputs.append(output)
    calls = recorder.calls
    check_calls(model, calls, encoder_decoder)
    kept = [c for c in calls if c.q is not None]
    if not kept:
        raise OutOfRangeError(
            f"none of layers {sorted(wanted or [])} ran; this model has {len(calls)} attention layers"
        )
    meta = capture_meta(model, name, kept[0], part_sizes(calls), limit, check)
    captures = []
    for b, (row, offsets, tokens) in enumerate(encoded):
        the_text = texts[b] if texts is not None else " ".join(tokens)
        n_src = len(row)
        n_tgt = len(decoded[b][0]) if encoder_decoder else n_src
        cut = {"encoder": (n_src, n_src), "decoder": (n_tgt, n_tgt), "cross": (n_tgt, n_src)}
        target_seq = None
        if encoder_decoder:
            t_ids, t_offsets, t_tokens = decoded[b]
            t_text = targets[b] if targets is not None else " ".join(t_tokens)
            target_seq = TokenSequence(
                t_text, list(t_tokens), list(t_ids), list(t_offsets), words_from_offsets(t_text, t_offsets, t_tokens)
            )
        source = TokenSequence(
            the_text, list(tokens), list(row), list(offsets), words_from_offsets(the_text, offsets, tokens)
        )
        captures.append(Capture.of(source, build_records(kept, b, cut, len(encoded) > 1), dict(meta), target_seq))
    if check != "off":
        self_check(captures, check)
    return captures[0] if isinstance(text, str) or (texts is None and len(captures) == 1) else captures


def resolve_model(
    model: str | Path | nn.Module, tokenizer: Any, device, dtype, attn_implementation
) -> tuple[nn.Module, Any, str]:
    """(model in eval mode, tokenizer, name): a name is loaded; a model object is checked."""
    name = None
    if isinstance(model, (str, Path)):
        name = str(model)
        model, loaded_tokenizer = load_model(name, device=device, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    elif isinstance(model, nn.Module):
        _check_model_placement(model, device, dtype, attn_implementation)
    else:
        raise ArgumentTypeError(f"model must be a name, a path or a transformers model, got {type(model).__name__}")
    if model.training:
        raise ModelInTrainingModeError(
            f"{type(model).__name__} is in training mode: dropout would make every capture different. "
            "Call model.eval() first."
        )
    config = model.config
    name = name or getattr(config, "_name_or_path", "") or type(model).__name__
    reason = refusal(config)
    if reason:
        raise UnsupportedModelError(f"{reason}. attnviz supports {supported_families()}")
    return model, tokenizer, name


def capture_meta(model: nn.Module, name: str, first: AttentionCall, parts: dict, limit: int | None, check: str) -> dict:
    """What a capture records about the model that made it (``Capture.model``)."""
    config = model.config
    assert first.q is not None
    return {
        "name": name,
        "model_type": getattr(config, "model_type", None),
        "class": type(model).__name__,
        "backend": first.backend,
        "dtype": str(first.q.dtype).removeprefix("torch."),
        "device": str(next(model.parameters()).device),
        "encoder_decoder": bool(getattr(config, "is_encoder_decoder", False)),
        "parts": parts,
        "d_model": getattr(config, "hidden_size", None)
        or getattr(config, "n_embd", None)
        or getattr(config, "d_model", None),
        "max_positions": limit,
        "check": check,
    }


def self_check(captures: list[Capture], check: str, rows: dict[str, Tensor] | None = None) -> None:
    """Validate each capture (``rows``: per part, else a sample or all); raise :class:`ValidationError` on a mismatch."""
    for i, cap in enumerate(captures):
        report = validate(cap, rows=rows if rows is not None else SAMPLE_ROWS if check == "sample" else None)
        cap.model["check_error"] = max((r["max_abs_error"] / r["tolerance"] for r in report.rows), default=0.0)
        if not report.passed:
            which = "" if len(captures) == 1 else f" (text {i})"
            raise ValidationError(
                f"attnviz could not reproduce what the model computed{which}, so it will not show these maps: "
                f"{report}. The capture is on this error (.capture, .report); please report the model.",
                report,
                captures[0] if len(captures) == 1 else captures,
            )


def _forward_parameters(model: nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def check_layers(layers: Iterable[int] | None, n_layers: int | None) -> set[int] | None:
    if layers is None:
        return None
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    try:
        wanted = set(layers)
    except TypeError as err:
        raise ArgumentTypeError(f"layers must be a list of ints or None, got {type(layers).__name__}") from err
    if not wanted:
        raise InputError("layers=[] would capture nothing; leave layers=None to capture every layer")
    for layer in wanted:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ArgumentTypeError(f"layers must be ints, got {layer!r}")
        if layer < 0 or (n_layers is not None and layer >= n_layers):
            top = f"0..{n_layers - 1}" if n_layers is not None else "≥ 0"
            raise OutOfRangeError(f"layer {layer} is out of range: this model has layers {top}")
    return wanted


def _check_model_placement(model: nn.Module, device, dtype, attn_implementation) -> None:
    param = next(model.parameters(), None)
    if param is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no parameters; is it a transformers model?")
    if not hasattr(model, "config"):
        raise UnsupportedModelError(f"{type(model).__name__} has no .config; attnviz captures transformers models")
    wanted_dtype = resolve_dtype(dtype)
    if device is not None and torch.device(device).type != param.device.type:
        raise InputError(
            f"the model is on {param.device} but device={device!r} was given; move it yourself "
            f"(model.to({str(device)!r})) or pass a model name so attnviz loads it there"
        )
    if wanted_dtype is not None and wanted_dtype != param.dtype:
        raise InputError(
            f"the model is in {param.dtype} but dtype={dtype!r} was given; convert it yourself "
            "or pass a model name so attnviz loads it in that dtype"
        )
    if attn_implementation is not None and attn_implementation != getattr(model.config, "_attn_implementation", None):
        raise InputError(
            "attn_implementation only applies when attnviz loads the model; for a model object use "
            "model.set_attn_implementation(...) yourself (attnviz captures every backend anyway)"
        )
