"""``capture()``: run a model once on one text or a batch and return what its attention did as Captures.

The texts (or ids) become the encoded inputs here (:mod:`attnviz.workflows.capture.inputs`: each text
tokenized alone and right-padded, the target of an encoder-decoder model shifted right as the model
does with labels); the rest is the pipeline (:mod:`attnviz.workflows.capture.pipeline`): one forward under
the taps, the checked calls, each text's own rows of the padded batch as its records, the self-check.
:func:`capture_forward` is the entry the other workflows take (intervene, the probes).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...data.capture import Capture, TokenSequence
from ...data.words import words_from_offsets
from ...engine.taps import Recorder
from ...errors import ArgumentTypeError, InputError, InputTooLongError, UnsupportedModelError
from ...families import vision_spec
from .build import Item, run_captures
from .images import capture_images, encode_images, is_image_input, require_vision
from .inputs import Encoded, check_max_length, check_texts, decoder_inputs, given_tokens, ids_rows, tokenize
from .joint import capture_joint, is_joint
from .kept import KEEP, HeadChoice, check_heads, check_keep, drop_unkept, keep_heads, n_heads
from .pipeline import Resolved, check_mode, forward_inputs, resolve, weight_mode_for
from .progress import attention_calls, counting
from .vlm import capture_vlm, is_vlm, vlm_refusal

__all__ = ["TextInputs", "capture", "capture_forward", "encode_texts"]


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
    image: Any = None,
    processor: Any = None,
    pixel_values: Tensor | None = None,
    keep: Iterable[str] | str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    heads: Iterable[int] | dict[int, Iterable[int]] | str | None = None,
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
    - ``keep``: what each layer's record keeps once the self-check has run — the names of
      ``("q", "k", "v", "out", "norms")`` (default: all). Queries and keys are always kept (every map is
      recomputed from them); without ``"v"`` and ``"out"`` a long capture keeps under half the bytes, but
      ``cap.validate()`` can no longer recompute A·V; without ``"norms"``, what a head moves
      (``cap.moved``, ``cap.value_norms``) is not there. ``cap.model["kept"]`` says what was kept.
    - ``heads``: keep only these query heads of every kept layer, by the model's numbers (``[3, 7]``;
      ``{layer: [heads]}`` per layer, a layer not named keeping every head) — and, under GQA, the
      key/value heads they read, no more. The self-check still runs over every head; the records are
      narrowed after it, before they are copied to the host. Every head is still addressed by the
      model's number (``cap.attention(3, 7)``, labels ``H7``); one not kept is a
      :class:`~attnviz.errors.HeadNotKeptError` naming those kept (``cap.kept_heads()``);
      ``cap.model["heads"]`` says what was asked, and a saved capture keeps it.
    - ``tokenized``: the texts as :func:`attnviz.workflows.capture.inputs.tokenize` encoded them (with this
      tokenizer and ``add_bos``), one per text, for a caller that had to count tokens first: they are
      not tokenized again.
    - ``on_progress(done, total)``: called after each attention call of the forward is recorded: ``done``
      calls of ``total``, the calls one forward makes as the model's config tells them (one per layer, an
      encoder-decoder's cross-attention too; never less than ``done``). The self-check and the copies to
      the host follow the last. A count in Python: the host does not wait for the device for it. An exception it raises
      stops the capture (the taps are removed). Texts only: a capture with a picture refuses it.

    - Vision encoders (ViT, DeiT, DINOv2 with or without registers, the CLIP and SigLIP vision towers):
      ``capture(model, image, processor)`` — ``image`` a PIL image, a numpy array or a file path (a
      list: a batch; ``image=`` says it by name), through ``processor`` (default: the model's own,
      ``AutoImageProcessor.from_pretrained`` of its name or folder); ``pixel_values=`` gives the
      processed ``[batch, 3, h, w]`` tensor instead. Each capture's tokens are the ``[CLS]`` (and
      ``[DIST]``, registers ``[REG0]`` …) then the patches ``(row,col)``, each its own word;
      ``cap.image`` holds the picture as the model read it and where each patch sits on it.
    - Joint text–image models (``CLIPModel``, ``SiglipModel``): ``capture(model, text, image,
      processor=…)`` — a text (or a list) and as many pictures through the model's processor (its
      tokenizer and image processor); each capture has two parts, ``text`` (the text tower over the
      text's tokens) and ``vision`` (the vision tower over ``[CLS]`` and the patches), ``cap.image`` the
      picture the vision part read (:mod:`attnviz.workflows.capture.joint`).
    - Vision-language models (LLaVA): ``capture(model, text, image, processor=…)`` — a text with
      one ``<image>`` and a picture (or a list of texts and as many pictures: one padded batch) through
      the model's processor; each capture has two parts: ``decoder``, the language model's attention
      over the merged sequence, each image position labelled ``(row,col)`` by its patch and mapped to the
      picture by ``cap.image``, and ``vision``, the vision tower's own attention over its ``[CLS]`` and
      patches (``cap.vision``) (:mod:`attnviz.workflows.capture.vlm`).

    The model runs unmodified on whatever backend it has (eager, sdpa, flash, flex…); the taps are
    gone afterwards, also if forward raises.
    """
    check_mode(check)
    check_max_length(max_length)
    kept = check_keep(keep)
    resolved = resolve(model, None if vision_spec(_config(model)) else tokenizer, device, dtype, attn_implementation)
    wanted = resolved.layers(layers)
    head_choice = check_heads(heads, n_heads(resolved.model.config))
    # an eager backend's own weights: kept, dropped, or compared with the recomputation — at the rows the
    # default check samples (kept for it, compared after the forward), at every row while capturing
    weight_mode = weight_mode_for(check, keep_weights)
    if on_progress is not None and (
        image is not None or pixel_values is not None or is_image_input(tokenizer) or is_image_input(text)
    ):
        raise ArgumentTypeError("on_progress= follows a text's capture; a capture with a picture does not take it")
    refused = vlm_refusal(resolved.model.config)
    if refused and (image is not None or pixel_values is not None or is_image_input(tokenizer) or is_image_input(text)):
        raise UnsupportedModelError(refused)
    if is_vlm(resolved.model.config) and (image is not None or processor is not None or is_image_input(tokenizer)):
        # a vision-language model's third positional argument is its picture
        picture = image if image is not None else tokenizer if is_image_input(tokenizer) else None
        made = capture_vlm(
            resolved,
            text,
            picture,
            processor,
            layers=wanted,
            check=check,
            keep_on_device=keep_on_device,
            weight_mode=weight_mode,
        )
        keep_heads(made, head_choice)
        drop_unkept(made, kept)
        return made[0] if isinstance(text, str) else made
    if is_joint(resolved.model.config) and text is not None and not is_image_input(text):
        # a joint text–image model (CLIP, SigLIP): a text and a picture, its two towers as two parts
        picture = image if image is not None else tokenizer if is_image_input(tokenizer) else None
        made = capture_joint(
            resolved,
            text,
            picture,
            processor,
            None if is_image_input(tokenizer) else tokenizer,
            layers=wanted,
            check=check,
            keep_on_device=keep_on_device,
            weight_mode=weight_mode,
            max_length=max_length,
        )
        keep_heads(made, head_choice)
        drop_unkept(made, kept)
        return made[0] if isinstance(text, str) else made
    if vision_spec(resolved.model.config) is not None or image is not None or pixel_values is not None:
        if text is not None and image is not None:
            raise InputError("pass the picture once: as the second argument or as image=, not both")
        picture = image if image is not None else text
        # a vision encoder's third positional argument is its image processor
        chosen = processor if processor is not None else tokenizer if vision_spec(resolved.model.config) else None
        images = encode_images(resolved, picture, processor=chosen, pixel_values=pixel_values)
        made = capture_images(
            resolved, images, layers=wanted, check=check, keep_on_device=keep_on_device, weight_mode=weight_mode
        )
        keep_heads(made, head_choice)
        drop_unkept(made, kept)
        one = not isinstance(picture, (list, tuple)) if pixel_values is None else len(made) == 1
        return made[0] if one else made
    if is_image_input(text):
        require_vision(resolved)
    inputs = encode_texts(
        resolved,
        text,
        target=target,
        input_ids=input_ids,
        decoder_input_ids=decoder_input_ids,
        max_length=max_length,
        add_bos=add_bos,
        tokenized=tokenized,
    )
    made, _ = capture_forward(
        resolved,
        inputs,
        layers=wanted,
        check=check,
        keep_on_device=keep_on_device,
        weight_mode=weight_mode,
        logits=False,
        keep=kept,
        on_progress=on_progress,
        heads=head_choice,
    )
    return made[0] if isinstance(text, str) or (inputs.texts is None and len(made) == 1) else made


