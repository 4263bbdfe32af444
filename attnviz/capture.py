"""The Capture data model and :func:`capture`, which runs a model once and records its attention.

A :class:`Capture` is one text: its tokens and words, and per captured layer the Q, K, V the
attention kernel received (O(n·d)), the kernel's own output and — when the backend produced
them — its own weights, with the scaling and mask it used. Attention maps (O(n²) per head) are
recomputed on demand by :func:`attnviz.attention.scaled_dot_product`. It holds no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .attention import build_mask, scaled_dot_product
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
from .taps import AttentionCall, tap
from .words import Word, group_matrix, words_from_offsets

if TYPE_CHECKING:
    import pandas as pd

    from .validate import ValidationReport

__all__ = ["Capture", "LayerRecord", "capture"]


@dataclass
class LayerRecord:
    """What one attention layer's kernel saw and produced, for one text."""

    name: str  # the module's name in the model, e.g. "model.layers.3.self_attn"
    q: Tensor  # [head, pos, d_head], after RoPE
    k: Tensor  # [kv_head, pos, d_head], after RoPE, before GQA expansion
    v: Tensor  # [kv_head, pos, d_head_v]
    out: Tensor | None  # [head, pos, d_head_v], the model's own attention output (A·V)
    weights: Tensor | None  # [head, pos, pos], the model's own weights (eager backends)
    scaling: float  # the factor on Q·Kᵀ the model used
    causal: bool
    window: int | None = None  # sliding window, when the model used one
    softcap: float | None = None
    mask: Tensor | None = None  # [pos, pos] bool / additive, only when causal+window do not describe it


