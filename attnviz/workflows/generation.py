"""``generate()``: what a model attends to while it generates — every step, with its KV cache.

A decoder with a cache reads the prompt once (the prefill), then runs one forward per new token:
the new position's query against the cache's keys and values, to which the step appends its own.
The cache is append-only, so a whole generation fits in one O(n·d) :class:`Capture`: every step's
query and output rows, and every position's key and value as the step that made it wrote them into
the cache. :class:`StepRecorder` streams each kernel call into those rows as it happens; nothing
of size steps × n is kept, whatever the cache (dynamic, sliding-window, static).

The model's own ``generate`` runs unmodified (greedy by default, sampling with ``seed=``); after it
one more cached forward reads the last new token, so that token has its row too. The capture then
proves every generated row against the kernel output of the step that computed it (and a sample
of the prompt's rows), as :func:`attnviz.capture` does for one forward.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data.capture import Capture, TokenSequence
from ..data.records import build_records, part_sizes
from ..data.validate import SAMPLE_ROWS, sample_rows
from ..data.words import offsets_from_tokens, words_from_offsets
from ..engine.specs import PROJECTION_SPECS
from ..engine.taps import AttentionCall, Recorder, tap
from ..errors import ArgumentTypeError, InputError, InputTooLongError, UnsupportedModelError
from .inputs import check_vocabulary, surfaces, tokenize
from .runner import CHECKS, capture_meta, check_layers, max_positions, n_layers, resolve_model, self_check

__all__ = ["Generation", "GenerationStep", "StepRecorder", "generate"]

_TENSOR_FIELDS = ("q", "k", "v", "out", "weights", "mask", "key_padding", "bias")

# generate() arguments attnviz decides itself, or that would record something else than one sequence
_OWN = {"max_new_tokens", "return_dict_in_generate", "input_ids", "inputs", "encoder_outputs", "attention_mask"}
_REFUSED = {
    "num_beams": "beam search reorders the cache at every step, so a row's keys change after it was computed",
    "num_beam_groups": "beam search reorders the cache at every step",
    "num_return_sequences": "attnviz records one sequence per generation",
    "use_cache": "attnviz records the steps of a cached generation (use_cache=False re-reads the whole text each step)",
    "assistant_model": "assisted (speculative) decoding rolls the cache back; attnviz records plain decoding",
    "prompt_lookup_num_tokens": "prompt-lookup decoding rolls the cache back; attnviz records plain decoding",
}


# ---------------------------------------------------------------- recording the steps
@dataclass
class _Stream:
    """One attention's rows, appended step by step."""

    first: AttentionCall  # the first call: name, part, layer, scaling, backend, sizes, sinks
    q: list[Tensor] = field(default_factory=list)  # [head, step's queries, d_head] per step
    out: list[Tensor] = field(default_factory=list)
    k: list[Tensor] = field(default_factory=list)  # the positions each step added (cross: the source, once)
    v: list[Tensor] = field(default_factory=list)
    bias: list[tuple[int, Tensor, Tensor]] = field(default_factory=list)  # (first query, key positions, values)
    steps: list[int] = field(default_factory=list)  # queries per step
    weight_error: Tensor | None = None
    weight_scale: Tensor | None = None

    n: int = 0  # positions read so far

    def take(self, call: AttentionCall, move) -> None:
        assert call.q is not None and call.k is not None and call.v is not None and call.out is not None
        n_q, n_k = call.q.shape[-2], call.k.shape[-2]
        past = self.n
        if call.part == "cross":  # the source's keys: the same at every step
            if not self.k:
                self.k.append(move(call.k[0]).clone())
                self.v.append(move(call.v[0]).clone())
            elif n_k != self.k[0].shape[-2]:
                raise UnsupportedModelError(
                    f"{call.name} read {n_k} source positions at one step and {self.k[0].shape[-2]} at another"
                )
            first_key = 0
        else:
            # A dynamic cache hands the kernel every position so far, a static one its whole buffer (the
            # new rows at the step's positions); a sliding-window cache keeps only the last positions,
            # the new ones last. The rows are copied: a view would keep the step's whole cache alive.
            start = past if n_k >= past + n_q else n_k - n_q
            self.k.append(move(call.k[0, :, start : start + n_q]).clone())
            self.v.append(move(call.v[0, :, start : start + n_q]).clone())
            first_key = past + n_q - n_k if n_k < past + n_q else 0
        self.q.append(move(call.q[0]))
        self.out.append(move(call.out[0].transpose(0, 1)))
        if call.bias is not None:
            key_positions = torch.arange(n_k) + first_key
            keep = key_positions < past + n_q if call.part != "cross" else key_positions >= 0
            values = call.bias[0].expand(-1, n_q, -1)[..., keep.to(call.bias.device)]
            self.bias.append((past, key_positions[keep], move(values).float()))
        if call.weight_error is not None and call.weight_scale is not None:
            err, scale = call.weight_error[0].cpu(), call.weight_scale[0].cpu()
            self.weight_error = err if self.weight_error is None else torch.maximum(self.weight_error, err)
            self.weight_scale = scale if self.weight_scale is None else torch.maximum(self.weight_scale, scale)
        self.steps.append(n_q)
        self.n += n_q

    def assemble(self) -> AttentionCall:
        """One call over every position, as a single prefill of the whole sequence would have made."""
        first = self.first
        cross = first.part == "cross"
        k = self.k[0] if cross else torch.cat(self.k, dim=1)
        v = self.v[0] if cross else torch.cat(self.v, dim=1)
        return AttentionCall(
            name=first.name,
            part=first.part,
            layer=first.layer,
            scaling=first.scaling,
            causal=not cross,
            window=None if cross else first.sliding_window,
            softcap=first.softcap,
            backend=first.backend,
            q=torch.cat(self.q, dim=1)[None],
            k=k[None],
            v=v[None],
            out=torch.cat(self.out, dim=1).transpose(0, 1)[None],
            bias=self._bias(k.shape[-2]),
            sinks=first.sinks,
            weight_error=None if self.weight_error is None else self.weight_error[None],
            weight_scale=None if self.weight_scale is None else self.weight_scale[None],
            sizes=first.sizes,
        )

    def _bias(self, n_keys: int) -> Tensor | None:  # [1, head, query, key]
        if not self.bias:
            return None
        n, heads = self.n, self.bias[0][2].shape[0]
        device = self.bias[0][2].device
        dense = torch.full((heads, n, n_keys), float("nan"), device=device)
        for first_query, keys, values in self.bias:
            dense[:, first_query : first_query + values.shape[1], keys.to(device)] = values
        needed = torch.ones(n, n_keys, dtype=torch.bool, device=device)
        if self.first.part != "cross":
            needed = torch.tril(needed)
        if bool(dense.isnan().any(0)[needed].any()):
            raise UnsupportedModelError(
                f"{self.first.name} gave its position bias for only some of the keys at each step; "
                "attnviz cannot assemble the bias of the whole generation"
            )
        return dense.nan_to_num(0.0)[None]


