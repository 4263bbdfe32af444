"""The seeds' shape and cost tables, computed for a real model and text.

Shapes follow the seed's six steps (X → Q, K, V → QKᵀ → A → Z); FLOPs count a multiply-add as
2; memory is the bytes needed to *store* the attention matrix A, which is what grows as n².
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from ..data.capture import Capture

__all__ = ["cost_tables", "human_bytes", "human_count"]


def human_count(x: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:,.0f}"


def human_bytes(x: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:,.0f} B"


def cost_tables(cap: Capture, *, bytes_per_weight: int = 4) -> dict[str, pd.DataFrame]:
    """``{"shapes", "flops", "memory"}`` tables for this capture's model and text length.

    - shapes: X, Q, K, V, QKᵀ, A, Z for one layer, per head and for all heads, with element counts.
    - flops: the QKV projection, QKᵀ and A·V for one layer and for the whole model.
    - memory: bytes of A per head, per layer and for the model, at this n and at 4k and 128k tokens.
    """
    import pandas as pd

    n, L, h, kv, dk = cap.n_tokens, cap.n_layers, cap.n_heads, cap.n_kv_heads, cap.d_head
    d_model = int(cap.model.get("d_model") or h * dk)
    shapes = [
        ("X", "input of the layer", (n, d_model)),
        ("Q", f"{h} query heads", (h, n, dk)),
        ("K", f"{kv} key heads" + (" (GQA: shared by query heads)" if kv != h else ""), (kv, n, dk)),
        ("V", f"{kv} value heads", (kv, n, dk)),
        ("QKᵀ", "scores, one n×n per head", (h, n, n)),
        ("A", "softmax(QKᵀ/√d_k + M), rows sum to 1", (h, n, n)),
        ("Z", "A·V, heads concatenated", (n, h * dk)),
    ]
    shape_rows = []
    for name, meaning, shape in shapes:
        count = 1
        for s in shape:
            count *= s
        shape_rows.append(
            {"tensor": name, "meaning": meaning, "shape": " × ".join(map(str, shape)), "elements": f"{count:,}"}
        )

    proj = 2 * n * d_model * (h + 2 * kv) * dk
    qk = 2 * h * n * n * dk
    av = 2 * h * n * n * dk
    flops = pd.DataFrame(
        [
            {"operation": name, "grows as": grows, "one layer": human_count(x), f"all {L} layers": human_count(x * L)}
            for name, grows, x in (
                ("Q, K, V projection", "n · d_model · d_k", proj),
                ("QKᵀ", "n² · d_k", qk),
                ("A · V", "n² · d_k", av),
            )
        ]
    )
    memory = []
    for tokens in (n, 4096, 131072):
        a = tokens * tokens * bytes_per_weight
        memory.append(
            {
                "tokens": f"{tokens:,}" + (" (this text)" if tokens == n else ""),
                "A per head": human_bytes(a),
                "A per layer": human_bytes(a * h),
                "A for the model": human_bytes(a * h * L),
                "vs this text": f"×{(tokens / n) ** 2:,.0f}" if tokens != n else "×1",
            }
        )
    return {"shapes": pd.DataFrame(shape_rows), "flops": flops, "memory": pd.DataFrame(memory)}
