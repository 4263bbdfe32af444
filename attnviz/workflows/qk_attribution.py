"""``qk_attribution()``: why a head looks there — one query–key score taken apart, exactly.

One forward of the capture's ids (:func:`~attnviz.workflows.capture.from_capture.capture_inputs`: the
capture's own tokens) with forward hooks on what writes the residual stream — the embeddings, each
earlier attention's output projection (its input: every head's ``α·V``, read as head slices by
:class:`~attnviz.engine.projections.OutputProjection`), each earlier MLP — and on the norms, each hook
keeping only the few positions asked for (memory O(components · hidden), never n²). The forward stops
where the layer's attention begins. After it, the tape is replayed in float64: each write becomes a
component; a norm on the stream (post-LN, BERT) is applied to every component with its scale held at
the value the forward read (LayerNorm: centred, divided by the recorded std, its bias a component
``bias`` of its own; RMSNorm: divided by the recorded rms); then the norm before the layer's attention
likewise, the head's Q and K projections (their biases in the ``bias`` row), RoPE at the two positions,
the scaling — a ``[query component, key component]`` matrix whose sum is the model's score, which the
capture holds (:class:`~attnviz.data.attribution.QKAttribution` checks it).

Where a family's stream is written and read is data in its module (``ResidualSpec``,
:data:`attnviz.families.RESIDUAL_SPECS`); every other family is refused with why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import torch
from torch import Tensor, nn

from ..analysis.coref import find_span
from ..data.attribution import SCORE_BIAS, QKAttribution
from ..data.capture import Capture
from ..engine.projections import OutputProjection, output_projection, projection_module
from ..errors import ArgumentTypeError, InputError, OutOfRangeError, UnsupportedModelError
from ..families import RESIDUAL_SPECS
from ..families.facts import ResidualSpec
from .capture.from_capture import capture_inputs
from .capture.pipeline import Resolved, forward_inputs, resolve

__all__ = ["TOLERANCE", "Tape", "qk_attribution", "residual_spec", "token_position"]

#: how far Σ pairs may be from the model's score (relative to max(|score|, 1)), per dtype the model ran in
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 1e-2, torch.bfloat16: 5e-2}

#: a query or key: a token position, or a word of the text (its last token)
Token = int | str


def residual_spec(model: nn.Module) -> ResidualSpec:
    """The family's :class:`~attnviz.families.facts.ResidualSpec`, or :class:`UnsupportedModelError` saying why."""
    model_type = getattr(model.config, "model_type", None) or ""
    spec = RESIDUAL_SPECS.get(model_type)
    if spec is None:
        raise UnsupportedModelError(
            f"qk_attribution cannot take apart the scores of {type(model).__name__} ({model_type!r}): where its "
            "residual stream is written and normalised is not described for it, so its score cannot be split "
            f"exactly. It is for the model types {', '.join(sorted(RESIDUAL_SPECS))}; other families need a "
            "ResidualSpec in their attnviz/families module"
        )
    return spec


def token_position(cap: Capture, what: Token, name: str) -> int:
    """A token position of ``cap``'s text: an int (negative counts from the end), or a word (matched as
    :func:`attnviz.analysis.find_span` matches it: its first occurrence) — the word's last token."""
    n = cap.n_tokens
    if isinstance(what, bool) or not isinstance(what, (int, str)):
        raise ArgumentTypeError(f"{name} must be a token position or a word of the text, got {what!r}")
    if isinstance(what, int):
        if not -n <= what < n:
            raise OutOfRangeError(f"{name}={what} is out of range: the text has tokens 0..{n - 1}")
        return what % n
    return find_span(cap, what).tokens[-1]


# ---------------------------------------------------------------- the forward
class _Stop(Exception):
    """The forward has reached the layer's attention: everything needed is on the tape."""