class StepRecorder(Recorder):
    """A :class:`Recorder` for generation: each call of a layer is streamed into that layer's rows
    (queries and outputs of the step, the keys and values it added) instead of being kept whole."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.streams: dict[tuple[str, int], _Stream] = {}
        self.encoder_calls: list[AttentionCall] = []

    def keep(self, call: AttentionCall) -> None:
        assert call.q is not None
        if call.q.shape[0] != 1:
            raise UnsupportedModelError(
                f"{call.name} ran on {call.q.shape[0]} sequences at once; attnviz records the generation of one"
            )
        key = (call.part, call.layer)
        if call.part == "encoder":
            if key in self.streams:
                raise UnsupportedModelError(f"{call.name} ran twice while generating; the source is encoded once")
            super().keep(call)
            self.encoder_calls.append(call)
            self.streams[key] = _Stream(call, steps=[call.q.shape[-2]], n=call.q.shape[-2])
            return
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = _Stream(call)
            self.calls.append(AttentionCall(**{**call.__dict__, **dict.fromkeys(_TENSOR_FIELDS)}))  # sizes only

        def move(t: Tensor) -> Tensor:
            return t.to("cpu") if self.to_cpu else t

        stream.take(call, move)

    def assembled(self) -> list[AttentionCall]:
        return self.encoder_calls + [s.assemble() for key, s in self.streams.items() if key[0] != "encoder"]


# ---------------------------------------------------------------- the result
@dataclass
class GenerationStep:
    """New token ``index`` of a generation: where it sits and what it attended to at its step.

    ``weights`` is ``[layer, head, key]``: the row of the token's own query over the positions
    up to it (the row the model computed when it read the token). ``chosen_by`` is the same for the
    position before it, whose output chose this token.
    """

    index: int
    position: int
    token: str  # its label (the text it covers; the tokenizer's piece is in gen.sequence.tokens)
    token_id: int
    layers: list[int]
    weights: Tensor  # [layer, head, key_pos]
    chosen_by: Tensor  # [layer, head, key_pos]: the row of the query that predicted this token
    keys: list[str]  # the key tokens' labels, positions 0..position

    def top(self, k: int = 5, *, layer: int | None = None, head: int | None = None) -> list[tuple[int, str, float]]:
        """The ``k`` keys this token attended to most: (position, token, weight), averaged over the
        layers and heads not given."""
        w = self.weights
        if layer is not None:
            if layer not in self.layers:
                raise InputError(f"layer {layer} was not captured; captured layers: {self.layers}")
            w = w[self.layers.index(layer) : self.layers.index(layer) + 1]
        if head is not None:
            if not 0 <= head < w.shape[1]:
                raise InputError(f"head {head} is out of range: heads 0..{w.shape[1] - 1}")
            w = w[:, head : head + 1]
        mean = w.mean(dim=(0, 1))
        values, index = mean.topk(min(k, mean.numel()))
        return [(int(i), self.keys[int(i)], float(v)) for v, i in zip(values, index)]

    def __repr__(self) -> str:
        top = ", ".join(f"{t!r} {w:.2f}" for _, t, w in self.top(3))
        return f"GenerationStep({self.index}: {self.token!r} at position {self.position}; attends to {top})"


@dataclass
class Generation:
    """A generation and its capture: prompt and new tokens, every step's attention.

    For an encoder-decoder model the prompt is the source (the encoder's text) and the generated
    sequence is the decoder's: its start token, then the new tokens; the capture has the parts
    ``encoder``, ``decoder`` and ``cross``.
    """

    capture: Capture

    @classmethod
    def of(cls, cap: Capture) -> Generation:
        """The generation a capture holds (for example one read back with :func:`attnviz.load`)."""
        if "generation" not in cap.model:
            raise InputError("this capture is of one forward, not of a generation; make one with attnviz.generate()")
        return cls(cap)

    @property
    def info(self) -> dict[str, Any]:
        return self.capture.model["generation"]

    @property
    def part(self) -> str:
        return "decoder"

    @property
    def sequence(self) -> TokenSequence:
        """The generated sequence's tokens (prompt and new; the decoder's for encoder-decoders)."""
        return self.capture.sequences("decoder")[0]

    @property
    def prompt_length(self) -> int:
        """Where the new tokens start in :attr:`ids`."""
        return int(self.info["prompt_length"])

    @property
    def ids(self) -> Tensor:  # [pos]
        return torch.tensor(self.sequence.token_ids)

    @property
    def new_token_ids(self) -> list[int]:
        return self.sequence.token_ids[self.prompt_length :]

    @property
    def new_tokens(self) -> list[str]:
        return self.sequence.tokens[self.prompt_length :]

    @property
    def text(self) -> str:
        """The continuation (special tokens left out)."""
        return str(self.info["text"])

    @property
    def steps(self) -> list[int]:
        """Queries each forward read: the prompt's length at the prefill, then 1 per new token."""
        return list(self.info["steps"])

    def __len__(self) -> int:
        return len(self.new_token_ids)

    def step(self, index: int) -> GenerationStep:
        """New token ``index`` (0 = the first new token; negative counts from the end)."""
        n = len(self)
        if not isinstance(index, int) or isinstance(index, bool):
            raise ArgumentTypeError(f"step index must be an int, got {type(index).__name__}")
        if not -n <= index < n:
            raise InputError(f"this generation has {n} new tokens (0..{n - 1}); step {index} is out of range")
        index %= n
        position = self.prompt_length + index
        labels = self.sequence.token_labels
        cap = self.capture
        layers = cap.layer_indices("decoder")
        rows = [cap.attention_rows(layer, [position], part="decoder")[:, 0].cpu() for layer in layers]
        before = (
            [cap.attention_rows(layer, [position - 1], part="decoder")[:, 0].cpu() for layer in layers]
            if position
            else rows
        )
        return GenerationStep(
            index=index,
            position=position,
            token=labels[position],
            token_id=self.sequence.token_ids[position],
            layers=layers,
            weights=torch.stack(rows)[..., : position + 1],
            chosen_by=torch.stack(before)[..., : position + 1],
            keys=labels[: position + 1],
        )

    def to_pandas(self, *, layer: int | None = None, head: int | None = None, top: int = 3):
        """One row per new token: its position, token, and the keys it attended to most."""
        import pandas as pd

        rows = []
        for i in range(len(self)):
            s = self.step(i)
            best = s.top(top, layer=layer, head=head)
            rows.append(
                {
                    "step": i,
                    "position": s.position,
                    "token": s.token,
                    "token_id": s.token_id,
                    **{f"top{j + 1}": f"{t} ({p})" for j, (p, t, _) in enumerate(best)},
                    **{f"top{j + 1}_weight": w for j, (_, _, w) in enumerate(best)},
                }
            )
        return pd.DataFrame(rows)

    def save(self, path: str | Path) -> Path:
        """Save the capture (with its generation) to a file; ``Generation.of(attnviz.load(path))`` reads it back."""
        return self.capture.save(path)

    def __repr__(self) -> str:
        start = (
            f"{self.capture.n_tokens} source tokens → start token + {len(self)} new"
            if self.capture.target is not None
            else f"{self.prompt_length} prompt tokens + {len(self)} new"
        )
        text = f"{self.text[:60]!r}{'…' if len(self.text) > 60 else ''}"
        return f"Generation({self.capture.model.get('name')!r}: {start}, {text})"


