"""``capture()``: run a model once on a text and turn what the taps recorded into Captures.

Tokenization (each text alone, right-padded here so the tokenizer is never reconfigured; the
target of an encoder-decoder model shifted right as the model does with labels), the forward
under :func:`attnviz.taps.tap_model`, the per-text cut of padded batches (each Capture owns only
its own rows), the records built from the recorded calls (:mod:`attnviz.records`), and the self-check every
capture runs before it is returned.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .capture import Capture, TokenSequence
from .errors import (
    ArgumentTypeError,
    EmptyTextError,
    InputError,
    InputTooLongError,
    ModelInTrainingModeError,
    OutOfRangeError,
    UnsupportedModelError,
)
from .models import load_model, resolve_dtype
from .records import build_records, check_calls, part_sizes
from .specs import RESERVED_POSITIONS, refusal, supported_families
from .taps import tap_model
from .validate import SAMPLE_ROWS, ValidationError, validate
from .words import offsets_from_tokens, words_from_offsets

__all__ = ["capture"]

CHECKS = ("sample", "full", "off")
Encoded = tuple[list[int], list[tuple[int, int]], list[str]]  # ids, offsets, tokens


def _max_positions(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value - RESERVED_POSITIONS.get(getattr(config, "model_type", ""), 0)
    return None


def _n_layers(config) -> int | None:
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


def _check_texts(text: Any, what: str = "text") -> list[str]:
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ArgumentTypeError(f"{what} must be a string or a non-empty list of strings, got {type(text).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ArgumentTypeError(f"{what}[{i}] must be a string, got {type(t).__name__}")
        if not t.strip():
            where = f"the {what}" if isinstance(text, str) else f"{what}[{i}]"
            raise EmptyTextError(f"{where} is empty or only whitespace; give at least one word")
    return list(texts)


def _bos_id(tokenizer) -> int | None:
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def _encode(tokenizer, text: str, kwargs: dict, *, target: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets; offsets rebuilt from the tokens when the tokenizer has none.
    A ``target`` is encoded as labels are (``text_target``: Marian's target vocabulary…)."""
    text_arg = {"text_target" if target else "text": text}
    try:
        enc = tokenizer(**text_arg, return_offsets_mapping=True, **kwargs)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, KeyError, TypeError, ValueError):  # slow (Python) tokenizers have no offsets
        pass
    enc = tokenizer(**text_arg, **kwargs)
    ids = list(enc["input_ids"])
    offsets = offsets_from_tokens(text, _surfaces(tokenizer, ids))
    if offsets is None:
        raise InputError(
            f"{type(tokenizer).__name__} gives no character offsets and attnviz could not find its tokens "
            "in the text; use the model's fast tokenizer (AutoTokenizer.from_pretrained(name, use_fast=True))"
        )
    return ids, offsets


def _surfaces(tokenizer, ids: list[int]) -> list[str | None]:
    """Each token's text for :func:`offsets_from_tokens`: None for special tokens, "" for a byte
    piece completed by the next one."""
    special = set(getattr(tokenizer, "all_special_ids", [])) - {getattr(tokenizer, "unk_token_id", None)}
    tokens = tokenizer.convert_ids_to_tokens(ids)
    out: list[str | None] = []
    pending: list[str] = []
    for i, token in zip(ids, tokens):
        if i in special:
            out.extend([""] * len(pending))
            pending = []
            out.append(None)
            continue
        pending.append(token)
        text = tokenizer.convert_tokens_to_string(pending)
        if ("\ufffd" in text or text == "") and len(pending) < 4:  # an incomplete UTF-8 character (shown as
            continue  # "\ufffd", or dropped): wait for its last byte
        out.extend([""] * (len(pending) - 1))
        out.append(text.removeprefix("##"))
        pending = []
    out.extend([""] * len(pending))
    return out