@dataclass
class Tape:
    """What the hooks keep of one forward, in the order the model ran: ``(kind, key, rows)`` events,
    each ``rows`` the few positions asked for — ``write`` (a component's label), ``heads`` (the layer of
    an output projection's input: every head's A·V), ``norm`` (a norm on the stream and its input), then
    ``stream`` (the stream entering the layer) and ``normed`` (its norm's output, pre layouts)."""

    index: Tensor  # [positions] on the model's device
    events: list[tuple[str, Any, Tensor]] = field(default_factory=list)
    rope: tuple[Tensor, Tensor] | None = None  # (cos, sin) [positions, rotated width]

    def rows(self, t: Tensor) -> Tensor:  # [..., n, hidden] -> [positions, hidden], the first item's
        picked = t.index_select(-2, self.index)
        return picked.reshape(-1, *picked.shape[-2:])[0].detach()


@contextmanager
def _hooks(
    model: nn.Module, spec: ResidualSpec, layer: int, tape: Tape, rope: bool
) -> Iterator[tuple[list[nn.Module], nn.Module]]:
    """The hooks that fill ``tape``, removed when the block ends (also when the forward raises)."""
    base = getattr(model, "base_model", model)
    blocks: list[nn.Module] = list(base.get_submodule(spec.blocks))  # type: ignore[arg-type]  # a ModuleList
    if not 0 <= layer < len(blocks):
        raise OutOfRangeError(f"layer {layer} is out of range: the model has layers 0..{len(blocks) - 1}")
    handles: list[Any] = []
    names = {id(m): name for name, m in model.named_modules()}
    attentions = [block.get_submodule(spec.attention) for block in blocks[: layer + 1]]

    def write(label: str) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            tape.events.append(("write", label, tape.rows(out[0] if isinstance(out, tuple) else out)))

        return hook

    def reads(kind: str, key: Any) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            tape.events.append((kind, module if key is None else key, tape.rows(args[0])))
            if kind == "stream" and spec.norm is not None:
                tape.events.append(("normed", module, tape.rows(out)))

        return hook

    def stop(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if spec.norm is None:  # post: the attention reads the stream itself
            tape.events.append(("stream", None, tape.rows(args[0] if args else kwargs["hidden_states"])))
        if rope:
            found = kwargs.get("position_embeddings")
            if found is None:
                raise UnsupportedModelError(
                    f"{type(module).__name__} was called without position_embeddings: its rotary embedding "
                    "cannot be read, so its score cannot be split"
                )
            first, second = found if spec.rope_order == "cos_sin" else found[::-1]
            tape.rope = (tape.rows(first), tape.rows(second))
        raise _Stop

    try:
        for label, path in spec.embeddings:
            handles.append(base.get_submodule(path).register_forward_hook(write(label)))
        if spec.embedding_norm is not None:
            handles.append(base.get_submodule(spec.embedding_norm).register_forward_hook(reads("norm", None)))
        for n, block in enumerate(blocks[:layer]):
            out = projection_module(model, names[id(attentions[n])])
            if out is None:
                raise UnsupportedModelError(f"the output projection of {names[id(attentions[n])]} was not found")
            handles.append(out.register_forward_hook(reads("heads", n)))
            handles.append(block.get_submodule(spec.mlp).register_forward_hook(write(f"L{n}.mlp")))
            for path in spec.stream_norms:
                handles.append(block.get_submodule(path).register_forward_hook(reads("norm", None)))
        norm = None
        if spec.norm is not None:
            norm = blocks[layer].get_submodule(spec.norm)
            handles.append(norm.register_forward_hook(reads("stream", None)))
        handles.append(attentions[layer].register_forward_pre_hook(stop, with_kwargs=True))
        yield attentions, norm if norm is not None else attentions[layer]
    finally:
        for handle in handles:
            handle.remove()


def _run(resolved: Resolved, cap: Capture, spec: ResidualSpec, layer: int, positions: list[int]):
    model = resolved.model
    capture_inputs(resolved, cap, "qk_attribution")  # a generation's capture, or another kind of model's, refused
    kwargs, _ = forward_inputs(resolved, [(list(cap.token_ids), [], [])])
    tape = Tape(torch.tensor(positions, device=resolved.device))
    with _hooks(model, spec, layer, tape, spec.rope is not None) as (attentions, norm):
        try:
            with torch.no_grad():
                model(**kwargs)
        except _Stop:
            pass
        else:
            raise UnsupportedModelError(
                f"the forward of {type(model).__name__} never reached layer {layer}'s attention"
            )
    return tape, attentions, norm


# ---------------------------------------------------------------- the replay, in float64
def _fixed_norm(module: nn.Module, kind: str, stream: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor | None]:
    """The norm as the forward applied it to ``stream`` [positions, hidden], its scale held: (the linear
    map of a component, the bias it adds once)."""
    eps = next(v for v in (getattr(module, "eps", None), getattr(module, "variance_epsilon", None)) if v is not None)
    weight = getattr(module, "weight", None)
    gamma = 1.0 if weight is None else weight.detach().double().cpu()
    bias = getattr(module, "bias", None)
    beta = None if bias is None else bias.detach().double().cpu()
    if kind == "rms":
        scale = torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps)
        return (lambda c: c * scale * gamma), beta
    centred = stream - stream.mean(-1, keepdim=True)
    scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    return (lambda c: (c - c.mean(-1, keepdim=True)) * scale * gamma), beta