@dataclass
class Capture:
    """One text's attention, as recorded from one forward of one model."""

    text: str
    tokens: list[str]  # the tokenizer's pieces, e.g. ['The', 'Ġcat', ...]
    token_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``
    words: list[Word]
    layers: dict[int, LayerRecord]
    model: dict[str, Any] = field(default_factory=dict)  # name, model_type, backend, dtype, n_layers, …

    # ------------------------------------------------------------------ basic facts
    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])

    @property
    def n_heads(self) -> int:
        return int(self.model["n_heads"])

    @property
    def n_kv_heads(self) -> int:
        return int(self.model["n_kv_heads"])

    @property
    def d_head(self) -> int:
        return int(self.model["d_head"])

    @property
    def token_labels(self) -> list[str]:
        """Readable, unique-per-position labels: the token's text (special tokens as themselves)."""
        labels = []
        for token, (start, end) in zip(self.tokens, self.offsets):
            piece = self.text[start:end].strip() if end > start else token
            labels.append(piece or token)
        return labels

    def __repr__(self) -> str:
        return (
            f"Capture({self.model.get('name', '?')!r}, {self.n_tokens} tokens, {len(self.words)} words, "
            f"layers {sorted(self.layers)[:3]}{'…' if len(self.layers) > 3 else ''} of {self.n_layers}, "
            f"{self.n_heads} heads ({self.n_kv_heads} kv), backend {self.model.get('backend')})"
        )

    # ------------------------------------------------------------------ access
    def layer(self, layer: int) -> LayerRecord:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ArgumentTypeError(f"layer must be an int, got {type(layer).__name__}")
        if layer not in self.layers:
            if 0 <= layer < self.n_layers:
                raise OutOfRangeError(
                    f"layer {layer} was not captured (captured: {sorted(self.layers)}); capture again with layers=None or including {layer}"
                )
            raise OutOfRangeError(f"layer {layer} is out of range: this model has layers 0..{self.n_layers - 1}")
        return self.layers[layer]

    def _check_head(self, head: int | None) -> None:
        if head is None:
            return
        if not isinstance(head, int) or isinstance(head, bool):
            raise ArgumentTypeError(f"head must be an int or None, got {type(head).__name__}")
        if not 0 <= head < self.n_heads:
            raise OutOfRangeError(f"head {head} is out of range: this model has heads 0..{self.n_heads - 1}")

    def q(self, layer: int) -> Tensor:  # [head, pos, d_head]
        return self.layer(layer).q

    def k(self, layer: int) -> Tensor:  # [kv_head, pos, d_head]
        return self.layer(layer).k

    def v(self, layer: int) -> Tensor:  # [kv_head, pos, d_head_v]
        return self.layer(layer).v

    def kv_head_of(self, head: int) -> int:
        """The key/value head a query head reads (GQA groups consecutive query heads)."""
        return head // (self.n_heads // self.n_kv_heads)

    # ------------------------------------------------------------------ recomputation
    def _sdpa_args(self, layer: int, head: int | None, causal: bool | None, scale: bool | float):
        rec = self.layer(layer)
        self._check_head(head)
        if head is None:
            q, k, v = rec.q, rec.k, rec.v
        else:
            kv = self.kv_head_of(head)
            q, k, v = rec.q[head : head + 1], rec.k[kv : kv + 1], rec.v[kv : kv + 1]
        if scale is True:
            factor = rec.scaling
        elif scale is False:
            factor = 1.0
        elif isinstance(scale, (int, float)):
            factor = float(scale)
        else:
            raise ArgumentTypeError(f"scale must be True (the model's), False (none) or a number, got {scale!r}")
        if causal is None:  # exactly the model's own mask
            kwargs = dict(causal=rec.causal, window=rec.window, mask=rec.mask)
        elif causal is True:
            kwargs = dict(causal=True, window=rec.window if rec.causal else None)
        elif causal is False:
            kwargs = dict(causal=False)
        else:
            raise ArgumentTypeError(f"causal must be None (the model's), True or False, got {causal!r}")
        if kwargs.get("mask") is not None:
            kwargs["mask"] = kwargs["mask"][None, None]
        return q[None], k[None], v[None], dict(scale=factor, softcap=rec.softcap, **kwargs)

    def attention(
        self,
        layer: int,
        head: int | None = None,
        *,
        causal: bool | None = None,
        scale: bool | float = True,
        temperature: float = 1.0,
        words: bool = False,
    ) -> Tensor:  # [head, query_pos, key_pos], or [query_pos, key_pos] for one head
        """Attention weights recomputed by attnviz's own SDPA, in float32.

        - ``causal``: ``None`` uses the model's own mask; ``True`` forces the causal mask (the seeds'
          switch), ``False`` lets every token see every token.
        - ``scale``: ``True`` is the model's own factor (1/√d_k, or GPT-2's per-layer one), ``False``
          switches scaling off (the row collapses toward one-hot), a number sets it.
        - ``temperature``: scores are divided by it before the softmax.
        - ``words``: merge tokens into words — attention *to* a word summed over its tokens, *from*
          a word averaged over its tokens — giving ``[word, word]``.
        """
        if not isinstance(temperature, (int, float)) or temperature <= 0:
            raise InputError(f"temperature must be a number > 0, got {temperature!r}")
        q, k, v, kwargs = self._sdpa_args(layer, head, causal, scale)
        _, weights = scaled_dot_product(q, k, v, temperature=float(temperature), **kwargs)
        weights = weights[0] if head is None else weights[0, 0]
        return self.to_words(weights) if words else weights

    def allowed(self, layer: int, *, causal: bool | None = None) -> Tensor:  # [query_pos, key_pos] bool
        """Which (query, key) pairs the mask lets through (``causal`` as in :meth:`attention`)."""
        _, _, _, kwargs = self._sdpa_args(layer, None, causal, True)
        n = self.n_tokens
        allowed = build_mask(n, n, causal=kwargs.get("causal", False), window=kwargs.get("window"))
        allowed = torch.ones(n, n, dtype=torch.bool) if allowed is None else allowed[0, 0].cpu()
        mask = kwargs.get("mask")
        if mask is not None:
            mask = mask[0, 0].cpu()
            allowed = allowed & (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2)
        return allowed

    def output(self, layer: int, head: int | None = None) -> Tensor:  # [head, pos, d_head_v] or [pos, d_head_v]
        """A·V recomputed by attnviz's own SDPA with the model's mask and scaling, in float32."""
        q, k, v, kwargs = self._sdpa_args(layer, head, None, True)
        out, _ = scaled_dot_product(q, k, v, **kwargs)
        return out[0] if head is None else out[0, 0]

    def scores(self, layer: int, head: int | None = None, *, scale: bool | float = True) -> Tensor:
        """Pre-softmax scores Q·Kᵀ·scale (no mask), float32: ``[head, q, k]`` or ``[q, k]``."""
        q, k, _, kwargs = self._sdpa_args(layer, head, None, scale)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        s = (q.float() @ k.float().transpose(-2, -1)) * kwargs["scale"]
        return s[0] if head is None else s[0, 0]

    def to_words(self, weights: Tensor) -> Tensor:  # [..., query_pos, key_pos] -> [..., word, word]
        """Merge a token × token matrix into word × word (to a word summed, from a word averaged)."""
        to_sum = group_matrix(self.words, self.n_tokens).to(weights)
        from_mean = group_matrix(self.words, self.n_tokens, mean=True).to(weights)
        return from_mean @ weights @ to_sum.T

    @property
    def word_labels(self) -> list[str]:
        return [w.text for w in self.words]

    def word_index(self, word: str | int) -> int:
        """Index of a word given by its text (first occurrence) or its index."""
        if isinstance(word, int):
            if not 0 <= word < len(self.words):
                raise OutOfRangeError(f"word {word} is out of range: this text has words 0..{len(self.words) - 1}")
            return word
        for i, w in enumerate(self.words):
            if w.text == word:
                return i
        raise InputError(f"no word {word!r} in this text; its words are {self.word_labels}")

    # ------------------------------------------------------------------ outputs
    def validate(self, **kwargs) -> ValidationReport:
        """Recomputed weights and outputs against the model's own, per layer and head."""
        from .validate import validate

        return validate(self, **kwargs)

    def to_pandas(self, layer: int | None = None, head: int | None = None, *, words: bool = False) -> pd.DataFrame:
        """A tidy table: layer, head, query_pos, key_pos, query_token, key_token, weight.

        ``layer``/``head`` ``None`` means all captured layers / all heads (that computes every
        pattern asked for). With ``words=True`` positions and tokens are words.
        Masked pairs (weight exactly 0 by the mask) are kept, so every table is n × n per head.
        """
        import pandas as pd

        layers = sorted(self.layers) if layer is None else [layer]
        labels = self.word_labels if words else self.tokens
        n = len(labels)
        frames = []
        for lay in layers:
            w = self.attention(lay, words=words)  # [head, q, k]
            heads = range(self.n_heads) if head is None else [head]
            self._check_head(head)
            for h in heads:
                frames.append(
                    pd.DataFrame(
                        {
                            "layer": lay,
                            "head": h,
                            "query_pos": torch.arange(n).repeat_interleave(n).numpy(),
                            "key_pos": torch.arange(n).repeat(n).numpy(),
                            "query_token": [labels[i] for i in range(n) for _ in range(n)],
                            "key_token": labels * n,
                            "weight": w[h].reshape(-1).numpy(),
                        }
                    )
                )
        return pd.concat(frames, ignore_index=True)

    def save(self, path: str | Path) -> Path:
        """Write the capture as one safetensors file with JSON metadata (no pickle)."""
        from .io import save

        return save(self, path)

    def to(self, device: str | torch.device) -> Capture:
        """A copy with every tensor on ``device``."""
        layers = {
            i: replace(
                r,
                **{
                    name: getattr(r, name).to(device)
                    for name in ("q", "k", "v", "out", "weights", "mask")
                    if getattr(r, name) is not None
                },
            )
            for i, r in self.layers.items()
        }
        return replace(self, layers=layers)


# ---------------------------------------------------------------------- capture()
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


def _allowed_from(mask: Tensor, b: int, idx: Tensor) -> Tensor:  # [pos, pos]
    m = mask[b if mask.shape[0] > 1 else 0, 0][idx][:, idx]
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2 if m.is_floating_point() else m.bool()


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
            allowed = _allowed_from(call.mask, b, idx)
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

    with torch.no_grad(), tap(model, layers=wanted, to_cpu=not keep_on_device) as recorder:
        model(**forward_kwargs)
    calls = recorder.calls
    if not calls:
        raise UnsupportedModelError(
            f"{type(model).__name__} ran no attention through transformers' AttentionInterface "
            f"(backend {getattr(config, '_attn_implementation', None)!r}), so nothing could be captured. "
            "attnviz supports models whose attention dispatches through it: BERT, RoBERTa, GPT-2, Llama, "
            "Qwen2, Mistral, SmolLM2 and most recent families. GPT-2 with reorder_and_upcast_attn under "
            "eager bypasses it: load with attn_implementation='sdpa'."
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
    import inspect

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
