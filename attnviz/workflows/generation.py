"""``generate()``: what a model attends to while it generates — every step, with its KV cache.

The model's own ``generate`` runs unmodified (greedy by default, sampling with ``seed=``) as the
pipeline's run (:func:`attnviz.workflows.capture.pipeline.tapped`), recorded step by step into one O(n·d)
:class:`~attnviz.Capture` (:class:`~attnviz.workflows.step_recorder.StepRecorder`); after it one more
cached forward reads the last new token, so that token has its row too. The pipeline then checks the
prefill's calls as one forward's, and proves every generated row against the kernel output of the
step that computed it (and a sample of the prompt's rows), as :func:`attnviz.capture` does for one
forward. What it returns is :class:`~attnviz.workflows.generation_result.Generation`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..data.capture import TokenSequence
from ..data.validate import SAMPLE_ROWS, sample_rows
from ..data.words import offsets_from_tokens, words_from_offsets
from ..engine.taps import AttentionCall, Recorder, tap
from ..errors import ArgumentTypeError, InputError, InputTooLongError, UnsupportedModelError
from ..families import PROJECTION_SPECS
from .capture.build import Item, captures
from .capture.images import is_image_input
from .capture.inputs import Encoded, check_vocabulary, given_tokens, surfaces, tokenize
from .capture.kept import check_heads, n_heads
from .capture.pipeline import check_mode, resolve, tapped, weight_mode_for
from .capture.progress import attention_calls, counting
from .capture.vlm import encode_vlm, image_token_id, is_vlm, vlm_refusal
from .generation_result import Generation
from .step_recorder import StepRecorder

__all__ = ["generate"]

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


# ---------------------------------------------------------------- generate()
def generate(
    model: str | Path | nn.Module,
    prompt: str,
    tokenizer: Any = None,
    *,
    max_new_tokens: int = 20,
    layers: Any = None,
    heads: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    attn_implementation: str | None = None,
    add_bos: bool = False,
    keep_on_device: bool = False,
    check: str = "sample",
    seed: int | None = None,
    tokenized: Sequence[Encoded] | None = None,
    image: Any = None,
    processor: Any = None,
    on_progress: Callable[[int, int], None] | None = None,
    **generate_kwargs: Any,
) -> Generation:
    """Generate from ``prompt`` with the model's own ``generate`` and record every step's attention.

    - ``model``, ``tokenizer``, ``device``, ``dtype``, ``attn_implementation``, ``layers``,
      ``add_bos``, ``keep_on_device``: as for :func:`attnviz.capture`.
    - ``heads``: keep only these query heads, by the model's numbers (``[3, 7]``; ``{layer: [heads]}``
      per layer, a layer not named keeping every head) — and, under GQA, the key/value heads they read —
      as for :func:`attnviz.capture`: checked against the model's config before it runs; every step is
      still proved over every head, the records are narrowed after the check. ``gen.step(i)``,
      ``gen.capture`` and the figures address heads by the model's numbers; one not kept is a
      :class:`~attnviz.errors.HeadNotKeptError` naming those kept. ``cap.model["heads"]`` says what was asked.
    - ``max_new_tokens``: how many tokens to generate (fewer when the model ends the text).
    - ``generate_kwargs`` go to ``model.generate`` unchanged: greedy by default; ``do_sample=True``
      (with ``temperature``, ``top_p``… and ``seed=`` for a repeatable draw) samples;
      ``cache_implementation="static"`` and sliding-window models' caches work. Beam search,
      several sequences and assisted decoding are refused: they rewrite the cache.
    - ``check``: ``"sample"`` (default) proves every generated row and a sample of the prompt's
      rows against the kernel output of the step that computed them; ``"full"`` every row; ``"off"``.
    - ``tokenized``: the prompt as :func:`attnviz.workflows.capture.inputs.tokenize` encoded it (with this
      tokenizer and ``add_bos``), a list of one, for a caller that had to count its tokens first: it
      is not tokenized again (as for :func:`attnviz.capture`).
    - ``on_progress(done, total)``: as for :func:`attnviz.capture`, over every step — ``total`` counts the
      calls of the prompt's forward and of one forward per new token and the last one's (fewer run when
      the model ends the text early).

    - ``image`` and ``processor`` (a vision-language model, LLaVA): the picture the prompt's one
      ``<image>`` stands for, through the model's processor (given, else the one saved with its name or
      folder), as for :func:`attnviz.capture`; ``generate(model, prompt, image, processor=…)`` says the
      same. The vision tower reads the picture once at the prefill (the part ``vision``); the language
      model's steps (``decoder``) attend over the picture's tokens, labelled ``(row,col)`` by their
      patches, and the prompt; ``gen.capture.image`` maps them to the picture.

    Returns a :class:`Generation`: ``.text`` and ``.new_tokens`` (the continuation), ``.ids`` and
    ``.prompt_length``, ``.capture`` (a :class:`Capture` over prompt and new tokens whose rows are
    the ones the model computed at each step) and ``.step(i)``.
    """
    check_mode(check)
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
    resolved = resolve(model, tokenizer, device, dtype, attn_implementation)
    lm: Any = resolved.model
    config = lm.config
    can_generate = getattr(lm, "can_generate", None)
    if can_generate is None or not can_generate():
        raise UnsupportedModelError(
            f"{type(lm).__name__} cannot generate text (it has no language-model head: an encoder such as "
            "MiniLM reads a text but writes none). Use attnviz.capture() for it, or generate with a causal "
            "LM such as 'smollm2'"
        )
    model_type = getattr(config, "model_type", "")
    spec = PROJECTION_SPECS.get(model_type)
    # hooks on a decoder's inline attention see only each step's new keys (the cache is inside the
    # module); an encoder's inline attention (LongT5's) runs once, before the steps, on the whole prompt
    if spec is not None and (spec.causal or not getattr(config, "is_encoder_decoder", False)):
        raise UnsupportedModelError(
            f"{type(lm).__name__} ({model_type}) computes attention inline; attnviz captures it in one "
            "forward (attnviz.capture) but records generation steps only for models whose attention goes "
            "through transformers' attention interface (Llama, Qwen, Mistral, GPT-2, BART, T5, …)"
        )
    _check_generate_kwargs(lm, generate_kwargs)
    # a picture: the third positional argument of a vision-language model (or image=), its processor
    picture = image if image is not None else tokenizer if is_image_input(tokenizer) else None
    if processor is None and getattr(tokenizer, "image_processor", None) is not None:
        processor = tokenizer  # a VLM's processor given where the tokenizer goes
    refused = vlm_refusal(config)
    if refused and (picture is not None or processor is not None):
        raise UnsupportedModelError(refused)
    vlm = None
    if picture is not None or processor is not None or "pixel_values" in generate_kwargs:
        if not is_vlm(config):
            raise InputError(
                f"{resolved.name} reads no pictures while it generates: attnviz.generate takes a picture for a "
                "vision-language model (LLaVA, Idefics3); give this model a text prompt alone"
            )
        if "pixel_values" in generate_kwargs:
            raise InputError("pass the picture as image= (with processor=): attnviz encodes it with the prompt")
        if tokenized is not None:
            raise InputError("tokenized= is for a text prompt; a prompt with a picture goes through its processor")
        vlm = encode_vlm(resolved, prompt, picture, processor, verb="generate")
        tokenizer = vlm.tokenizer
    else:
        tokenizer = resolved.require_tokenizer()
        placeholder = tokenizer.convert_ids_to_tokens(image_token_id(config)) if is_vlm(config) else None
        if isinstance(placeholder, str) and placeholder in prompt:
            raise InputError(
                f"the prompt has {placeholder!r} but no picture: pass it, generate(model, prompt, image, "
                f"processor=…), or leave {placeholder!r} out to generate from the text alone"
            )
    encoder_decoder = resolved.encoder_decoder
    wanted = resolved.layers(layers)
    head_choice = check_heads(heads, n_heads(config))
    limit, name = resolved.limit, resolved.name
    if vlm is not None:
        sequence0 = vlm.made[0][0]
        encoded = [(sequence0.token_ids, sequence0.offsets, sequence0.tokens)]
    elif tokenized is None:
        encoded = tokenize(tokenizer, [prompt], None, limit, name, add_bos, what="prompt")
    else:
        encoded = given_tokens(tokenized, 1, limit, name, what="prompt")
    check_vocabulary(lm, encoded, "prompt")
    ids_list = encoded[0][0]
    n_prompt = 1 if encoder_decoder else len(ids_list)  # the generated sequence's positions before the new tokens
    if limit is not None and n_prompt + max_new_tokens > limit:
        room = limit - n_prompt
        raise InputTooLongError(
            f"{n_prompt:,} prompt positions + max_new_tokens={max_new_tokens:,} exceed the {limit:,} positions "
            f"{name} accepts; ask for at most {room:,} new tokens" + ("" if room > 0 else " (shorten the prompt)")
        )

    ids = torch.tensor([ids_list], device=resolved.device)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = dict(generate_kwargs, max_new_tokens=max_new_tokens, return_dict_in_generate=True)
    _static_cache(lm, kwargs, n_prompt + max_new_tokens + 1, encoder_decoder)
    if seed is not None:
        torch.manual_seed(seed)

    def run(_recorder: Recorder) -> Tensor:  # [1, pos]: the generated sequence
        if encoder_decoder:
            encoder_outputs = lm.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
            model_inputs: dict[str, Any] = dict(encoder_outputs=encoder_outputs, attention_mask=mask)
        else:
            model_inputs = dict(input_ids=ids, attention_mask=mask)
        if vlm is not None:  # the picture (and Idefics3's pixel mask), read by the vision tower at the prefill
            pictures = vlm.forward_kwargs(resolved.device, next(lm.parameters()).dtype)
            model_inputs.update((k, v) for k, v in pictures.items() if k not in ("input_ids", "attention_mask"))
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
        return sequence

    # a step's records are built inside the forward: its weights compared there, not after it
    weight_mode = weight_mode_for(check, after_forward=False)
    # on_progress counts the calls of every step: the prompt's, one per new token, and the one that reads the last
    steps = counting(StepRecorder, on_progress, attention_calls(lm.config, max_new_tokens + 1))
    taps = tap(lm, layers=wanted, keep_on_device=keep_on_device, weight_mode=weight_mode, recorder_class=steps)
    recorder, sequence = tapped(resolved, taps, run, wanted, forward_calls=_first_forward)
    assert isinstance(recorder, StepRecorder)
    n_total = sequence.shape[1]
    n_src = len(ids_list)
    for key, stream in recorder.streams.items():
        expected = n_src if key[0] == "encoder" else vlm.n_tower if vlm is not None and key[0] == "vision" else n_total
        if stream.n != expected:
            raise UnsupportedModelError(
                f"{stream.first.name} read {stream.n} positions over the generation's {expected}; "
                "attnviz cannot line its steps up with the tokens"
            )
    new_ids = sequence[0, n_prompt:].tolist()
    all_ids = sequence[0].tolist()
    continuation, new_offsets = _continuation(tokenizer, new_ids, [] if encoder_decoder else ids_list)
    new_tokens = tokenizer.convert_ids_to_tokens(new_ids)
    source = _sequence(prompt, ids_list, encoded[0][1], encoded[0][2]) if vlm is None else vlm.made[0][0]
    if vlm is not None:  # the prompt as the processor expanded it, its image tokens labelled by their patches
        full_text = source.text + continuation
        shifted = [(a + len(source.text), b + len(source.text)) if b > a else (0, 0) for a, b in new_offsets]
        offsets, tokens = source.offsets + shifted, source.tokens + [str(t) for t in new_tokens]
        _, start, stop = vlm.made[0]
        # the text's words over the whole text, each image token its own word as in the capture
        words = [
            w for w in words_from_offsets(full_text, offsets, tokens) if w.token_stop <= start or w.token_start >= stop
        ]
        words += [w for w in source.words if start <= w.token_start < stop]
        words.sort(key=lambda w: w.token_start)
        full = TokenSequence(full_text, tokens, all_ids, offsets, words)
        target = None
    elif encoder_decoder:
        start_tokens = tokenizer.convert_ids_to_tokens(all_ids[:1])
        target = _sequence(continuation, all_ids, [(0, 0)] + new_offsets, start_tokens + new_tokens)
        full = source
    else:
        full_text = prompt + continuation
        shifted = [(a + len(prompt), b + len(prompt)) if b > a else (0, 0) for a, b in new_offsets]
        full = _sequence(full_text, all_ids, encoded[0][1] + shifted, encoded[0][2] + new_tokens)
        target = None
    decoder_steps = next(s.steps for k, s in recorder.streams.items() if k[0] == "decoder")
    eos = _eos_ids(lm)
    generation = {
        "prompt_length": n_prompt,
        "steps": decoder_steps,
        "text": continuation,
        "stopped": "eos" if new_ids and new_ids[-1] in eos else "length",
        "settings": {k: v for k, v in generate_kwargs.items() if isinstance(v, (int, float, str, bool, type(None)))}
        | {"max_new_tokens": max_new_tokens, "seed": seed},
    }
    # every generated row is proved against the step that computed it, and a sample of the prompt's
    generated = torch.arange(n_prompt, n_total)
    prompt_rows = sample_rows(n_prompt, SAMPLE_ROWS) if check == "sample" else torch.arange(n_prompt)
    rows = torch.cat([prompt_rows, generated])
    by_part = {"encoder": sample_rows(n_src, SAMPLE_ROWS) if check == "sample" else torch.arange(n_src)}
    cut = {"encoder": (n_src, n_src), "decoder": (n_total, n_total), "cross": (n_total, n_src)}
    pictures: dict[str, Any] = {}
    if vlm is not None:
        n_tower = vlm.n_tower
        cut["vision"] = (n_tower, n_tower)
        by_part["vision"] = sample_rows(n_tower, SAMPLE_ROWS) if check == "sample" else torch.arange(n_tower)
        # the picture's suffix: the prompt's text after it, then the new tokens
        grid, tower = vlm.pictures(0, full.tokens)
        pictures = dict(image=grid, vision=tower)
    [cap] = captures(
        resolved,
        recorder.calls,
        [Item(full, target, cut, **pictures)],
        check,
        kept=recorder.assembled(),
        rows={**by_part, "decoder": rows, "cross": rows},
        extra={"generation": generation},
        projections=recorder.projections,
        heads=head_choice,
    )
    cap.model["provenance"]["add_bos"] = None if vlm is not None else add_bos
    return Generation(cap)


def _first_forward(recorder: Recorder) -> list[AttentionCall]:
    """The calls of the prefill (every module's first): one forward's, for the pipeline's checks."""
    return [c for c in recorder.calls if c.step == 0]


def _check_generate_kwargs(model: Any, kwargs: dict[str, Any]) -> None:
    from transformers import GenerationConfig  # deferred: importing attnviz does not import transformers

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
    from transformers import StaticCache  # deferred: importing attnviz does not import transformers

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