def _tokenize(
    tokenizer,
    texts: list[str],
    max_length: int | None,
    limit: int | None,
    model_name: str,
    add_bos: bool = False,
    what: str = "text",
) -> list[Encoded]:
    """Encode each text alone (no padding), then right-pad ourselves: the tokenizer stays untouched."""
    bos = _bos_id(tokenizer) if add_bos else None
    encoded = []
    for i, text in enumerate(texts):
        kwargs: dict = {"truncation": max_length is not None}
        if max_length is not None:
            kwargs["max_length"] = max_length
        ids, offsets = _encode(tokenizer, text, kwargs, target=what == "target")
        if max_length is not None and len(ids) > max_length:
            raise InputError(
                f"max_length={max_length} is shorter than the {len(ids)} tokens the tokenizer keeps for the "
                f"{what} (its special tokens cannot be cut); give max_length ≥ {len(ids)}"
            )
        starts_special = bool(offsets) and offsets[0][0] == offsets[0][1]  # [CLS], <s> …
        if add_bos and bos is None and not starts_special:
            raise InputError("add_bos=True but the tokenizer has neither a BOS nor an EOS token to prepend")
        if bos is not None and not starts_special and (not ids or ids[0] != bos):
            ids, offsets = [bos] + ids, [(0, 0)] + offsets
            if max_length is not None and len(ids) > max_length:
                ids, offsets = ids[:max_length], offsets[:max_length]
        if limit is not None and len(ids) > limit:
            which = f"The {what}" if len(texts) == 1 else f"{what.capitalize()} {i}"
            raise InputTooLongError(
                f"{which} has {len(ids):,} tokens; {model_name} accepts at most {limit:,}. "
                f"Shorten the {what} or pass max_length={limit} to truncate."
            )
        encoded.append((ids, offsets, tokenizer.convert_ids_to_tokens(ids)))
    return encoded


def _shift_right(model: nn.Module, labels: list[int]) -> list[int]:
    """The decoder input the model builds from ``labels`` (its start token, then labels[:-1])."""
    start = _decoder_start(model)  # a clear error first, where the model's own shift would fail
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if prepare is not None:
        return prepare(labels=torch.tensor([labels])).view(-1).tolist()
    return [start] + labels[:-1]


def _decoder_start(model: nn.Module) -> int:
    config = model.config
    for source in (getattr(model, "generation_config", None), config, getattr(config, "decoder", None)):
        value = getattr(source, "decoder_start_token_id", None)
        if isinstance(value, int):
            return value
    raise InputError(
        f"{type(model).__name__} names no decoder_start_token_id, so attnviz cannot tell what its decoder "
        "reads first; set model.config.decoder_start_token_id, or pass decoder_input_ids= yourself"
    )


def _ids_rows(ids: Tensor, what: str) -> list[Encoded]:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ArgumentTypeError(f"{what} must be a [batch, pos] integer tensor")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise EmptyTextError(f"{what} has shape {tuple(ids.shape)}: give at least one token")
    return [
        (row.tolist(), _spaced_offsets([str(t) for t in row.tolist()]), [str(t) for t in row.tolist()]) for row in ids
    ]


def _spaced_offsets(tokens: list[str]) -> list[tuple[int, int]]:
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    return offsets


