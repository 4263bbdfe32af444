"""Two models side by side: :func:`align_heads` (``attnviz.align_heads``) matches each head of one to a head of the other.

The corpus is tokenized once (the two models must share a tokenizer: rows are compared token by token), captured
by each model in batches (:func:`attnviz.capture`, its self-check included), and every pair of heads compared row
by row (:func:`~attnviz.analysis.alignment.row_similarity`); the pairs are matched by the Hungarian method per
layer, or over every head with ``across_layers=True`` (:func:`~attnviz.analysis.alignment.match_heads`). With
``atlas=True`` each model's head atlas over the same encodings (:func:`head_atlas`) says which matched heads kept
their roles.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ...analysis.alignment import MEASURES, HeadAlignment, match_heads, row_similarity
from ...errors import InputError
from ..capture.inputs import tokenize
from ..capture.models import load_model
from ..capture.runner import capture
from .atlas import head_atlas, tokenize_corpus
from .timeline import tokenizer_fingerprint

__all__ = ["THRESHOLD", "align_heads"]

THRESHOLD = 0.9  # a matched pair below this mean similarity has no good match


def align_heads(
    model_a: Any,
    model_b: Any,
    corpus: str | Path | Iterable[str],
    *,
    tokenizer: Any = None,
    measure: str = "js",
    across_layers: bool = False,
    threshold: float = THRESHOLD,
    atlas: bool = True,
    batch_size: int = 8,
    max_length: int | None = None,
    add_bos: bool = False,
    seed: int = 0,
    device: str | None = None,
    dtype: str | None = None,
) -> HeadAlignment:
    """Match each head of ``model_a`` to a head of ``model_b`` (two models of the same shape) by their patterns
    over ``corpus``.

    - ``model_a``, ``model_b``: names or model objects (then pass ``tokenizer``, shared by both); their
      tokenizers must agree (:func:`~attnviz.workflows.corpus.timeline.tokenizer_fingerprint`).
    - ``corpus``: texts or a ``.txt`` / ``.jsonl`` file, tokenized once; ``max_length`` cuts each text.
    - ``measure``: ``"js"`` (mean over rows of 1 − the Jensen–Shannon divergence in bits) or ``"cosine"``.
    - ``across_layers``: match over every head of the model (a head may move to another layer), not per layer.
    - ``threshold``: a pair whose mean similarity is below it has ``no match`` (default 0.9: near-uniform
      heads are alike under either measure, so a high bar).
    - ``atlas``: also run each model's head atlas (``seed`` its random sequences) to say which matched heads
      kept their roles (``kept``) and which changed (``changed``); ``atlas=False``: every pair above the
      threshold is ``kept`` as far as the patterns tell, and the roles are "".
    """
    import pandas as pd  # deferred: importing attnviz does not import pandas

    if measure not in MEASURES:
        raise InputError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0.0 <= threshold <= 1.0:
        raise InputError(f"threshold must be a number in [0, 1], got {threshold!r}")
    models, tokenizers, names = [], [], []
    for model in (model_a, model_b):
        own = None
        if isinstance(model, (str, Path)):
            names.append(str(model))
            model, own = load_model(str(model), device=device, dtype=dtype)
        else:
            names.append(type(model).__name__)
        models.append(model)
        tokenizers.append(tokenizer if tokenizer is not None else own)
    if any(t is None for t in tokenizers):
        raise InputError("a model object comes without its tokenizer: pass tokenizer= (both models read it)")
    if tokenizer is None and tokenizer_fingerprint(tokenizers[0]) != tokenizer_fingerprint(tokenizers[1]):
        raise InputError(
            f"{names[0]!r} and {names[1]!r} have different tokenizers: their heads are compared row by row over the "
            "same tokens, so align models of one tokenizer"
        )
    tok = tokenizers[0]
    tokenized = tokenize_corpus(corpus, tok, add_bos=add_bos, name=names[0])
    texts = tokenized.texts
    encoded = tokenize(tok, texts, max_length, None, names[0], add_bos) if max_length is not None else tokenized.encoded

    sums: np.ndarray | None = None
    rows = 0
    shape: tuple[int, int] | None = None
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        caps = [capture(m, batch, tok, tokenized=encoded[start : start + batch_size], add_bos=add_bos) for m in models]
        for cap_a, cap_b in zip(*caps):
            here = [(len(c.layer_indices()), c.n_heads) for c in (cap_a, cap_b)]
            if len(cap_a.parts) != 1:
                raise InputError("align_heads reads one-stack models (an encoder or a decoder), not an encoder-decoder")
            if here[0] != here[1]:
                raise InputError(
                    f"{names[0]!r} has {here[0][0]} layers × {here[0][1]} heads and {names[1]!r} {here[1][0]} × "
                    f"{here[1][1]}: align models of the same shape"
                )
            shape = here[0]
            n_layers, n_heads = shape
            maps_a = [cap_a.attention(layer) for layer in cap_a.layer_indices()]  # [head, q, k] each
            maps_b = [cap_b.attention(layer) for layer in cap_b.layer_indices()]
            if sums is None:
                size = n_layers if across_layers else 1
                sums = np.zeros((n_layers, n_heads, size, n_heads))
            for la, a in enumerate(maps_a):
                for lb, b in enumerate(maps_b):
                    if not across_layers and la != lb:
                        continue
                    sums[la, :, lb if across_layers else 0] += row_similarity(a, b, measure).numpy()
            rows += maps_a[0].shape[1]
    assert sums is not None and shape is not None
    n_layers, n_heads = shape
    mean = sums / rows
    per_layer = (
        np.stack([mean[layer, :, layer] for layer in range(n_layers)]) if across_layers else mean[:, :, 0]
    )  # [layer, head_a, head_b]
    pairs: list[tuple[int, int, int, int, float]] = []
    if across_layers:
        flat = mean.reshape(n_layers * n_heads, n_layers * n_heads)
        for r, c, s in match_heads(flat):
            pairs.append((r // n_heads, r % n_heads, c // n_heads, c % n_heads, s))
    else:
        for layer in range(n_layers):
            pairs.extend((layer, r, layer, c, s) for r, c, s in match_heads(per_layer[layer]))

    roles_a: dict[tuple[int, int], str] = {}
    roles_b: dict[tuple[int, int], str] = {}
    if atlas:
        for model, found in zip(models, (roles_a, roles_b)):
            table = head_atlas(
                model,
                tokenized,
                tokenizer=tok,
                batch_size=batch_size,
                seed=seed,
                max_length=max_length,
                add_bos=add_bos,
                progress=False,
            )
            found.update({(int(r.layer), int(r.head)): str(r.roles) for r in table.itertuples()})
    made = []
    for la, ha, lb, hb, s in pairs:
        ra, rb = roles_a.get((la, ha), ""), roles_b.get((lb, hb), "")
        status = "no match" if s < threshold else "kept" if ra == rb else "changed"
        made.append(
            {
                "layer_a": la,
                "head_a": ha,
                "layer_b": lb,
                "head_b": hb,
                "similarity": s,
                "roles_a": ra,
                "roles_b": rb,
                "status": status,
            }
        )
    matching = pd.DataFrame(made).sort_values(["layer_a", "head_a"]).reset_index(drop=True)
    return HeadAlignment(
        similarity=per_layer,
        matching=matching,
        threshold=float(threshold),
        measure=measure,
        across=mean.reshape(n_layers, n_heads, n_layers, n_heads) if across_layers else None,
        rows=rows,
        texts=len(texts),
        names=(names[0], names[1]),
    )
