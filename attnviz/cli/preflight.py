"""The arguments checked against the model's config and the tokenized text before its weights load."""

from __future__ import annotations

from ..errors import InputError, OutOfRangeError, UnsupportedModelError


def _n_heads(config, part: str | None) -> int | None:
    """The query heads of a part (None: the config does not say)."""
    names = ["num_attention_heads", "n_head", "num_heads", "n_heads"]
    names.insert(0, "encoder_attention_heads" if part in (None, "encoder") else "decoder_attention_heads")
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def preflight(
    args,
    text: str | None,
    *,
    layer: int | None = None,
    head: int | None = None,
    query: str | None = None,
    part: str | None = None,
    what: str = "text",
    generates: bool = False,
) -> None:
    """The text (``what``: its name in errors) not empty, then ``args.model`` described (config and
    tokenizer, no weights) and the arguments checked against it: a supported family, one that can
    write text (``generates``), ``--part cross`` only on an encoder-decoder, ``--layers``, ``layer``
    and ``head`` in range, the text within the model's limit, the ``query`` word in the tokenized
    text — an error now, not after the weights loaded and the model ran."""
    from .. import TokenSequence  # deferred: `attnviz --help` and a refused argument answer before torch loads
    from ..models import (  # deferred with the rest of the library
        check_layers,
        check_supported,
        check_texts,
        describe_model,
        describe_quickly,
        max_positions,
        n_layers,
        tokenize,
        words_from_offsets,
        writes_text,
    )

    if text is not None:
        check_texts(text, what)  # before the tokenizer loads (a GGUF's takes seconds)
    # a local folder's facts read without transformers' model classes (≈2 s to import), else the whole description
    config, tokenizer = describe_quickly(args.model) or describe_model(args.model)
    check_supported(config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if getattr(args, "part", None) == "cross" and not encoder_decoder:
        raise InputError(
            f"--part cross reads an encoder-decoder's cross-attention; {args.model} has one stack: leave --part out"
        )
    if generates and not writes_text(config):
        raise UnsupportedModelError(
            f"{args.model} cannot generate text (it has no language-model head: an encoder such as MiniLM reads a "
            "text but writes none): use 'attnviz capture' for it, or generate with a causal LM such as 'smollm2'"
        )
    layers = n_layers(config)
    wanted = getattr(args, "layers", None)
    if wanted is not None:  # said as the option, as --layer and --head are
        if not wanted:
            raise InputError("--layers names no layer: give some, like 0,3,5, or leave it out for every layer")
        outside = [n for n in wanted if n < 0 or (layers is not None and n >= layers)]
        if outside:
            top = f"0..{layers - 1}" if layers is not None else "≥ 0"
            raise OutOfRangeError(f"--layers: layer {outside[0]} is out of range: {args.model} has layers {top}")
    check_layers(wanted, layers)
    if layer is not None:
        if layer < 0 or (layers is not None and layer >= layers):
            top = f"0..{layers - 1}" if layers is not None else "≥ 0"
            raise OutOfRangeError(f"--layer {layer} is out of range: {args.model} has layers {top}")
        if args.layers is not None and layer not in args.layers:
            raise OutOfRangeError(f"--layer {layer} is not among --layers {args.layers}: add it to --layers")
    heads = _n_heads(config, part)
    if head is not None and (head < 0 or (heads is not None and head >= heads)):
        top = f"0..{heads - 1}" if heads is not None else "≥ 0"
        raise OutOfRangeError(f"--head {head} is out of range: {args.model} has heads {top}")
    kept = getattr(args, "heads", None)
    if kept is not None:
        from ..models import check_heads, n_heads  # deferred with the rest of the library

        most = n_heads(config)
        outside = [h for h in kept if h < 0 or (most is not None and h >= most)]
        if outside:
            span = f"0..{most - 1}" if most is not None else "≥ 0"
            raise OutOfRangeError(f"--heads: head {outside[0]} is out of range: {args.model} has heads {span}")
        check_heads(kept, most, "--heads")
        if head is not None and head not in kept:
            raise OutOfRangeError(f"--head {head} is not among --heads {','.join(map(str, kept))}: add it to --heads")
    max_length = getattr(args, "max_length", None)
    if text is None or tokenizer is None or (max_length is not None and max_length < 1):
        return  # no text to check (or a max_length the library refuses itself, before any weight loads)
    limit = max_positions(config)
    name = str(args.model)
    [(ids, offsets, tokens)] = tokenize(tokenizer, [text], max_length, limit, name, getattr(args, "add_bos", False))
    target = getattr(args, "target", None)
    if target is not None and encoder_decoder:
        [(t_ids, t_offsets, t_tokens)] = tokenize(tokenizer, [target], max_length, limit, name, what="target")
    if query is None:
        return
    if encoder_decoder and part in ("decoder", "cross"):
        if target is None:
            raise InputError(
                f"--query {query!r} reads {part} attention, whose queries are the decoder's tokens: give the "
                "target text with --target"
            )
        words = TokenSequence(target, t_tokens, t_ids, t_offsets, words_from_offsets(target, t_offsets, t_tokens))
        if query not in words.word_labels:
            raise InputError(f"no word {query!r} in the target {words.word_labels}; --query takes one of them")
        return
    words = TokenSequence(text, tokens, ids, offsets, words_from_offsets(text, offsets, tokens))
    if query not in words.word_labels:
        raise InputError(f"no word {query!r} in the text; --query takes one of its words: {words.word_labels}")