def _relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _replay(tape: Tape, spec: ResidualSpec, projections: dict[int, OutputProjection], n_heads: int):
    """(labels, components [component, position, hidden] entering the layer, normed components, error)."""
    components: dict[str, Tensor] = {}
    bias: Tensor | None = None
    errors = [0.0]
    normed = None
    for kind, key, rows in tape.events:
        rows = rows.double().cpu()
        if kind == "write":
            components[key] = components[key] + rows if key in components else rows
        elif kind == "heads":
            proj = projections[key]
            heads = proj.heads.double().cpu()  # [head, hidden, d_v]
            per = torch.einsum("phd,hed->hpe", rows.view(rows.shape[0], n_heads, -1), heads)
            for h in range(n_heads):
                components[f"L{key}.H{h}"] = per[h]
            if proj.bias is not None:
                b = proj.bias.double().cpu().expand_as(per[0])
                bias = b.clone() if bias is None else bias + b
        elif kind in ("norm", "stream"):
            total = torch.stack(list(components.values())).sum(0) + (0 if bias is None else bias)
            errors.append(_relative(total, rows))
            if kind == "stream":
                stream = rows
                continue
            module = key
            apply, beta = _fixed_norm(module, spec.norm_kind, rows)
            components = {label: apply(c) for label, c in components.items()}
            bias = apply(bias) if bias is not None else None
            if beta is not None:
                bias = beta.expand_as(rows).clone() if bias is None else bias + beta
        elif kind == "normed":
            apply, beta = _fixed_norm(key, spec.norm_kind, stream)
            normed = {label: apply(c) for label, c in components.items()}
            normed_bias = apply(bias) if bias is not None else torch.zeros_like(stream)
            if beta is not None:
                normed_bias = normed_bias + beta
            errors.append(_relative(sum(normed.values()) + normed_bias, rows))
    labels = list(components) + ["bias"]
    zero = torch.zeros_like(next(iter(components.values())))
    stack = torch.stack([*components.values(), zero if bias is None else bias])
    if normed is None:  # post: the stream is what the attention reads
        normed_stack = stack
    else:
        normed_stack = torch.stack([*normed.values(), normed_bias])
    return labels, stack, normed_stack, max(errors)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, style: str) -> Tensor:  # [component, d_head], cos/sin [width]
    """RoPE at one position, on the first rotated dimensions of each component (partial rotary keeps the rest)."""
    if style == "pairs":  # GPT-J: rotate every two
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        r = cos.shape[-1]
        x_rot = x[..., :r]
        turned = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), -1).flatten(-2)
    else:  # rotate half: Llama, NeoX
        r = cos.shape[-1]
        x_rot = x[..., :r]
        turned = torch.cat((-x_rot[..., r // 2 :], x_rot[..., : r // 2]), -1)
    return torch.cat((x_rot * cos + turned * sin, x[..., r:]), -1)


# ---------------------------------------------------------------- the public function
@overload
def qk_attribution(
    model: str | Path | nn.Module,
    cap: Capture,
    layer: int,
    head: int,
    query: Token,
    key: Token,
    *,
    part: str | None = None,
    versus: Token | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> QKAttribution: ...
@overload
def qk_attribution(
    model: str | Path | nn.Module,
    cap: Capture,
    layer: int,
    head: int,
    query: Token,
    key: list[Token] | tuple[Token, ...],
    *,
    part: str | None = None,
    versus: Token | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> list[QKAttribution]: ...
def qk_attribution(
    model: str | Path | nn.Module,
    cap: Capture,
    layer: int,
    head: int,
    query: Token,
    key: Token | list[Token] | tuple[Token, ...],
    *,
    part: str | None = None,
    versus: Token | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> QKAttribution | list[QKAttribution]:
    """Why ``head`` of ``layer`` gives ``query`` that score on ``key``: the pre-softmax score taken apart
    into (component writing the query, component writing the key) pairs that add up to it exactly.

    >>> cap = attnviz.capture("smollm2", "The cat sat on the mat because it was tired.")
    >>> why = attnviz.qk_attribution("smollm2", cap, 15, 3, query="it", key="cat")
    >>> why.pairs.head(), why.key_side.head(), why.total, why.score

    - ``model`` must be the model that made ``cap`` (a name or the object): one forward of the capture's
      own ids, hooked, stopping at ``layer``'s attention. A capture of another model does not add up and
      raises :class:`~attnviz.ValidationError` (as does any attribution whose pairs miss the model's score
      by more than :data:`TOLERANCE`, relative to max(|score|, 1)).
    - ``query`` / ``key`` / ``versus``: token positions, or words of the text (a word's last token). A
      list of keys gives a list of attributions, from the same forward.
    - ``versus``: the attribution of s(query, key) − s(query, versus) — why this key and not that one.
    - Components: ``embed`` (and ``pos``, ``type`` where the family adds learned ones), ``L{l}.H{h}``
      (each earlier head's output), ``L{l}.mlp``, ``bias`` (every bias: the output projections', the
      norms', the Q / K projections'); the model's own score bias, where it has one, is a pair of its own.
      Each norm's scale is the one the forward read, held fixed; RoPE is applied at the two positions.
    - Families: GPT-2, Llama / Qwen2 / Mistral (SmolLM2), GPT-NeoX, GPT-J, BERT (post-LN: each later
      LayerNorm applied to what passes through it). Others raise :class:`~attnviz.UnsupportedModelError`.
    """
    if not isinstance(cap, Capture):
        raise ArgumentTypeError(f"qk_attribution takes an attnviz.Capture of the text, got {type(cap).__name__}")
    resolved = resolve(model, tokenizer, device, dtype)
    spec = residual_spec(resolved.model)
    part = cap.resolve_part(part)
    rec = cap.layer(layer, part)
    if isinstance(head, bool) or not isinstance(head, int):
        raise ArgumentTypeError(f"head must be an int, got {head!r}")
    cap.check_head(head, part, layer)
    index = rec.head_index(head)  # where the model's head sits in the record (a capture of some heads: heads=)
    if rec.softcap is not None:
        raise UnsupportedModelError("a soft-capped score (tanh) is not a sum: it cannot be taken apart")
    asked: list[Token] = list(key) if isinstance(key, (list, tuple)) else [key]
    several = isinstance(key, (list, tuple))
    keys = [token_position(cap, k, "key") for k in asked]
    if not keys:
        raise InputError("give at least one key")
    i = token_position(cap, query, "query")
    v = None if versus is None else token_position(cap, versus, "versus")
    positions = sorted({i, *keys, *([] if v is None else [v])})
    at = {p: n for n, p in enumerate(positions)}

    n_heads, d_head, d_v = cap.info(part)["n_heads"], rec.q.shape[-1], rec.v.shape[-1]  # the model's, every head
    kv = cap.kv_head_of(head, part)
    tape, attentions, _ = _run(resolved, cap, spec, layer, positions)
    names = {id(m): name for name, m in resolved.model.named_modules()}
    projections = {}
    for n in range(layer):
        found = output_projection(resolved.model, names[id(attentions[n])], n_heads, d_v)
        if found is None:
            raise UnsupportedModelError(f"layer {n}'s output projection is not {n_heads} heads × {d_v} wide")
        projections[n] = found
    labels, stack, normed, residual_error = _replay(tape, spec, projections, n_heads)

    w_q, b_q, w_k, b_k = (None if t is None else t.detach().double().cpu() for t in spec.qk(attentions[layer]))
    assert w_q is not None and w_k is not None
    w_q, w_k = w_q.view(-1, d_head, w_q.shape[-1])[head], w_k.view(-1, d_head, w_k.shape[-1])[kv]

    def side(pos: int, w: Tensor, b: Tensor | None, index: int) -> Tensor:  # [component, d_head]
        x = normed[:, at[pos]] @ w.T
        if b is not None:
            x[-1] += b.view(-1, d_head)[index]
        if tape.rope is not None:
            cos, sin = (t[at[pos]].double().cpu() for t in tape.rope)
            x = _rotate(x, cos, sin, spec.rope or "half")
        return x

    q = side(i, w_q, b_q, head)
    key_vectors = {p: side(p, w_k, b_k, kv) for p in {*keys, *([] if v is None else [v])}}
    q_model, k_model = rec.q[index].double().cpu(), rec.k[rec.kv_index(index)].double().cpu()

    def model_score(j: int) -> float:
        s = float(q_model[i] @ k_model[j]) * rec.scaling
        bias = rec.bias_part(torch.tensor([i]), torch.tensor([j]))
        if bias is not None:
            s += float(bias[index if bias.shape[0] > 1 else 0, 0, 0])
        return s

    def score_bias(j: int) -> float:
        bias = rec.bias_part(torch.tensor([i]), torch.tensor([j]))
        return 0.0 if bias is None else float(bias[index if bias.shape[0] > 1 else 0, 0, 0])

    dtype_ = next(resolved.model.parameters()).dtype
    tolerance = TOLERANCE.get(dtype_, 1e-4)
    tokens = cap.tokens
    results = []
    for j in keys:
        k = key_vectors[j] if v is None else key_vectors[j] - key_vectors[v]
        matrix = (q @ k.T) * rec.scaling
        score = model_score(j) - (0.0 if v is None else model_score(v))
        bias_term = score_bias(j) - (0.0 if v is None else score_bias(v))
        q_labels, k_labels = list(labels), list(labels)
        if rec.bias is not None or rec.relative_bias is not None:
            matrix = torch.nn.functional.pad(matrix, (0, 1, 0, 1))
            matrix[-1, -1] = bias_term
            q_labels.append(SCORE_BIAS)
            k_labels.append(SCORE_BIAS)
        keep = [at[p] for p in (i, j, *([] if v is None else [v]))]
        results.append(
            QKAttribution(
                layer=layer,
                head=head,
                part=part,
                query=i,
                key=j,
                versus=v,
                tokens=(tokens[i], tokens[j], None if v is None else tokens[v]),
                query_labels=q_labels,
                key_labels=k_labels,
                matrix=matrix,
                score=score,
                labels=list(labels),
                components=stack[:, keep],
                positions=(i, j, *([] if v is None else [v])),
                residual_error=residual_error,
                tolerance=tolerance,
            ).check()
        )
    return results if several else results[0]
