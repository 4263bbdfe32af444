"""From texts and ids to the model's inputs: tokenization (each text alone, right-padded here so the
tokenizer is never reconfigured; offsets rebuilt for tokenizers without them), the target of an
encoder-decoder shifted right as the model does with labels, and the checks that turn ids a model
cannot read into clear errors."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...data.words import offsets_from_tokens
from ...errors import ArgumentTypeError, EmptyTextError, InputError, InputTooLongError

__all__ = [
    "Encoded",
    "check_max_length",
    "check_texts",
    "check_vocabulary",
    "decoder_inputs",
    "encode_all",
    "given_tokens",
    "ids_rows",
    "padded",
    "tokenize",
    "tokenize_each",
]

Encoded = tuple[list[int], list[tuple[int, int]], list[str]]  # ids, offsets, tokens


def check_texts(text: Any, what: str = "text") -> list[str]:
    """``text`` (a string, or a non-empty list or tuple of strings) as a list, each with a word in it; a wrong
    type refused with :class:`ArgumentTypeError`, an empty text with :class:`EmptyTextError` (``what``: its name
    in the message, ``"prompt"``, ``"target"``)."""
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ArgumentTypeError(f"{what} must be a string or a non-empty list of strings, got {type(text).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ArgumentTypeError(f"{what}[{i}] must be a string, got {type(t).__name__}")
        where = f"the {what}" if isinstance(text, str) else f"{what}[{i}]"
        check_unicode(t, where)
        if not t.strip():
            raise EmptyTextError(f"{where} is empty or only whitespace; give at least one word")
        if not visible(t):
            raise EmptyTextError(
                f"{where} holds no visible character (only whitespace, zero-width or control characters); give at "
                "least one word"
            )
    return list(texts)


def visible(text: str) -> bool:
    """Whether ``text`` holds a character that shows: not whitespace, not a control character, not a
    format character (zero-width U+200B–U+200D, U+2060, the byte-order mark U+FEFF, direction marks)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf") for ch in text)


def check_unicode(text: str, where: str = "the text") -> None:
    """Refuse a lone surrogate (U+D800–U+DFFF): half of a pair, or a byte that was not UTF-8 carried through
    (``surrogateescape``), which no tokenizer can encode."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            around = ascii(text[max(0, i - 20) : i + 20])
            raise InputError(
                f"{where} holds a lone surrogate U+{ord(ch):04X} at character {i}: {around}; that is not valid "
                "Unicode (a byte that is not UTF-8, or half of a pair) — give the text as UTF-8"
            )


def check_max_length(max_length: Any) -> None:
    """``max_length`` is None or a whole number ≥ 1 (checked before any model loads)."""
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise InputError(f"max_length must be a whole number ≥ 1, got {max_length!r}")


def bos_id(tokenizer) -> int | None:
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def encode(tokenizer, text: str, kwargs: dict, *, target: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets; offsets rebuilt from the tokens when the tokenizer has none.
    A ``target`` is encoded as labels are (``text_target``: Marian's target vocabulary…)."""
    # verbose=False: transformers' own "sequence length is longer than …" warning; attnviz refuses (or cuts) such a text itself
    text_arg = {"text_target" if target else "text": text, "verbose": False}
    try:
        enc = tokenizer(**text_arg, return_offsets_mapping=True, **kwargs)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    except (NotImplementedError, KeyError, TypeError, ValueError):  # slow (Python) tokenizers have no offsets
        pass
    enc = tokenizer(**text_arg, **kwargs)
    ids = list(enc["input_ids"])
    offsets = offsets_from_tokens(text, surfaces(tokenizer, ids))
    if offsets is None:
        raise InputError(
            f"{type(tokenizer).__name__} gives no character offsets and attnviz could not find its tokens "
            "in the text; use the model's fast tokenizer (AutoTokenizer.from_pretrained(name, use_fast=True))"
        )
    return ids, offsets