@dataclass
class TextInputs:
    """Texts (or ids) encoded for one forward: the source of each item, and for an encoder-decoder
    the decoder's (its target texts, or None where ids or only the start token were given)."""

    texts: list[str] | None  # None: given as ids
    encoded: list[Encoded]
    targets: list[str] | None
    decoded: list[Encoded]  # [] for a one-stack model
    add_bos: bool | None = None  # whether a BOS was prepended (None: unknown — ids given)


def encode_texts(
    resolved: Resolved,
    text: str | Sequence[str] | None,
    *,
    target: str | Sequence[str] | None = None,
    input_ids: Tensor | None = None,
    decoder_input_ids: Tensor | None = None,
    max_length: int | None = None,
    add_bos: bool = False,
    tokenized: Sequence[Encoded] | None = None,
) -> TextInputs:
    """The inputs of :func:`capture` (its arguments of the same names), checked and tokenized once."""
    limit, name = resolved.limit, resolved.name
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
        tokenizer = resolved.require_tokenizer()
        if tokenized is None:
            encoded = tokenize(tokenizer, texts, max_length, limit, name, add_bos)
        else:
            encoded = given_tokens(tokenized, len(texts), limit, name)
    targets, decoded = decoder_inputs(
        resolved.model,
        resolved.tokenizer,
        encoded,
        target,
        decoder_input_ids,
        resolved.encoder_decoder,
        max_length,
        limit,
        name,
    )
    return TextInputs(texts, encoded, targets, decoded, None if input_ids is not None else add_bos)


