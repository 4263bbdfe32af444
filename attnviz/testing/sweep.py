"""The support sweep: tiny random models captured and compared with their own eager attention.

Two sweeps, one comparison (:func:`compare`): a padded batch of two texts of different lengths (and two
targets for an encoder-decoder) captured through attnviz's text path on a backend, every part and layer
compared with the *eager* model's own ``output_attentions`` on the same weights.

- :func:`claimed`: every family the support table claims (``attnviz.families.FAMILIES``), on each backend it
  names, built by :func:`attnviz.testing.tiny_model` — what ``tests/test_sweep.py`` holds to :data:`EXACT`.
- :func:`vision`: every tiny vision encoder (ViT, DeiT, DINOv2 with and without registers, the CLIP and
  SigLIP vision towers) on eager and sdpa, a batch of two pictures through its image processor.
- :func:`attnviz.testing.sweep_towers.towers`: the models of two towers (joint CLIP and SigLIP, LLaVA, Idefics3)
  on eager and sdpa, two texts with two pictures, each part against the model's own.
- :func:`transformers_families`: every text model type of transformers' ``CONFIG_MAPPING`` with a
  causal-LM class (or, for an encoder, a masked-LM one, captured through ``AutoModel``), built tiny by
  setting the usual config fields generically (:data:`TINY_FIELDS`), on eager and on sdpa where offered.

Each outcome is **exact** (≤ :data:`EXACT`, its max error stated), **refused** (attnviz's
``UnsupportedModelError``, its message), **mismatch** (numbers beyond :data:`EXACT`, a failed self-check —
a ``ValidationError``: the user gets the error, never the wrong map —, or an error attnviz did not
raise on purpose: a bug) or **not buildable** (transformers cannot build or run it tiny, and why).

``python -m attnviz.testing.sweep --markdown`` prints the counts for the docs; ``--write`` puts them
between the ``<!-- attnviz:sweep -->`` markers of ``docs/guides/capture.md``
(:data:`attnviz.testing.sweep_table.PAGE`): the section is written by :mod:`attnviz.testing.sweep_table`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnviz.errors import UnsupportedModelError, ValidationError
from attnviz.families import FAMILIES, vision_spec
from attnviz.families.longt5 import unblock
from attnviz.testing.tiny import tiny_families, tiny_model, tiny_processor
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.capture.runner import capture

#: the bound of "exact" at float32: every layer and head of every part, the largest absolute difference — about
#: eight float32 steps at a weight of 1. A capture on sdpa is compared with the *eager* model's weights, and the
#: two backends' own float32 roundings differ: on an AMD EPYC (Zen 5) UMT5's sdpa capture is 5.1e-7 from its eager
#: weights while the eager weights themselves are 3.3e-7 from the same model run in float64 (T5's scores are not
#: scaled by 1/√d, so their rounding reaches the weights larger); 5e-7, the bound until 4 Dec 2026, held on the
#: processors measured before.
EXACT = 1e-6
#: the config fields set on every family, where its config has them (at construction, so derived fields
#: such as ``layer_types`` or ``head_dim`` follow)
TINY_FIELDS: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "embed_dim", "n_embed"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads"), 4),
    "num_key_value_heads": 2,
    "head_dim": 8,
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff"), 64),
    "vocab_size": 128,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 128),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "n_shared_experts": 1,
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 8,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "rotary_dim": 4,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LENGTHS, TARGET_LENGTHS = (11, 8), (7, 5)


@dataclass(frozen=True)
class Outcome:
    """One family on one backend."""

    family: str  # the tiny family (claimed) or the config's model type
    backend: str
    kind: str  # "exact" | "refused" | "mismatch" | "not buildable"
    error: float | None = None  # the largest absolute difference, every part, layer and head
    reason: str = ""

    def line(self) -> str:
        err = f"{self.error:.1e}" if self.error is not None else "—"
        return f"{self.family:32s} {self.backend:6s} {self.kind:14s} {err:8s} {self.reason}"


def texts(lengths: Sequence[int], seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join(str(i) for i in torch.randint(3, 120, (n,), generator=g).tolist()) for n in lengths]


def _padded(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:  # ids, mask [batch, pos]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(list(row))
        mask[b, : len(row)] = 1
    return ids, mask


def _eager_attentions(eager: torch.nn.Module, caps: Sequence[Any]) -> dict[str, tuple]:
    """The eager model's own attentions, per part, on the captures' ids, padded and masked."""
    ids, mask = _padded([c.token_ids for c in caps])
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    seq2seq = bool(getattr(eager.config, "is_encoder_decoder", False))
    if seq2seq:
        kwargs["decoder_input_ids"], kwargs["decoder_attention_mask"] = _padded([c.target.token_ids for c in caps])
    with torch.no_grad():
        out = eager(**kwargs, output_attentions=True)
    if seq2seq:
        n = ids.shape[1]
        encoder = tuple(unblock(a, n)[0] if a.dim() == 5 else a for a in out.encoder_attentions)  # LongT5's blocks
        return {"encoder": encoder, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    return {"attentions": out.attentions}


def compare(eager: torch.nn.Module, model: torch.nn.Module) -> float:
    """The largest absolute difference between attnviz's captures of ``model`` (a padded batch of two
    texts) and ``eager``'s own ``output_attentions``, over every part, layer and head; raises
    :class:`AssertionError` when a capture's parts or layers are not the model's or its self-check fails."""
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    caps = capture(model, texts(LENGTHS, 1), IdsTokenizer(), target=texts(TARGET_LENGTHS, 2) if seq2seq else None)
    assert isinstance(caps, list)
    expected = _eager_attentions(eager, caps)
    worst = 0.0
    for b, cap in enumerate(caps):
        parts = list(expected) if seq2seq else [cap.parts[0]]
        assert list(cap.parts) == parts, f"capture's parts {cap.parts}, the model's {parts}"
        n_src = cap.n_tokens
        n_tgt = len(cap.target_tokens or ()) if cap.target is not None else n_src
        for part, refs in zip(parts, expected.values()):
            assert refs is not None and len(refs) > 0, f"the eager model returned no {part} attentions"
            # output_attentions lists the attention layers in order; a hybrid model's others (linear
            # attention, state spaces) have none, and attnviz numbers each layer as the model does
            layers = cap.layer_indices(part)
            assert len(layers) == len(refs), f"{part}: attnviz captured layers {layers}, the model returned {len(refs)}"
            n_q = n_tgt if part in ("decoder", "cross") else n_src
            n_k = n_tgt if part == "decoder" else n_src
            for layer, ref in zip(layers, refs):
                ours = cap.attention(layer, part=part)
                theirs = ref[b, :, :n_q, :n_k].float()
                assert ours.shape == theirs.shape, f"{part} layer {layer}: {tuple(ours.shape)} vs {tuple(theirs.shape)}"
                worst = max(worst, float((ours - theirs).abs().max()))
        report = cap.validate()
        assert report.passed, str(report)
    return worst


def _outcome(family: str, backend: str, eager: torch.nn.Module, model: torch.nn.Module) -> Outcome:
    try:
        err = compare(eager, model)
    except UnsupportedModelError as exc:
        return Outcome(family, backend, "refused", reason=_first_sentence(str(exc)))
    except ValidationError as exc:  # attnviz's self-check: what was over tolerance, where
        return Outcome(family, backend, "mismatch", reason=f"ValidationError: {_over_tolerance(str(exc))}")
    except Exception as exc:  # noqa: BLE001 - attnviz's self-check failed (ValidationError), or an error it did not raise on purpose: a bug
        return Outcome(family, backend, "mismatch", reason=f"{type(exc).__name__}: {_first_line(str(exc))}")
    if err <= EXACT:
        return Outcome(family, backend, "exact", err)
    return Outcome(family, backend, "mismatch", err, f"max error {err:.1e} > {EXACT:.0e}")


def _over_tolerance(report: str) -> str:
    """The checks of a validation report's summary that failed (``A vs the model's weights: max error
    5.14e-01 at L0·H0 (8 heads over tolerance)``), else its first line."""
    summary = report.strip().splitlines()[0] if report.strip() else ""
    checks = summary.partition(" — ")[2].split("; ")
    failed = [c.split(". The capture")[0] for c in checks if "over tolerance" in c]
    return "; ".join(failed) if failed else _first_line(report)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def _first_sentence(text: str) -> str:
    line = _first_line(text)
    return line.split(". attnviz supports")[0]


# ------------------------------------------------------------------- what the support table claims
def claimed(families: Iterable[str] | None = None) -> list[Outcome]:
    """Every family the support table claims, on each backend it names (or only ``families``)."""
    wanted = set(families) if families is not None else None
    out = []
    for fam in FAMILIES:
        if fam.how == "refused" or fam.tiny is None or (wanted is not None and fam.tiny not in wanted):
            continue
        eager = tiny_model(fam.tiny, attn_implementation="eager")
        for backend in fam.backends:
            model = eager if backend == "eager" else tiny_model(fam.tiny, attn_implementation=backend)
            out.append(_outcome(fam.tiny, backend, eager, model))
    return out


# --------------------------------------------------------------------------------------- vision encoders
def vision() -> list[Outcome]:
    """Every tiny vision family of :func:`attnviz.testing.tiny_model`, on eager and sdpa: a batch of two pictures
    (random, of two sizes) through its image processor, each layer against its eager model's own."""
    out = []
    g = torch.Generator().manual_seed(3)
    pictures = [
        torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy() for h, w in ((40, 48), (32, 36))
    ]
    for fam in tiny_families():
        eager = tiny_model(fam, attn_implementation="eager")
        if vision_spec(eager.config) is None:
            continue
        processor = tiny_processor(fam)
        pixels = processor(images=pictures, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            refs = eager(pixel_values=pixels, output_attentions=True).attentions
        for backend in ("eager", "sdpa"):
            model = eager if backend == "eager" else tiny_model(fam, attn_implementation=backend)
            try:
                caps = capture(model, image=pictures, processor=processor)
                assert isinstance(caps, list) and len(caps) == 2
                worst = 0.0
                for b, cap in enumerate(caps):
                    assert cap.layer_indices() == list(range(len(refs))), f"layers {cap.layer_indices()}"
                    for layer, ref in enumerate(refs):
                        worst = max(worst, float((cap.attention(layer) - ref[b]).abs().max()))
                    assert cap.validate().passed
            except UnsupportedModelError as exc:
                out.append(Outcome(fam, backend, "refused", reason=_first_sentence(str(exc))))
                continue
            except Exception as exc:  # noqa: BLE001 - as _outcome: a failed self-check or a bug
                out.append(Outcome(fam, backend, "mismatch", reason=f"{type(exc).__name__}: {_first_line(str(exc))}"))
                continue
            kind = "exact" if worst <= EXACT else "mismatch"
            out.append(Outcome(fam, backend, kind, worst, "" if kind == "exact" else f"max error {worst:.1e}"))
    return out


# ------------------------------------------------------------------------- every family transformers has
def _tiny_config(config_cls: Any, *, grouped: bool = True) -> Any:
    """The family's config with :data:`TINY_FIELDS` where it has them; ``grouped=False`` leaves the
    key/value heads equal to the heads (for families whose code assumes it)."""
    default = config_cls()
    known = set(default.to_dict()) | set(getattr(config_cls, "attribute_map", {}))
    known |= set(inspect.signature(config_cls.__init__).parameters)
    fields = {k: v for k, v in TINY_FIELDS.items() if k in known}
    if not grouped:
        fields["num_key_value_heads"] = TINY_FIELDS["num_attention_heads"]
    config = config_cls(**fields)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = TINY_FIELDS["pad_token_id"]  # T5's own choice
    return config


def _build(model_cls: Any, config: Any, backend: str) -> torch.nn.Module:
    torch.manual_seed(0)  # each model its own copy of the config: from_config writes the backend into it
    return model_cls.from_config(copy.deepcopy(config), attn_implementation=backend).eval()


def _tiny_eager(auto_cls: Any, config_cls: Any) -> tuple[Any, torch.nn.Module]:
    """(config, eager model) of a family built tiny whose eager forward returns its attentions: with
    grouped key/value heads, else with as many as heads; raises the last failure."""
    failure: Exception | None = None
    for grouped in (True, False):
        try:
            config = _tiny_config(config_cls, grouped=grouped)
            with torch.device("meta"):  # its size first: a family whose other defaults are not tiny
                size = sum(p.numel() for p in auto_cls.from_config(copy.deepcopy(config)).parameters())
            if size > MAX_PARAMETERS:
                raise ValueError(f"{size / 1e6:.0f}M parameters with the generic tiny fields (its other defaults)")
            eager = _build(auto_cls, config, "eager")
            _eager_attentions(eager, [_Ids(texts(LENGTHS, 1)[0], _Ids(texts(TARGET_LENGTHS, 2)[0]))])
            return config, eager
        except Exception as exc:  # noqa: BLE001 - any failure of transformers' own build or forward
            failure = exc
    assert failure is not None
    raise failure


def text_model_types() -> dict[str, str]:
    """model type -> the auto class a sweep builds it as: causal LMs, then encoders (a masked LM's
    model type, built as its bare ``AutoModel``); encoder-decoders as seq2seq LMs."""
    from transformers.models.auto import modeling_auto as auto

    kinds: dict[str, str] = {}
    for model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        kinds[model_type] = "AutoModelForCausalLM"
    for model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        kinds.setdefault(model_type, "AutoModelForSeq2SeqLM")
    for model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        if model_type in auto.MODEL_MAPPING_NAMES:
            kinds.setdefault(model_type, "AutoModel")
    return kinds


def transformers_families(
    only: Iterable[str] | None = None, *, progress: bool = False
) -> tuple[list[Outcome], list[str]]:
    """(an outcome per text model type of ``CONFIG_MAPPING`` and backend, the model types with no
    causal-LM, seq2seq-LM or masked-LM class: not swept)."""
    import transformers as tf
    from transformers import CONFIG_MAPPING

    kinds = text_model_types()
    wanted = list(only) if only is not None else sorted(CONFIG_MAPPING.keys())
    out: list[Outcome] = []
    not_text = [t for t in wanted if t not in kinds]
    for model_type in (t for t in wanted if t in kinds):
        start = time.perf_counter()
        if progress:
            print(f"{model_type} …", file=sys.stderr, flush=True)
        try:
            with _time_limit(LIMIT_S):
                out += _one(getattr(tf, kinds[model_type]), CONFIG_MAPPING[model_type], model_type)
        except _TooSlow:
            out.append(
                Outcome(model_type, "eager", "not buildable", reason=f"not done in {LIMIT_S} s on one CPU thread")
            )
        if progress:
            print(f"{time.perf_counter() - start:5.1f}s {out[-1].line()}", file=sys.stderr, flush=True)
    return out, not_text


#: the most parameters a tiny build may have
MAX_PARAMETERS = 5_000_000
#: seconds one family may take (its build, both backends): a family slower than this tiny is not swept
LIMIT_S = 30


class _TooSlow(BaseException):  # not an Exception: no except in a model or in _outcome catches it
    pass


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def stop(signum: int, frame: Any) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _one(auto_cls: Any, config_cls: Any, model_type: str) -> list[Outcome]:
    try:  # built tiny, and its eager forward returns its own attentions
        config, eager = _tiny_eager(auto_cls, config_cls)
    except _TooSlow:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers cannot build or run it tiny: the reason is the outcome
        return [Outcome(model_type, "eager", "not buildable", reason=f"{type(exc).__name__}: {_first_line(str(exc))}")]
    out = [_outcome(model_type, "eager", eager, eager)]
    try:
        sdpa = _build(auto_cls, config, "sdpa")
    except _TooSlow:
        raise
    except Exception:  # noqa: BLE001 - whatever transformers raises, the family offers no sdpa
        return out
    sdpa.load_state_dict(eager.state_dict())
    return out + [_outcome(model_type, "sdpa", eager, sdpa)]


class _Ids:  # what _eager_attentions reads of a capture: its ids (and its target's)
    def __init__(self, text: str, target: _Ids | None = None) -> None:
        self.token_ids = [int(t) for t in text.split()]
        self.target = target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnviz.testing.sweep", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs' section")
    parser.add_argument("--write", action="store_true", help="write it into docs/guides/capture.md")
    parser.add_argument("--only", nargs="*", help="these model types of transformers only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    claims = claimed()
    seen = vision()
    from .sweep_towers import towers  # deferred: sweep_towers imports this module's Outcome (a circle)

    two = towers()
    for o in claims + seen + two:
        print(o.line(), file=sys.stderr, flush=True)
    others, not_text = transformers_families(args.only, progress=True)
    from .sweep_table import PAGE, markdown, write  # deferred: sweep_table reads this module's Outcome (a circle)

    section = markdown(claims, seen, others, not_text, two)
    if args.markdown:
        print(section)
    if args.write:
        root = Path(__file__).resolve().parents[2]
        write(section, [root / PAGE])
    bad = [o for o in claims + seen + two if o.kind != "exact"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