def encode_all(
    tokenizer, texts: Sequence[str], kwargs: dict, *, target: bool = False
) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """:func:`encode` of each text, in one call of a fast tokenizer (a list of texts goes through the same
    ``encode_batch`` as one text does, each text alone: the same ids and offsets as one call each, without
    transformers' per-call overhead, most of the time of short texts); text by text otherwise."""
    if len(texts) > 1 and getattr(tokenizer, "is_fast", False):
        text_arg = {"text_target" if target else "text": list(texts), "verbose": False}
        try:
            enc = tokenizer(**text_arg, return_offsets_mapping=True, **kwargs)
            ids, offsets = enc["input_ids"], enc["offset_mapping"]
            if len(ids) == len(offsets) == len(texts):
                return [(list(i), [tuple(o) for o in off]) for i, off in zip(ids, offsets)]
        except (NotImplementedError, KeyError, TypeError, ValueError):  # encoded one by one below, as encode() does
            pass
    return [encode(tokenizer, text, kwargs, target=target) for text in texts]


def surfaces(tokenizer, ids: list[int]) -> list[str | None]:
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


def tokenize(
    tokenizer,
    texts: list[str],
    max_length: int | None,
    limit: int | None,
    model_name: str,
    add_bos: bool = False,
    what: str = "text",
) -> list[Encoded]:
    """Each text encoded alone (no padding; the tokenizer stays untouched), as :func:`attnviz.capture` and
    :func:`attnviz.generate` read it: hand the result to their ``tokenized=`` and the text is not tokenized again.

    ``max_length``: truncate each text to that many tokens (None: keep all); ``limit``: the model's own
    (:func:`attnviz.models.max_positions`), a longer text raising :class:`~attnviz.InputTooLongError` that names
    ``model_name``; ``add_bos``: prepend the tokenizer's BOS; ``what``: how messages name the text
    (``"prompt"``, ``"target"``). Returns one :data:`Encoded` ``(ids, offsets, tokens)`` per text."""
    encoded = []
    for found in _tokenized(tokenizer, texts, max_length, limit, model_name, add_bos, what):
        if isinstance(found, InputError):
            raise found
        encoded.append(found)
    return encoded


def tokenize_each(
    tokenizer,
    texts: list[str],
    max_length: int | None,
    limit: int | None,
    model_name: str,
    add_bos: bool = False,
    what: str = "text",
) -> list[Encoded | InputError]:
    """Each text as ``tokenize(tokenizer, [text], …)`` gives it — or, in its place, the InputError that
    call raises — from one call of the tokenizer for all of them (what a probe set wants: a probe that
    cannot be used is left out with why, the others go on)."""
    return list(_tokenized(tokenizer, texts, max_length, limit, model_name, add_bos, what, alone=True))


def _tokenized(
    tokenizer,
    texts: list[str],
    max_length: int | None,
    limit: int | None,
    model_name: str,
    add_bos: bool,
    what: str,
    alone: bool = False,
):  # yields Encoded | InputError per text; alone: each text's message as if it were the only one
    bos = bos_id(tokenizer) if add_bos else None
    kwargs: dict = {"truncation": max_length is not None}
    if max_length is not None:
        kwargs["max_length"] = max_length
    for i, pair in enumerate(_encoded(tokenizer, texts, kwargs, what == "target", alone)):
        if isinstance(pair, InputError):
            yield pair
            continue
        ids, offsets = pair
        if max_length is not None and len(ids) > max_length:
            yield InputError(
                f"max_length={max_length} is shorter than the {len(ids)} tokens the tokenizer keeps for the "
                f"{what} (its special tokens cannot be cut); give max_length ≥ {len(ids)}"
            )
            continue
        starts_special = bool(offsets) and offsets[0][0] == offsets[0][1]  # [CLS], <s> …
        if add_bos and bos is None and not starts_special:
            yield InputError("add_bos=True but the tokenizer has neither a BOS nor an EOS token to prepend")
            continue
        if bos is not None and not starts_special and (not ids or ids[0] != bos):
            ids, offsets = [bos] + ids, [(0, 0)] + offsets
            if max_length is not None and len(ids) > max_length:
                ids, offsets = ids[:max_length], offsets[:max_length]
        if limit is not None and len(ids) > limit:
            which = f"The {what}" if alone or len(texts) == 1 else f"{what.capitalize()} {i}"
            yield InputTooLongError(
                f"{which} has {len(ids):,} tokens; {model_name} accepts at most {limit:,}. "
                f"Shorten the {what} or pass max_length={limit} to truncate."
            )
            continue
        yield (ids, offsets, tokenizer.convert_ids_to_tokens(ids))