def capture_forward(
    resolved: Resolved,
    inputs: TextInputs,
    *,
    layers: set[int] | None = None,
    check: str = "sample",
    keep_on_device: bool = False,
    weight_mode: str | None = None,
    logits: bool = True,
    keep: frozenset[str] = frozenset(KEEP),
    on_progress: Callable[[int, int], None] | None = None,
    heads: HeadChoice = None,
) -> tuple[list[Capture], Any]:
    """(one Capture per text, the forward's own output: logits…): one padded forward of ``inputs``
    through the pipeline. ``weight_mode`` as the taps take it (default: :func:`~attnviz.workflows.capture.pipeline.weight_mode_for` ``check``). ``logits=False``: a language model computes its last position's logits only
    (``logits_to_keep=1``, where its forward takes it) — a caller that reads none saves the
    vocabulary × tokens of them (8.4 GB for an 8B model at 32k tokens). ``on_progress``: as :func:`capture`'s."""
    check_mode(check)
    model = resolved.model
    kwargs, lengths = forward_inputs(resolved, inputs.encoded, inputs.decoded)
    if not logits and "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    items = [_item(inputs, b) for b in range(len(inputs.encoded))]
    made, output = run_captures(
        resolved,
        lambda: model(**kwargs),
        items,
        layers=layers,
        check=check,
        keep_on_device=keep_on_device,
        weight_mode=weight_mode,
        lengths=lengths,
        keep=keep,
        recorder_class=counting(Recorder, on_progress, attention_calls(model.config)),
        heads=heads,
    )
    for cap in made:
        cap.model["provenance"]["add_bos"] = inputs.add_bos
    return made, output


def _config(model: Any) -> Any:
    """The config of a model object (None for a name: it is read once the model is loaded)."""
    return getattr(model, "config", None)


def _item(inputs: TextInputs, b: int) -> Item:
    """Text ``b`` of the batch: its sequences and the rows of the padded batch it owns."""
    row, offsets, tokens = inputs.encoded[b]
    the_text = inputs.texts[b] if inputs.texts is not None else " ".join(tokens)
    n_src = len(row)
    n_tgt = len(inputs.decoded[b][0]) if inputs.decoded else n_src
    target = None
    if inputs.decoded:
        t_ids, t_offsets, t_tokens = inputs.decoded[b]
        t_text = inputs.targets[b] if inputs.targets is not None else " ".join(t_tokens)
        target = _sequence(t_text, t_ids, t_offsets, t_tokens)
    cut = {"encoder": (n_src, n_src), "decoder": (n_tgt, n_tgt), "cross": (n_tgt, n_src)}
    return Item(_sequence(the_text, row, offsets, tokens), target, cut)


def _sequence(text: str, ids: list[int], offsets: list[tuple[int, int]], tokens: list[str]) -> TokenSequence:
    return TokenSequence(text, list(tokens), list(ids), list(offsets), words_from_offsets(text, offsets, tokens))