def _padded(encoded: list[Encoded], device) -> tuple[Tensor, Tensor]:
    n = max(len(ids) for ids, _, _ in encoded)
    ids = torch.zeros(len(encoded), n, dtype=torch.long)
    mask = torch.zeros(len(encoded), n, dtype=torch.long)
    for b, (row, _, _) in enumerate(encoded):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[b, : len(row)] = 1
    return ids.to(device), mask.to(device)


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

    The model runs unmodified on whatever backend it has (eager, sdpa, flash, flex…); the taps are
    gone afterwards, also if forward raises.
    """
    if check not in CHECKS:
        raise InputError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise InputError(f"max_length must be a whole number ≥ 1, got {max_length!r}")
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
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    wanted = _check_layers(layers, _n_layers(config))
    limit = _max_positions(config)

    if input_ids is not None:
        if text is not None:
            raise InputError("pass either text or input_ids, not both")
        texts = None
        encoded = _ids_rows(input_ids, "input_ids")
        if limit is not None and input_ids.shape[1] > limit:
            raise InputTooLongError(f"input_ids has {input_ids.shape[1]:,} tokens; {name} accepts at most {limit:,}")
    else:
        if text is None:
            raise InputError("give a text to capture (or input_ids)")
        texts = _check_texts(text)
        if tokenizer is None:
            source = getattr(config, "_name_or_path", "") or "the model's name or folder"
            raise InputError(f"pass tokenizer= with a model object (e.g. AutoTokenizer.from_pretrained({source!r}))")
        if not callable(tokenizer):
            raise ArgumentTypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        encoded = _tokenize(tokenizer, texts, max_length, limit, name, add_bos)

    targets, decoded = _decoder_inputs(
        model, tokenizer, encoded, target, decoder_input_ids, encoder_decoder, max_length, limit, name
    )
    _check_vocabulary(model, encoded, "input_ids")
    if encoder_decoder:
        get_decoder: Any = getattr(model, "get_decoder", None)
        _check_vocabulary(get_decoder() if get_decoder is not None else model, decoded, "decoder input")
    model_device = next(model.parameters()).device
    ids, attention_mask = _padded(encoded, model_device)
    forward_kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": attention_mask}
    lengths = {"encoder": [len(e[0]) for e in encoded], "decoder": [len(e[0]) for e in encoded]}
    if encoder_decoder:
        dec_ids, dec_mask = _padded(decoded, model_device)
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
        model(**forward_kwargs)
    calls = recorder.calls
    check_calls(model, calls, encoder_decoder)
    kept = [c for c in calls if c.q is not None]
    if not kept:
        raise OutOfRangeError(
            f"none of layers {sorted(wanted or [])} ran; this model has {len(calls)} attention layers"
        )
    meta = {
        "name": name,
        "model_type": getattr(config, "model_type", None),
        "class": type(model).__name__,
        "backend": kept[0].backend,
        "dtype": str(kept[0].q.dtype).removeprefix("torch."),
        "device": str(model_device),
        "encoder_decoder": encoder_decoder,
        "parts": part_sizes(calls),
        "d_model": getattr(config, "hidden_size", None)
        or getattr(config, "n_embd", None)
        or getattr(config, "d_model", None),
        "max_positions": limit,
        "check": check,
    }
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
        _self_check(captures, check)
    return captures[0] if isinstance(text, str) or (texts is None and len(captures) == 1) else captures


def _decoder_inputs(model, tokenizer, encoded, target, decoder_input_ids, encoder_decoder, max_length, limit, name):
    """(target texts or None, the decoder's encoded inputs per item) for an encoder-decoder model."""
    if not encoder_decoder:
        if target is not None or decoder_input_ids is not None:
            raise InputError(
                f"{name} is not an encoder-decoder model: it reads one text; leave out target= and decoder_input_ids="
            )
        return None, []
    if target is not None and decoder_input_ids is not None:
        raise InputError("pass either target or decoder_input_ids, not both")
    if decoder_input_ids is not None:
        decoded = _ids_rows(decoder_input_ids, "decoder_input_ids")
        if len(decoded) != len(encoded):
            raise InputError(f"decoder_input_ids has {len(decoded)} rows for {len(encoded)} inputs")
        return None, decoded
    if target is None:
        start = _decoder_start(model)
        token = tokenizer.convert_ids_to_tokens([start])[0] if tokenizer is not None else str(start)
        return None, [([start], [(0, 0)], [token]) for _ in encoded]
    targets = _check_texts(target, "target")
    if len(targets) != len(encoded):
        raise InputError(f"{len(targets)} targets for {len(encoded)} texts; give one target per text")
    if tokenizer is None:
        raise InputError("a target needs the tokenizer; pass tokenizer= (or decoder_input_ids=)")
    decoded = []
    for labels, offsets, _ in _tokenize(tokenizer, targets, max_length, limit, name, what="target"):
        shifted = _shift_right(model, labels)
        shifted_offsets = [(0, 0)] + offsets[: len(shifted) - 1]
        decoded.append((shifted, shifted_offsets, tokenizer.convert_ids_to_tokens(shifted)))
    return targets, decoded


def _check_vocabulary(model: nn.Module, encoded: list[Encoded], what: str) -> None:
    """Ids the embedding has no row for fail deep inside the model: say so here."""
    get_embeddings: Any = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if get_embeddings is not None else None
    size = getattr(embeddings, "num_embeddings", None)
    if not isinstance(size, int):
        return
    for ids, _, _ in encoded:
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise InputError(
                f"{what} holds the id {bad[0]}, outside this model's vocabulary of {size:,}; use the model's "
                "own tokenizer (or ids below the vocabulary size)"
            )


def _self_check(captures: list[Capture], check: str) -> None:
    for i, cap in enumerate(captures):
        report = validate(cap, rows=SAMPLE_ROWS if check == "sample" else None)
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


def _check_layers(layers: Iterable[int] | None, n_layers: int | None) -> set[int] | None:
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