def _encoded(tokenizer, texts: list[str], kwargs: dict, target: bool, alone: bool) -> list:
    """:func:`encode_all`; ``alone``: a text the tokenizer gives no offsets for is its InputError, in its place."""
    try:
        return list(encode_all(tokenizer, texts, kwargs, target=target))
    except InputError:
        if not alone:
            raise
    found: list = []
    for text in texts:
        try:
            found.append(encode(tokenizer, text, kwargs, target=target))
        except InputError as err:
            found.append(err)
    return found


def given_tokens(
    tokenized: Sequence[Encoded], n_texts: int, limit: int | None, model_name: str, what: str = "text"
) -> list[Encoded]:
    """``tokenized=`` of :func:`attnviz.capture` and :func:`attnviz.generate`: the texts as
    :func:`tokenize` encoded them, one per text (not tokenized again), checked against the model's limit."""
    encoded = list(tokenized)
    if len(encoded) != n_texts:
        raise InputError(f"tokenized holds {len(encoded)} texts for {n_texts}; give one per {what}")
    longest = max(len(ids) for ids, _, _ in encoded)
    if limit is not None and longest > limit:
        raise InputTooLongError(f"The {what} has {longest:,} tokens; {model_name} accepts at most {limit:,}")
    return encoded


def shift_right(model: nn.Module, labels: list[int]) -> list[int]:
    """The decoder input the model builds from ``labels`` (its start token, then labels[:-1])."""
    start = decoder_start(model)  # a clear error first, where the model's own shift would fail
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if prepare is not None:
        return prepare(labels=torch.tensor([labels])).view(-1).tolist()
    return [start] + labels[:-1]


def decoder_start(model: nn.Module) -> int:
    config = model.config
    for source in (getattr(model, "generation_config", None), config, getattr(config, "decoder", None)):
        value = getattr(source, "decoder_start_token_id", None)
        if isinstance(value, int):
            return value
    raise InputError(
        f"{type(model).__name__} names no decoder_start_token_id, so attnviz cannot tell what its decoder "
        "reads first; set model.config.decoder_start_token_id, or pass decoder_input_ids= yourself"
    )


def ids_rows(ids: Tensor, what: str) -> list[Encoded]:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ArgumentTypeError(f"{what} must be a [batch, pos] integer tensor")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise EmptyTextError(f"{what} has shape {tuple(ids.shape)}: give at least one token")
    return [
        (row.tolist(), spaced_offsets([str(t) for t in row.tolist()]), [str(t) for t in row.tolist()]) for row in ids
    ]


def spaced_offsets(tokens: list[str]) -> list[tuple[int, int]]:
    offsets, pos = [], 0
    for t in tokens:
        offsets.append((pos, pos + len(t)))
        pos += len(t) + 1
    return offsets


def padded(encoded: list[Encoded], device) -> tuple[Tensor, Tensor]:
    n = max(len(ids) for ids, _, _ in encoded)
    both = torch.zeros(2, len(encoded), n, dtype=torch.long)  # ids and mask, moved to the device in one copy
    for b, (row, _, _) in enumerate(encoded):
        both[0, b, : len(row)] = torch.tensor(row, dtype=torch.long)
        both[1, b, : len(row)] = 1
    both = both.to(device)
    return both[0], both[1]


def decoder_inputs(model, tokenizer, encoded, target, decoder_input_ids, encoder_decoder, max_length, limit, name):
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
        decoded = ids_rows(decoder_input_ids, "decoder_input_ids")
        if len(decoded) != len(encoded):
            raise InputError(f"decoder_input_ids has {len(decoded)} rows for {len(encoded)} inputs")
        return None, decoded
    if target is None:
        start = decoder_start(model)
        token = tokenizer.convert_ids_to_tokens([start])[0] if tokenizer is not None else str(start)
        return None, [([start], [(0, 0)], [token]) for _ in encoded]
    targets = check_texts(target, "target")
    if len(targets) != len(encoded):
        raise InputError(f"{len(targets)} targets for {len(encoded)} texts; give one target per text")
    if tokenizer is None:
        raise InputError("a target needs the tokenizer; pass tokenizer= (or decoder_input_ids=)")
    decoded = []
    for labels, offsets, _ in tokenize(tokenizer, targets, max_length, limit, name, what="target"):
        shifted = shift_right(model, labels)
        shifted_offsets = [(0, 0)] + offsets[: len(shifted) - 1]
        decoded.append((shifted, shifted_offsets, tokenizer.convert_ids_to_tokens(shifted)))
    return targets, decoded


def check_vocabulary(model: nn.Module, encoded: list[Encoded], what: str) -> None:
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
