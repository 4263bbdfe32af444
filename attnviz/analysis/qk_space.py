"""One head's queries and keys, from many texts, in one joint space (AttentionViz, Yeh et al. 2023).

:func:`qk_vectors` gathers a head's query vectors and the key vectors of its key/value group (a
GQA head reads its group's key) over every text, and — with ``normalise`` — applies AttentionViz's
two transforms, both of which leave every softmax row as it was:

- **key translation**: every key moves by ``t = mean(q) - mean(k)``, so the keys' centroid sits on
  the queries'; each score of a row changes by the same ``q·t``, which the softmax cancels;
- **scaling**: queries times ``c``, keys divided by ``c``, with ``c = sqrt(mean‖k+t‖ / mean‖q‖)``, so
  both mean norms are equal; every dot product stays what it was.

After them, closeness in the space tracks the dot product (``‖q - k‖² = ‖q‖² + ‖k‖² - 2 q·k``).
Neither holds under a soft-cap or learned sink logits (the shift is no longer cancelled): such a
head is refused with ``normalise=True``.

:func:`qk_space` embeds those vectors in 2 or 3 dimensions — PCA (exact, torch's SVD), t-SNE
(scikit-learn) or UMAP (umap-learn; ``pip install "attnviz[space]"``) — and returns one row per query
and per key, with the transform it used in ``df.attrs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..data.capture import Capture
from ..errors import ArgumentTypeError, InputError
from .patterns import is_punct

if TYPE_CHECKING:
    import pandas as pd

    from ..data.words import TokenSequence

__all__ = ["METHODS", "QKVectors", "qk_space", "qk_vectors"]

METHODS = {
    "pca": "principal components of the normalised vectors (exact: torch's SVD)",
    "tsne": "t-SNE (scikit-learn), a non-linear neighbourhood embedding",
    "umap": "UMAP (umap-learn, the [space] extra), a non-linear neighbourhood embedding",
}
CONTEXT = 4  # tokens on each side of a point's token in its hover text


@dataclass
class QKVectors:
    """A head's queries and keys over many texts, as :func:`qk_vectors` made them.

    ``queries`` ``[N, d]`` and ``keys`` ``[M, d]`` (float32, after the transform), ``rows`` the
    rows of both (queries first): kind, text, position, token, word, token_class, context, norm
    (the raw vector's norm, before the transform). ``translation`` ``[d]`` and ``scaling`` are the
    transform (zeros and 1 without ``normalise``); ``spans`` each text's ``(query slice, key slice)``
    in ``queries`` / ``keys``."""

    layer: int
    head: int
    kv_head: int  # the key/value head whose keys the head reads
    shared: int  # query heads per key/value head (1 without GQA)
    part: str
    queries: Tensor
    keys: Tensor
    rows: list[dict[str, Any]]
    translation: Tensor
    scaling: float
    normalised: bool
    spans: list[tuple[slice, slice]] = field(default_factory=list)


def _fits(seq: TokenSequence) -> bool:
    """Whether the offsets are character spans of the sequence's own text (not so without a text)."""
    return bool(seq.text) and all(0 <= start <= end <= len(seq.text) for start, end in seq.offsets)


def token_contexts(seq: TokenSequence, window: int = CONTEXT) -> list[str]:
    """Each token bracketed among its ``window`` neighbours on each side, as the text reads: the text
    from the first to the last token of the window, its spaces as they are, the token's characters
    in brackets (a word piece inside its word: ``Unbelieva[bly],``). A special token that covers no
    text ([CLS], BOS) shows as its token string, set apart by a space; a line break as ↵. Where the
    offsets are not spans of the text (no text): the labels joined by spaces."""
    labels = seq.token_labels
    if _fits(seq):
        return [_in_text(seq, labels, i, window) for i in range(seq.n_tokens)]
    out = []
    for i in range(seq.n_tokens):
        lo = max(0, i - window)
        out.append(
            " ".join(f"[{label}]" if j == i else label for j, label in enumerate(labels[lo : i + 1 + window], lo))
        )
    return out


def _in_text(seq: TokenSequence, labels: list[str], position: int, window: int) -> str:
    lo, hi = max(0, position - window), min(seq.n_tokens, position + 1 + window)
    text, out = seq.text, ""
    focus_start, focus_end = seq.offsets[position]
    pos: int | None = None  # where the text written so far ends
    apart = False  # a special token was written last: the text goes on after a space
    for j in range(lo, hi):
        start, end = seq.offsets[j]
        if start == end:  # a special token covers no text: its own string, set apart by spaces
            shown = f"[{seq.tokens[j]}]" if j == position else seq.tokens[j]
            out += shown if not out or out[-1].isspace() else f" {shown}"
            apart = True
            continue
        if focus_end > focus_start and j != position:  # the focus token's characters are its own
            end, start = (min(end, focus_start), start) if j < position else (end, max(start, focus_end))
            end = max(start, end)
        if pos is not None:
            start = max(start, pos)
        piece = text[start:end] if pos is None else text[pos:end]  # from the last end: the spaces between
        if j == position:
            gap, body = text[pos:start] if pos is not None else "", text[start:end]
            core = body.strip()
            lead, trail = body[: len(body) - len(body.lstrip())], body[len(body.rstrip()) :] if core else ""
            piece = f"{gap}{lead}[{core or labels[j]}]{trail}"
        if piece and apart and not piece[0].isspace():
            piece = f" {piece}"
        out += piece
        apart = apart and not piece
        pos = end if pos is None else max(pos, end)
    return out.replace("\r\n", "↵").replace("\n", "↵").strip()


def _token_class(seq: TokenSequence, position: int) -> str:
    start, end = seq.offsets[position]
    if position == 0:
        return "first"
    if start == end:
        return "special"
    return "punctuation" if is_punct(seq.text[start:end]) else "word"


def _rows(seq: TokenSequence, kind: str, text: int, norms: Tensor) -> list[dict[str, Any]]:
    labels = seq.token_labels
    word_of = [""] * seq.n_tokens
    for word in seq.words:
        for t in word.tokens:
            word_of[t] = word.text
    contexts = token_contexts(seq)
    out = []
    for i, norm in enumerate(norms.tolist()):
        out.append(
            {
                "kind": kind,
                "text": text,
                "position": i,
                "token": labels[i],
                "word": word_of[i],
                "token_class": _token_class(seq, i),
                "context": contexts[i],
                "norm": norm,
            }
        )
    return out


def qk_vectors(
    captures: Capture | Sequence[Capture],
    layer: int,
    head: int,
    *,
    part: str | None = None,
    normalise: bool = True,
) -> QKVectors:
    """The queries of ``head`` at ``layer`` and the keys of its key/value group, over every capture,
    with AttentionViz's softmax-invariant normalisation (see the module). ``part`` picks the
    encoder, decoder or cross attention of an encoder-decoder capture (cross: decoder queries,
    encoder keys)."""

    caps = [captures] if isinstance(captures, Capture) else list(captures)
    if not caps or not all(isinstance(c, Capture) for c in caps):
        raise ArgumentTypeError("qk_space needs a Capture or a non-empty list of Captures")
    if not isinstance(normalise, bool):
        raise ArgumentTypeError(f"normalise must be True or False, got {normalise!r}")
    part = caps[0].resolve_part(part)
    for cap in caps:
        if cap.resolve_part(part) != part or (cap.n_heads, cap.d_head) != (caps[0].n_heads, caps[0].d_head):
            raise InputError("the captures come from different models or parts: embed one model's captures together")
    caps[0].check_head(head, part)
    kv_head = caps[0].kv_head_of(head, part)
    qs, ks, rows_q, rows_k, spans = [], [], [], [], []
    n_q = n_k = 0
    for text, cap in enumerate(caps):
        rec = cap.layer(layer, part)
        if normalise and (rec.softcap is not None or rec.sinks is not None):
            raise InputError(
                f"layer {layer} uses a soft-cap or learned sinks: translating its keys would change its "
                "attention; embed it with normalise=False"
            )
        q = cap.q(layer, part, head).float().cpu()  # by the model's number (capture(heads=) keeps some)
        k = cap.k(layer, part, head).float().cpu()  # the key/value head it reads
        query_seq, key_seq = cap.sequences(part)
        rows_q += _rows(query_seq, "query", text, q.norm(dim=-1))
        rows_k += _rows(key_seq, "key", text, k.norm(dim=-1))
        spans.append((slice(n_q, n_q + len(q)), slice(n_k, n_k + len(k))))
        n_q, n_k = n_q + len(q), n_k + len(k)
        qs.append(q)
        ks.append(k)
    queries, keys = torch.cat(qs), torch.cat(ks)
    translation, scaling = torch.zeros(queries.shape[-1]), 1.0
    if normalise:
        translation = queries.double().mean(0).float() - keys.double().mean(0).float()
        keys = keys + translation
        q_norm, k_norm = queries.norm(dim=-1).double().mean().item(), keys.norm(dim=-1).double().mean().item()
        if q_norm > 0 and k_norm > 0:
            scaling = math.sqrt(k_norm / q_norm)
        queries, keys = queries * scaling, keys / scaling
    info = caps[0].info(part)
    return QKVectors(
        layer,
        head,
        kv_head,
        info["n_heads"] // info["n_kv_heads"],
        part,
        queries,
        keys,
        rows_q + rows_k,
        translation,
        scaling,
        normalise,
        spans,
    )


def _embed(points: Tensor, method: str, dims: int, seed: int) -> tuple[Tensor, dict[str, Any]]:
    if method == "pca":
        centred = points.double() - points.double().mean(0)
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
        coords = centred @ vh[:dims].T
        variance = s**2
        share = (variance[:dims] / variance.sum()).tolist() if variance.sum() > 0 else [0.0] * dims
        return coords.float(), {"components": vh[:dims].float(), "explained_variance_ratio": share}
    array = points.double().numpy()
    if method == "tsne":
        try:
            from sklearn.manifold import TSNE
        except ImportError as exc:
            raise InputError('t-SNE needs scikit-learn: pip install "attnviz[space]"') from exc
        perplexity = min(30.0, max(1.0, (len(array) - 1) / 3))
        coords = TSNE(n_components=dims, random_state=seed, perplexity=perplexity, init="pca").fit_transform(array)
        return torch.from_numpy(coords).float(), {"perplexity": perplexity}
    try:
        import umap
    except ImportError as exc:
        raise InputError('UMAP needs umap-learn: pip install "attnviz[space]"') from exc
    neighbours = min(15, len(array) - 1)
    reducer = umap.UMAP(n_components=dims, random_state=seed, n_neighbors=neighbours, n_jobs=1)
    return torch.from_numpy(reducer.fit_transform(array)).float(), {"n_neighbors": neighbours}


def qk_space(
    captures: Capture | Sequence[Capture],
    layer: int,
    head: int,
    *,
    part: str | None = None,
    method: str = "pca",
    normalise: bool = True,
    dims: int = 2,
    max_points: int | None = 20_000,
    seed: int = 0,
) -> pd.DataFrame:
    """One head's queries and keys over ``captures``, embedded together in ``dims`` (2 or 3) dimensions.

    Returns one row per query and per key: ``kind`` ("query" / "key"), ``text`` (the capture's index),
    ``position``, ``token``, ``word``, ``token_class`` (first, special, punctuation, word),
    ``context`` (for hover: the text around the token, :data:`CONTEXT` tokens each side, the token
    bracketed — :func:`token_contexts`), ``norm`` (the raw vector's norm) and
    the coordinates ``x, y`` (``z``). ``df.attrs["transform"]`` states what was done: the head and
    its key/value head, the normalisation (translation and scaling), the method and what it fitted,
    and which points were kept — past ``max_points`` a random sample (``seed``) of them, the same
    share of queries and of keys.

    ``method``: ``"pca"`` (exact), ``"tsne"`` or ``"umap"`` (see :data:`METHODS`)."""
    import pandas as pd

    if method not in METHODS:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if dims not in (2, 3) or isinstance(dims, bool):
        raise InputError(f"dims must be 2 or 3, got {dims!r}")
    if max_points is not None and (not isinstance(max_points, int) or isinstance(max_points, bool) or max_points < 2):
        raise InputError(f"max_points must be a whole number ≥ 2 or None, got {max_points!r}")
    vectors = qk_vectors(captures, layer, head, part=part, normalise=normalise)
    points = torch.cat([vectors.queries, vectors.keys])
    total = len(points)
    kept = torch.arange(total)
    if max_points is not None and total > max_points:
        generator = torch.Generator().manual_seed(seed)
        n_q = len(vectors.queries)
        take_q = round(max_points * n_q / total)
        q_idx = torch.randperm(n_q, generator=generator)[:take_q].sort().values
        k_idx = torch.randperm(total - n_q, generator=generator)[: max_points - take_q].sort().values + n_q
        kept = torch.cat([q_idx, k_idx])
    if len(kept) <= dims:
        raise InputError(f"{len(kept)} points cannot be embedded in {dims} dimensions: give more or longer texts")
    coords, fitted = _embed(points[kept], method, dims, seed)
    df = pd.DataFrame([vectors.rows[i] for i in kept.tolist()])
    for axis, name in enumerate("xyz"[:dims]):
        df[name] = coords[:, axis].numpy()
    df.attrs["transform"] = {
        "layer": layer,
        "head": head,
        "kv_head": vectors.kv_head,
        "shared": vectors.shared,
        "part": vectors.part,
        "normalised": normalise,
        "translation": vectors.translation.tolist(),
        "scaling": vectors.scaling,
        "method": method,
        "dims": dims,
        "points": total,
        "kept": len(kept),
        "seed": seed,
        **{k: v.tolist() if isinstance(v, Tensor) else v for k, v in fitted.items()},
    }
    df.attrs["description"] = describe(df.attrs["transform"])
    return df


def describe(transform: dict[str, Any]) -> str:
    """One sentence saying what a :func:`qk_space` frame shows."""
    t = transform
    norm = (
        f"keys translated onto the queries' mean (|t| = {torch.tensor(t['translation']).norm():.3g}), "
        f"queries ×{t['scaling']:.3g} and keys ÷{t['scaling']:.3g} (AttentionViz's softmax-invariant normalisation)"
        if t["normalised"]
        else "raw vectors (no normalisation)"
    )
    sample = (
        f"all {t['points']} points"
        if t["kept"] == t["points"]
        else f"{t['kept']} of {t['points']} points (seed {t['seed']})"
    )
    how = t["method"].upper() if t["method"] == "pca" else {"tsne": "t-SNE", "umap": "UMAP"}[t["method"]]
    extra = ""
    if "explained_variance_ratio" in t:
        extra = f", {sum(t['explained_variance_ratio']):.0%} of the variance"
    kv = f" (keys of KV head {t['kv_head']})" if t["shared"] > 1 else ""
    return f"L{t['layer']}·H{t['head']}{kv}, {t['part']}: {how} in {t['dims']}-D of {sample}{extra}; {norm}."
