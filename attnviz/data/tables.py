"""A capture as a tidy table (:meth:`attnviz.Capture.to_pandas`): one row per part, layer, head,
query and key, with the weight and what the head moves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pandas as pd

    from .capture import Capture

__all__ = ["capture_table"]


def capture_table(
    cap: Capture, layer: int | None = None, head: int | None = None, *, part: str | None = None, words: bool = False
) -> pd.DataFrame:
    """:meth:`attnviz.Capture.to_pandas`'s table (its docstring says what each column is)."""
    import pandas as pd  # deferred: pandas is heavy and only the tables need it

    parts = cap.parts if part is None else (cap.resolve_part(part),)
    frames = []
    for p in parts:
        queries, keys = cap.sequences(p)
        q_labels = queries.word_labels if words else queries.tokens
        k_labels = keys.word_labels if words else keys.tokens
        n_q, n_k = len(q_labels), len(k_labels)
        if head is not None:
            cap.check_head(head, p)
        for lay in cap.layer_indices(p) if layer is None else [layer]:
            w = cap.attention(lay, part=p, words=words).cpu()  # [head, q, k]
            c = (
                cap.moved(lay, part=p, words=words).cpu()
                if cap.layer(lay, p).value_dots is not None
                else torch.full_like(w, float("nan"))
            )
            numbers = cap.layer(lay, p).head_numbers  # the model's heads, in the stacks' order
            for h in numbers if head is None else [head]:
                i = cap.head_index(lay, h, p)
                frames.append(
                    pd.DataFrame(
                        {
                            "part": p,
                            "layer": lay,
                            "head": h,
                            "query_pos": torch.arange(n_q).repeat_interleave(n_k).numpy(),
                            "key_pos": torch.arange(n_k).repeat(n_q).numpy(),
                            "query_token": [q_labels[i] for i in range(n_q) for _ in range(n_k)],
                            "key_token": k_labels * n_q,
                            "weight": w[i].reshape(-1).numpy(),
                            "moved": c[i].reshape(-1).numpy(),
                        }
                    )
                )
    table = pd.concat(frames, ignore_index=True)
    table.attrs["provenance"] = cap.provenance
    return table
