"""``capture()``: run a model once on a text and turn what the taps recorded into Captures.

Tokenization (each text alone, right-padded here so the tokenizer is never reconfigured), the
forward under :func:`attnviz.taps.tap`, and the per-text trimming of padded batches, with the
model's mask described as causal flag + sliding window (or kept whole when it is neither).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .attention import build_mask
from .capture import Capture, LayerRecord
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
from .specs import supported_families
from .taps import AttentionCall, tap_model
from .words import words_from_offsets

__all__ = ["capture"]


def _max_positions(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value - 2 if getattr(config, "model_type", "") in {"roberta", "xlm-roberta"} else value
    return None


def _n_layers(config) -> int | None:
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _check_texts(text: Any) -> list[str]:
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ArgumentTypeError(f"text must be a string or a non-empty list of strings, got {type(text).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ArgumentTypeError(f"text[{i}] must be a string, got {type(t).__name__}")
        if not t.strip():
            where = "the text" if isinstance(text, str) else f"text[{i}]"
            raise EmptyTextError(f"{where} is empty or only whitespace; give at least one word")
    return list(texts)


def _bos_id(tokenizer) -> int | None:
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def _tokenize(
    tokenizer, texts: list[str], max_length: int | None, limit: int | None, model_name: str, add_bos: bool = False
):
    """Encode each text alone (no padding), then right-pad ourselves: the tokenizer stays untouched."""
    bos = _bos_id(tokenizer) if add_bos else None
    encoded = []
    for i, text in enumerate(texts):
        kwargs: dict = {"truncation": max_length is not None}
        if max_length is not None:
            kwargs["max_length"] = max_length
        try:
            enc = tokenizer(text, return_offsets_mapping=True, **kwargs)
            offsets = [tuple(o) for o in enc["offset_mapping"]]
        except NotImplementedError:  # slow (Python) tokenizers have no offsets
            enc = tokenizer(text, **kwargs)
            offsets = [(0, 0)] * len(enc["input_ids"])
        ids = list(enc["input_ids"])
        starts_special = bool(offsets) and offsets[0][0] == offsets[0][1]  # [CLS], <s> …
        if add_bos and bos is None and not starts_special:
            raise InputError("add_bos=True but the tokenizer has neither a BOS nor an EOS token to prepend")
        if bos is not None and not starts_special and (not ids or ids[0] != bos):
            ids, offsets = [bos] + ids, [(0, 0)] + offsets
            if max_length is not None and len(ids) > max_length:
                ids, offsets = ids[:max_length], offsets[:max_length]
        if limit is not None and len(ids) > limit:
            which = "The text" if len(texts) == 1 else f"Text {i}"
            raise InputTooLongError(
                f"{which} has {len(ids):,} tokens; {model_name} accepts at most {limit:,}. "
                f"Shorten the text or pass max_length={limit} to truncate."
            )
        encoded.append((ids, offsets, tokenizer.convert_ids_to_tokens(ids)))
    return encoded


def _layer_mask(call: AttentionCall, b: int, idx: Tensor, cache: dict) -> tuple[bool, int | None, Tensor | None]:
    """(causal, window, custom mask) describing the mask the kernel applied to item ``b``."""
    n = len(idx)
    if call.mask is None:
        return call.causal and n > 1, call.window, None
    key = (id(call.mask), call.window)
    if key not in cache:
        raw = call.mask[b if call.mask.shape[0] > 1 else 0, 0][idx][:, idx]
        additive = raw.is_floating_point() and bool(((raw != 0) & (raw > torch.finfo(raw.dtype).min / 2)).any())
        if additive or call.mask.shape[1] > 1:  # a bias (ALiBi-like) or per-head mask: keep it as given
            cache[key] = (False, None, raw)
        else:
            allowed = raw > torch.finfo(raw.dtype).min / 2 if raw.is_floating_point() else raw.bool()
            causal = not bool(torch.triu(allowed, diagonal=1).any())
            window = call.window if causal else None
            structural = build_mask(n, n, causal=causal, window=window, device=allowed.device)
            matches = structural is None and bool(allowed.all()) or (
                structural is not None and torch.equal(structural[0, 0], allowed)
            )
            if matches:
                cache[key] = (causal, window, None)
            elif causal and call.window is None and (w := _fits_window(allowed)) is not None:
                cache[key] = (True, w, None)
            else:
                cache[key] = (causal, window, allowed)
    return cache[key]


def _fits_window(allowed: Tensor) -> int | None:
    """The sliding window a causal mask implements, if it is one."""
    n = allowed.shape[-1]
    w = int(allowed.sum(-1).max())
    structural = build_mask(n, n, causal=True, window=w, device=allowed.device)
    return w if structural is not None and torch.equal(structural[0, 0], allowed) else None


def _records(calls: list[AttentionCall], b: int, idx: Tensor, full: bool) -> dict[int, LayerRecord]:
    cache: dict = {}
    layers = {}
    for i, call in enumerate(calls):
        if call.q is None:
            continue

        def take(t: Tensor, pos_dim: int) -> Tensor:
            t = t[b]
            return t if full else t.index_select(pos_dim, idx.to(t.device))

        causal, window, mask = _layer_mask(call, b, idx, cache)
        weights = None
        if call.weights is not None:
            weights = take(call.weights, 1)
            weights = weights if full else weights.index_select(2, idx.to(weights.device))
        layers[i] = LayerRecord(
            name=call.name,
            q=take(call.q, 1),
            k=take(call.k, 1),
            v=take(call.v, 1),
            out=take(call.out, 0).transpose(0, 1),
            weights=weights,
            scaling=call.scaling,
            causal=causal,
            window=window,
            softcap=call.softcap,
            mask=mask,
        )
    return layers


def capture(
    model: str | Path | nn.Module,
    text: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    *,
    layers: Iterable[int] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_length: int | None = None,
    keep_on_device: bool = False,
    attn_implementation: str | None = None,
    add_bos: bool = False,
    input_ids: Tensor | None = None,
) -> Capture | list[Capture]:
    """Run ``model`` once on ``text`` and record Q, K, V and attention of every (or each given) layer.

    - ``model``: an embedded alias (``"smollm2"``, ``"minilm"``), a hub name, a local folder, or a
      transformers model object (then pass its ``tokenizer``). Names are loaded in eval mode, on
      ``device`` in ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``) with ``attn_implementation``.
    - ``text``: a string gives a :class:`Capture`; a list gives a list (one batched, padded forward;
      each capture holds only its own tokens). ``input_ids`` (``[batch, pos]``) replaces text and
      tokenizer for models without one.
    - ``layers``: capture only these layers (0-based).
    - ``max_length``: truncate to this many tokens instead of raising :class:`InputTooLongError`.
    - ``keep_on_device``: keep captured tensors on the model's device (default: move to CPU).
    - ``add_bos``: prepend the tokenizer's BOS token (its EOS if it has no BOS, as GPT-2) when it
      does not add one itself. Decoders park most attention on the first token (an attention
      sink); with a BOS there, the sink is not one of the text's words.

    The model runs unmodified on whatever backend it has (eager, sdpa, flash…); the taps are gone
    afterwards, also if forward raises.
    """
    name = None
    if isinstance(model, (str, Path)):
        name = str(model)
        model, loaded_tokenizer = load_model(name, device=device, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    elif isinstance(model, nn.Module):
        _check_model_placement(model, device, dtype, attn_implementation)
    else:
        raise ArgumentTypeError(
            f"model must be a name, a path or a transformers model, got {type(model).__name__}"
        )
    if model.training:
        raise ModelInTrainingModeError(
            f"{type(model).__name__} is in training mode: dropout would make every capture different. "
            "Call model.eval() first."
        )
    config = model.config
    name = name or getattr(config, "_name_or_path", "") or type(model).__name__
    n_layers = _n_layers(config)
    wanted = _check_layers(layers, n_layers)
    limit = _max_positions(config)

    if input_ids is not None:
        if text is not None:
            raise InputError("pass either text or input_ids, not both")
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            raise ArgumentTypeError("input_ids must be a [batch, pos] integer tensor")
        texts = None
        encoded = [(row.tolist(), [(0, 0)] * len(row), [str(t) for t in row.tolist()]) for row in input_ids]
        if limit is not None and input_ids.shape[1] > limit:
            raise InputTooLongError(f"input_ids has {input_ids.shape[1]:,} tokens; {name} accepts at most {limit:,}")
    else:
        if text is None:
            raise InputError("give a text to capture (or input_ids)")
        texts = _check_texts(text)
        if tokenizer is None:
            raise InputError(f"pass tokenizer= with a model object (e.g. AutoTokenizer.from_pretrained({name!r}))")
        encoded = _tokenize(tokenizer, texts, max_length, limit, name, add_bos)

    lengths = [len(ids) for ids, _, _ in encoded]
    n = max(lengths)
    ids = torch.zeros(len(encoded), n, dtype=torch.long)
    attention_mask = torch.zeros(len(encoded), n, dtype=torch.long)
    for b, (row, _, _) in enumerate(encoded):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[b, : len(row)] = 1
    model_device = next(model.parameters()).device
    forward_kwargs = {"input_ids": ids.to(model_device), "attention_mask": attention_mask.to(model_device)}
    if "use_cache" in _forward_parameters(model):
        forward_kwargs["use_cache"] = False

    with torch.no_grad(), tap_model(model, layers=wanted, to_cpu=not keep_on_device) as recorder:
        model(**forward_kwargs)
    calls = recorder.calls
    if not calls:
        raise UnsupportedModelError(
            f"{type(model).__name__} ({getattr(config, 'model_type', '?')}) ran no attention that attnviz "
            f"could tap (backend {getattr(config, '_attn_implementation', None)!r}), so nothing was captured. "
            f"attnviz supports {supported_families()}. GPT-2 with reorder_and_upcast_attn under "
            "eager bypasses the interface: load with attn_implementation='sdpa'."
        )
    first = next(c for c in calls if c.q is not None) if any(c.q is not None for c in calls) else None
    if first is None:
        raise OutOfRangeError(f"none of layers {sorted(wanted or [])} ran; this model has {len(calls)} attention layers")
    meta = {
        "name": name,
        "model_type": getattr(config, "model_type", None),
        "class": type(model).__name__,
        "backend": first.backend,
        "dtype": str(first.q.dtype).removeprefix("torch."),
        "device": str(model_device),
        "n_layers": len(calls),
        "n_heads": first.q.shape[1],
        "n_kv_heads": first.k.shape[1],
        "d_head": first.q.shape[-1],
        "d_model": getattr(config, "hidden_size", None) or getattr(config, "n_embd", None),
        "max_positions": limit,
    }
    captures = []
    for b, (row, offsets, tokens) in enumerate(encoded):
        idx = torch.arange(len(row))
        the_text = texts[b] if texts is not None else " ".join(tokens)
        if texts is None:
            offsets = _offsets_of(tokens)
        captures.append(
            Capture(
                text=the_text,
                tokens=list(tokens),
                token_ids=list(row),
                offsets=list(offsets),
                words=words_from_offsets(the_text, offsets, tokens),
                layers=_records(calls, b, idx, full=len(row) == n),
                model=dict(meta),
            )
        )
    return captures[0] if isinstance(text, str) or (texts is None and len(captures) == 1) else captures


def _offsets_of(tokens: list[str]) -> list[tuple[int, int]]:
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    return offsets


def _forward_parameters(model: nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def _check_layers(layers: Iterable[int] | None, n_layers: int | None) -> set[int] | None:
    if layers is None:
        return None
    if isinstance(layers, int):
        layers = [layers]
    try:
        wanted = set(layers)
    except TypeError as err:
        raise ArgumentTypeError(f"layers must be a list of ints or None, got {type(layers).__name__}") from err
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