# ---------------------------------------------------------------- generate()
def generate(
    model: str | Path | nn.Module,
    prompt: str,
    tokenizer: Any = None,
    *,
    max_new_tokens: int = 20,
    layers: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    add_bos: bool = False,
    keep_on_device: bool = False,
    check: str = "sample",
    seed: int | None = None,
    **generate_kwargs: Any,
) -> Generation:
    """Generate from ``prompt`` with the model's own ``generate`` and record every step's attention.

    - ``model``, ``tokenizer``, ``device``, ``dtype``, ``attn_implementation``, ``layers``,
      ``add_bos``, ``keep_on_device``: as for :func:`attnviz.capture`.
    - ``max_new_tokens``: how many tokens to generate (fewer when the model ends the text).
    - ``generate_kwargs`` go to ``model.generate`` unchanged: greedy by default; ``do_sample=True``
      (with ``temperature``, ``top_p``… and ``seed=`` for a repeatable draw) samples;
      ``cache_implementation="static"`` and sliding-window models' caches work. Beam search,
      several sequences and assisted decoding are refused: they rewrite the cache.
    - ``check``: ``"sample"`` (default) proves every generated row and a sample of the prompt's
      rows against the kernel output of the step that computed them; ``"full"`` every row; ``"off"``.

    Returns a :class:`Generation`: ``.text`` and ``.new_tokens`` (the continuation), ``.ids`` and
    ``.prompt_length``, ``.capture`` (a :class:`Capture` over prompt and new tokens whose rows are
    the ones the model computed at each step) and ``.step(i)``.
    """
    if check not in CHECKS:
        raise InputError(f"check must be one of {', '.join(CHECKS)}, got {check!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be a whole number ≥ 1, got {max_new_tokens!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ArgumentTypeError(f"seed must be an int, got {type(seed).__name__}")
    if not isinstance(prompt, str):
        raise ArgumentTypeError(
            f"prompt must be one string, got {type(prompt).__name__}; generate from each prompt in turn"
        )
    if not prompt.strip():
        raise InputError("the prompt is empty: give the text the model should continue")
    lm: Any
    lm, tokenizer, name = resolve_model(model, tokenizer, device, dtype, attn_implementation)
    config = lm.config
    can_generate = getattr(lm, "can_generate", None)
    if can_generate is None or not can_generate():
        raise UnsupportedModelError(
            f"{type(lm).__name__} cannot generate text (it has no language-model head: an encoder such as "
            "MiniLM reads a text but writes none). Use attnviz.capture() for it, or generate with a causal "
            "LM such as 'smollm2'"
        )
    model_type = getattr(config, "model_type", "")
    if model_type in PROJECTION_SPECS:
        raise UnsupportedModelError(
            f"{type(lm).__name__} ({model_type}) computes attention inline; attnviz captures it in one "
            "forward (attnviz.capture) but records generation steps only for models whose attention goes "
            "through transformers' attention interface (Llama, Qwen, Mistral, GPT-2, BART, T5, …)"
        )
    _check_generate_kwargs(lm, generate_kwargs)
    if tokenizer is None:
        source = getattr(config, "_name_or_path", "") or "the model's name or folder"
        raise InputError(f"pass tokenizer= with a model object (e.g. AutoTokenizer.from_pretrained({source!r}))")
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    wanted = check_layers(layers, n_layers(config))
    limit = max_positions(config)
    encoded = tokenize(tokenizer, [prompt], None, limit, name, add_bos, what="prompt")
    check_vocabulary(lm, encoded, "prompt")
    ids_list = encoded[0][0]
    n_prompt = 1 if encoder_decoder else len(ids_list)  # the generated sequence's positions before the new tokens
    if limit is not None and n_prompt + max_new_tokens > limit:
        room = limit - n_prompt
        raise InputTooLongError(
            f"{n_prompt:,} prompt positions + max_new_tokens={max_new_tokens:,} exceed the {limit:,} positions "
            f"{name} accepts; ask for at most {room:,} new tokens" + ("" if room > 0 else " (shorten the prompt)")
        )

    model_device = next(lm.parameters()).device
    ids = torch.tensor([ids_list], device=model_device)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = dict(generate_kwargs, max_new_tokens=max_new_tokens, return_dict_in_generate=True)
    _static_cache(lm, kwargs, n_prompt + max_new_tokens + 1, encoder_decoder)
    if seed is not None:
        torch.manual_seed(seed)
    weight_mode = "drop" if check == "off" else "compare"
    with (
        torch.no_grad(),
        tap(
            lm, layers=wanted, to_cpu=not keep_on_device, weight_mode=weight_mode, recorder_class=StepRecorder
        ) as recorder,
    ):
        assert isinstance(recorder, StepRecorder)
        if encoder_decoder:
            encoder_outputs = lm.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
            model_inputs: dict[str, Any] = dict(encoder_outputs=encoder_outputs, attention_mask=mask)
        else:
            model_inputs = dict(input_ids=ids, attention_mask=mask)
        try:
            out = lm.generate(**model_inputs, **kwargs)
        except (TypeError, ValueError) as err:
            raise InputError(f"{type(lm).__name__}.generate refused these settings: {err}") from err
        sequence = out.sequences
        cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        if cache is None:
            raise UnsupportedModelError(
                f"{type(lm).__name__}.generate returned no KV cache; attnviz records cached generation"
            )
        # the last new token has not been read yet: one more cached step gives its row
        last = sequence[:, -1:]
        if encoder_decoder:
            lm(**model_inputs, decoder_input_ids=last, **{_cache_argument(lm): cache}, use_cache=True)
        else:
            lm(input_ids=last, attention_mask=torch.ones_like(sequence), **{_cache_argument(lm): cache}, use_cache=True)
    calls = recorder.assembled()
    if not calls:
        raise UnsupportedModelError(f"{type(lm).__name__} ran no attention that attnviz could tap while generating")
    n_total = sequence.shape[1]
    n_src = len(ids_list)
    for key, stream in recorder.streams.items():
        expected = n_src if key[0] == "encoder" else n_total
        if stream.n != expected:
            raise UnsupportedModelError(
                f"{stream.first.name} read {stream.n} positions over the generation's {expected}; "
                "attnviz cannot line its steps up with the tokens"
            )
    new_ids = sequence[0, n_prompt:].tolist()
    all_ids = sequence[0].tolist()
    continuation, new_offsets = _continuation(tokenizer, new_ids, [] if encoder_decoder else ids_list)
    new_tokens = tokenizer.convert_ids_to_tokens(new_ids)
    source = _sequence(prompt, ids_list, encoded[0][1], encoded[0][2])
    if encoder_decoder:
        start_tokens = tokenizer.convert_ids_to_tokens(all_ids[:1])
        target = _sequence(continuation, all_ids, [(0, 0)] + new_offsets, start_tokens + new_tokens)
        full = source
    else:
        full_text = prompt + continuation
        shifted = [(a + len(prompt), b + len(prompt)) if b > a else (0, 0) for a, b in new_offsets]
        full = _sequence(full_text, all_ids, encoded[0][1] + shifted, encoded[0][2] + new_tokens)
        target = None
    meta = capture_meta(lm, name, calls[0], part_sizes(recorder.calls), limit, check)
    decoder_steps = next(s.steps for k, s in recorder.streams.items() if k[0] == "decoder")
    eos = _eos_ids(lm)
    meta["generation"] = {
        "prompt_length": n_prompt,
        "steps": decoder_steps,
        "text": continuation,
        "stopped": "eos" if new_ids and new_ids[-1] in eos else "length",
        "settings": {k: v for k, v in generate_kwargs.items() if isinstance(v, (int, float, str, bool, type(None)))}
        | {"max_new_tokens": max_new_tokens, "seed": seed},
    }
    cut = {"encoder": (n_src, n_src), "decoder": (n_total, n_total), "cross": (n_total, n_src)}
    cap = Capture.of(full, build_records(calls, 0, cut, False), meta, target)
    if check != "off":
        generated = torch.arange(n_prompt, n_total)
        prompt_rows = sample_rows(n_prompt, SAMPLE_ROWS) if check == "sample" else torch.arange(n_prompt)
        rows = torch.cat([prompt_rows, generated])
        by_part = {"encoder": sample_rows(n_src, SAMPLE_ROWS) if check == "sample" else torch.arange(n_src)}
        self_check([cap], "sample", {**by_part, "decoder": rows, "cross": rows})
    return Generation(cap)


def _check_generate_kwargs(model: Any, kwargs: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    for key, why in _REFUSED.items():
        value = kwargs.get(key)
        if value is not None and value not in (1, True) or (key == "use_cache" and value is False):
            raise InputError(f"{key}={value!r} is not supported while capturing: {why}")
        if key in ("assistant_model", "prompt_lookup_num_tokens") and value is not None:
            raise InputError(f"{key} is not supported while capturing: {why}")
    own = sorted(set(kwargs) & _OWN)
    if own:
        raise InputError(f"{', '.join(own)} is set by attnviz.generate itself; pass the prompt and max_new_tokens")
    known = set(GenerationConfig().to_dict()) | set(inspect.signature(model.generate).parameters)
    known |= set(inspect.signature(model.forward).parameters)
    for key in kwargs:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise InputError(
                f"unknown generate argument {key!r}{hint}; attnviz.generate passes the arguments of "
                "transformers' GenerationConfig (do_sample, temperature, top_p, …) to model.generate"
            )


def _static_cache(model: Any, kwargs: dict[str, Any], size: int, encoder_decoder: bool) -> None:
    """A static cache one position longer than generate would make it: the last new token is read too."""
    wanted = kwargs.get("cache_implementation") or getattr(model.generation_config, "cache_implementation", None)
    if wanted != "static" or "past_key_values" in kwargs or "cache" in kwargs:
        return
    if encoder_decoder:
        raise InputError(
            "cache_implementation='static' with an encoder-decoder model is not supported while capturing; "
            "leave the cache to the model"
        )
    from transformers import StaticCache

    kwargs.pop("cache_implementation", None)
    kwargs[_cache_argument(model)] = StaticCache(config=model.config, max_cache_len=size)


def _cache_argument(model: Any) -> str:
    """The name forward takes the KV cache by (``cache`` in transformers 5, ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _eos_ids(model: Any) -> set[int]:
    value = getattr(model.generation_config, "eos_token_id", None)
    return set(value) if isinstance(value, list) else {value} if isinstance(value, int) else set()


def _continuation(tokenizer, new_ids: list[int], before: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The new tokens as text (special tokens left out) and each one's span in it.

    The text is what decoding adds after ``before`` (the prompt's ids), so the space a tokenizer
    puts between words is kept even when it would drop it decoding the new tokens alone."""
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        tokens = [str(t) for t in tokenizer.convert_ids_to_tokens(new_ids)]
        text = "".join(" " + t for t in tokens)
        offsets, pos = [], 0
        for t in tokens:
            offsets.append((pos + 1, pos + 1 + len(t)))
            pos += len(t) + 1
        return text, offsets
    alone = decode(new_ids, skip_special_tokens=True)
    text = alone
    if before:
        base = decode(before, skip_special_tokens=True)
        joined = decode(before + new_ids, skip_special_tokens=True)
        if joined.startswith(base) and joined[len(base) :].strip() == alone.strip():
            text = joined[len(base) :]
    found = offsets_from_tokens(text, surfaces(tokenizer, new_ids))
    if found is not None:
        return text, found
    ends = [len(decode(new_ids[: i + 1], skip_special_tokens=True)) for i in range(len(new_ids))]  # decoded prefixes
    shift = len(text) - len(alone)
    return text, [(a + shift, b + shift) for a, b in zip([0] + ends[:-1], ends)]


def _sequence(text: str, ids: list[int], offsets: list[tuple[int, int]], tokens: list[str]) -> TokenSequence:
    tokens = [str(t) for t in tokens]
    return TokenSequence(text, tokens, list(ids), list(offsets), words_from_offsets(text, offsets, tokens))
