"""Heads over training: :func:`head_timeline`, the head atlas of every checkpoint of a run (``attnviz.head_timeline``).

A run's checkpoints (:func:`find_checkpoints`: a run folder's ``checkpoint-*/`` as the HF Trainer writes them,
ordered by the ``global_step`` of each one's ``trainer_state.json`` or else the number in its name; a list of
folders; a hub name's ``revisions``) are read one after the other. The corpus is tokenized once, by the first
checkpoint's tokenizer (:func:`~attnviz.workflows.corpus.atlas.tokenize_corpus`), and each checkpoint's atlas is
:func:`~attnviz.workflows.corpus.atlas.head_atlas` of those encodings — the same criteria and thresholds
(:data:`~attnviz.analysis.atlas.ROLES`); a checkpoint whose tokenizer differs is refused. Each checkpoint's
weights are hashed as they are read (:func:`weights_hash`): two checkpoints of different steps with the same
weights — a hub's step branch serving another's weights, EleutherAI/pythia#205 — are said in a ``UserWarning``
and in the column ``same_weights_as``. With ``checkpoint=`` the table so far is saved after each checkpoint
(atomically, :mod:`~attnviz.workflows.corpus.checkpoints`); SIGTERM / SIGINT stop the run there, and
``resume=True`` skips the checkpoints the file holds.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.atlas import ROLES
from ...analysis.probes import Probe
from ...errors import AttnvizError, InputError, Interrupted
from ..capture.models import load_model
from .atlas import RANDOM_LENGTH, RANDOM_SEQUENCES, head_atlas, role_names, tokenize_corpus
from .checkpoints import rank_path, read_checkpoint, write_checkpoint
from .interrupts import stop_requests
from .processes import process_state

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLUMNS",
    "KIND",
    "Checkpoint",
    "find_checkpoints",
    "head_timeline",
    "tokenizer_fingerprint",
    "weights_hash",
]

KIND = "attnviz head timeline"
#: the columns of head_timeline's table, in order
COLUMNS = (
    "step",
    "checkpoint",
    "weights_hash",
    "same_weights_as",
    "part",
    "layer",
    "head",
    "role",
    "score",
    "threshold",
    "passes",
)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: its ``step``, its ``name`` (the folder's name, or the revision) and where it is
    (``folder``, or the hub name ``model`` at ``revision``)."""

    step: int
    name: str
    folder: Path | None = None
    model: str | None = None
    revision: str | None = None

    def load(self) -> Path:
        """The folder the weights are read from (a hub revision is downloaded first)."""
        if self.folder is not None:
            return self.folder
        from huggingface_hub import snapshot_download  # deferred: only a hub revision needs it

        try:
            return Path(snapshot_download(str(self.model), revision=self.revision))
        except Exception as err:  # noqa: BLE001 - any hub failure is the same problem for the user
            raise InputError(
                f"could not download {self.model!r} at revision {self.revision!r}: {err}. Check the revision's "
                "name (Pythia's are step0 … step143000) and the network, or download the folders and pass them"
            ) from err


_NUMBER = re.compile(r"(\d+)(?!.*\d)")  # the last number in a name: checkpoint-1500 → 1500, step1000 → 1000


def _step_of(folder: Path, fallback: int) -> int:
    state = folder / "trainer_state.json"
    if state.is_file():
        try:
            step = json.loads(state.read_text()).get("global_step")
        except (OSError, ValueError):
            step = None
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    found = _NUMBER.search(folder.name)
    return int(found.group(1)) if found else fallback


def find_checkpoints(
    checkpoints: str | Path | Sequence[str | Path], revisions: Sequence[str] | None = None
) -> list[Checkpoint]:
    """The checkpoints ``checkpoints`` names, in step order for a run folder, as given for a list:

    - a run folder: its ``checkpoint-*/`` subfolders, ordered by the ``global_step`` of each one's
      ``trainer_state.json``, or else the number in its name (a folder holding a model and no ``checkpoint-*``
      is one checkpoint);
    - a list of folders: each one (its step read the same way, or its place in the list);
    - a hub name with ``revisions`` (``["step1000", "step2000"]``): each revision, its step the number in its name.
    """
    if revisions is not None:
        if isinstance(revisions, str):
            revisions = [r.strip() for r in revisions.split(",") if r.strip()]
        if not revisions:
            raise InputError("revisions is empty: name the hub revisions to read (e.g. ['step1000', 'step2000'])")
        if not isinstance(checkpoints, (str, Path)) or Path(checkpoints).is_dir():
            raise InputError(
                "revisions= reads a hub model's revisions: give checkpoints= the hub name (e.g. "
                "'EleutherAI/pythia-70m'), not a folder or a list"
            )
        made = []
        for k, revision in enumerate(revisions):
            found = _NUMBER.search(revision)
            made.append(
                Checkpoint(int(found.group(1)) if found else k, revision, model=str(checkpoints), revision=revision)
            )
        return made
    if isinstance(checkpoints, (str, Path)):
        run = Path(checkpoints)
        if not run.is_dir():
            raise InputError(
                f"{str(run)!r} is not a folder: give a run folder (its checkpoint-*/ subfolders are read), a list of "
                "checkpoint folders, or a hub name with revisions=[…]"
            )
        subfolders = [p for p in run.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")]
        if not subfolders:
            if (run / "config.json").is_file():
                return [Checkpoint(_step_of(run, 0), run.name, folder=run)]
            raise InputError(
                f"{str(run)!r} holds no checkpoint-*/ folder and no model (config.json): give the folder a "
                "training run wrote its checkpoints in, or a list of checkpoint folders"
            )
        points = [Checkpoint(_step_of(p, -1), p.name, folder=p) for p in subfolders]
        return sorted(points, key=lambda c: (c.step, c.name))
    folders = [Path(p) for p in checkpoints]
    if not folders:
        raise InputError("checkpoints is empty: give a run folder or a list of checkpoint folders")
    missing = [str(p) for p in folders if not p.is_dir()]
    if missing:
        raise InputError(f"{missing[0]!r} is not a folder: every checkpoint of the list must be a model folder")
    return [Checkpoint(_step_of(p, k), p.name, folder=p) for k, p in enumerate(folders)]


def weights_hash(model: Any) -> str:
    """SHA-256 over the model's state dict, tensor by tensor in name order (the name, dtype, shape, then the
    bytes): the same for the same weights however they were saved."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of what a tokenizer maps text to: its class, its vocabulary and its special tokens (two
    tokenizers with the same fingerprint encode a corpus alike)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    facts = {
        "class": type(tokenizer).__name__,
        "vocab": sorted(vocab.items()),
        "special": sorted((str(k), str(v)) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def head_timeline(
    checkpoints: str | Path | Sequence[str | Path],
    corpus: str | Path | Iterable[str],
    *,
    revisions: Sequence[str] | str | None = None,
    roles: Iterable[str] | str | None = None,
    probes: Sequence[Probe] | str | Path | None = None,
    tokenizer: Any = None,
    batch_size: int = 8,
    seed: int = 0,
    layers: Iterable[int] | None = None,
    max_length: int | None = None,
    add_bos: bool = False,
    truncate: bool = True,
    random_sequences: int = RANDOM_SEQUENCES,
    random_length: int = RANDOM_LENGTH,
    device: str | None = None,
    dtype: str | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """The head atlas of every checkpoint of a training run, as one long table.

    - ``checkpoints``: a run folder (its ``checkpoint-*/``, in step order), a list of checkpoint folders, or a hub
      name with ``revisions`` (``["step1000", "step3000"]``) — :func:`find_checkpoints`.
    - ``corpus``: texts or a ``.txt`` / ``.jsonl`` file, tokenized once by the first checkpoint's tokenizer (or
      ``tokenizer=``, then used for every checkpoint unchecked); a checkpoint whose own tokenizer differs is
      refused (:func:`tokenizer_fingerprint`).
    - ``roles``, ``probes``, ``seed``, ``batch_size``, ``layers``, ``max_length``, ``add_bos``, ``truncate``,
      ``random_sequences``, ``random_length``, ``device``, ``dtype``: as :func:`attnviz.analysis.head_atlas`
      (``roles`` left out: every role but coreference, unless ``probes`` is given).
    - ``checkpoint``: a file the table so far is saved to after each checkpoint (atomically); SIGTERM / SIGINT
      stop the run with :class:`~attnviz.errors.Interrupted` once it is saved, and ``resume=True`` continues,
      skipping the checkpoints it holds.
    - ``on_progress(done, total)``: the atlases' progress, counted over every checkpoint.

    Returns one row per checkpoint, part, layer, head and role: ``step``, ``checkpoint`` (its name),
    ``weights_hash`` (:func:`weights_hash`), ``same_weights_as`` (the first checkpoint of another step with the
    same weights, or ""), ``part``, ``layer``, ``head``, ``role``, ``score``, ``threshold``, ``passes`` (the
    score meets the role's threshold, :meth:`~attnviz.analysis.atlas.Role.met`). Each score is the one
    ``head_atlas`` gives that checkpoint alone. ``df.attrs``: ``checkpoints`` (names in order), ``steps``,
    ``duplicates`` (pairs of names), ``texts``, ``tokens``, ``seed``, ``resumed_after`` (checkpoints read from
    the file), ``sources`` (each checkpoint's folder, or ``model@revision``), ``loss`` (``{step: loss}`` of the
    latest checkpoint's ``trainer_state.json`` ``log_history``; {} without one).

    A checkpoint that fails raises its error (its class kept) naming it; the rows of the checkpoints finished
    before it are the error's ``partial`` (and are in ``checkpoint``'s file when one is given).
    """
    import pandas as pd  # deferred: importing attnviz does not import pandas

    chosen = role_names(roles)
    if roles is None and probes is None:  # every role the corpus can score: coreference reads a probe set
        chosen = [r for r in chosen if r != "coreference"]
    if resume and checkpoint is None:
        raise InputError("resume=True continues from a checkpoint file: give it with checkpoint=")
    found = find_checkpoints(checkpoints, revisions)
    names = [c.name for c in found]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InputError(f"two checkpoints are named {twice!r}: give folders of different names")
    state = process_state()
    path = rank_path(checkpoint, state.process_index, state.num_processes) if checkpoint is not None else None
    settings = {
        "roles": chosen,
        "seed": seed,
        "layers": None if layers is None else sorted(layers),
        "max_length": max_length,
        "add_bos": add_bos,
        "random": [random_sequences, random_length],
        "probes": None if probes is None else str(probes) if isinstance(probes, (str, Path)) else len(probes),
    }
    done: dict[str, list[dict]] = {}
    if path is not None and path.exists() and not resume:
        raise InputError(
            f"{str(path)!r} exists: pass resume=True (--resume) to continue that run, or delete it to start again"
        )
    texts_digest = None
    if path is not None and resume and path.exists():
        saved = read_checkpoint(path, KIND)
        if saved["settings"] != json.dumps(settings, sort_keys=True):
            raise InputError(
                f"{str(path)!r} was written with other settings ({saved['settings']}): resume with the same roles, "
                "seed, layers, lengths and probes, or delete it to start again"
            )
        done = {name: rows for name, rows in saved["rows"].items()}
        texts_digest = saved["texts"]
    resumed_after = len(done)

    reference = tokenizer
    if reference is None:
        try:
            _, reference = load_model(str(found[0].load()), device=device, dtype=dtype)
        except (AttnvizError, OSError) as err:
            raise _failed(found[0].name, 0, found, err, done, path) from err
    tokenized = tokenize_corpus(corpus, reference, add_bos=add_bos, name=found[0].name)
    digest = hashlib.sha256("\x00".join(tokenized.texts).encode()).hexdigest()
    if texts_digest is not None and texts_digest != digest:
        raise InputError(
            f"{str(path)!r} was written over another corpus: resume with the same texts, or delete it to start again"
        )
    fingerprint = tokenizer_fingerprint(reference) if tokenizer is None else None
    per = len(tokenized.texts) + 1 + (probes is not None)
    total = per * len(found)

    class _Stop(Exception):
        pass

    with stop_requests(active=path is not None) as stop:
        for k, point in enumerate(found):
            if point.name in done:
                continue
            if stop.signal is not None:
                raise _interrupted(path, stop.signal.name, len(done), state.process_index)
            try:
                model, own = load_model(str(point.load()), device=device, dtype=dtype)
                if fingerprint is not None and tokenizer_fingerprint(own) != fingerprint:
                    raise InputError(
                        f"the tokenizer of {point.name!r} differs from that of {found[0].name!r}, which tokenized the "
                        "corpus: a timeline reads one tokenization — give checkpoints of one tokenizer, or tokenizer= "
                        "to read them all with it"
                    )
                digest_of_weights = weights_hash(model)

                report = _counter(stop, on_progress, k * per, total, _Stop)

                atlas = head_atlas(
                    model,
                    tokenized,
                    batch_size=batch_size,
                    probes=probes,
                    seed=seed,
                    roles=chosen,
                    layers=layers,
                    max_length=max_length,
                    add_bos=add_bos,
                    truncate=truncate,
                    random_sequences=random_sequences,
                    random_length=random_length,
                    progress=progress,
                    on_progress=report if (on_progress is not None or path is not None) else None,
                )
            except _Stop:
                assert stop.signal is not None
                raise _interrupted(path, stop.signal.name, len(done), state.process_index) from None
            except Interrupted:
                raise
            except (AttnvizError, OSError) as err:  # a checkpoint that cannot be read: the ones before it are kept
                raise _failed(point.name, k, found, err, done, path) from err
            done[point.name] = [
                {
                    "step": point.step,
                    "checkpoint": point.name,
                    "weights_hash": digest_of_weights,
                    "part": str(r["part"]),
                    "layer": int(r["layer"]),
                    "head": int(r["head"]),
                    "role": role,
                    "score": float(r[role]),
                    "threshold": float(r[f"{role}_threshold"]),
                    "passes": bool(ROLES[role].met(float(r[role]))),
                }
                for r in atlas.to_dict("records")
                for role in chosen
            ]
            if path is not None:
                payload = {
                    "format": KIND,
                    "settings": json.dumps(settings, sort_keys=True),
                    "texts": digest,
                    "rows": done,
                }
                write_checkpoint(path, payload)
    rows = [row for name in names for row in done[name]]
    frame = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "same_weights_as"])
    first_of: dict[str, tuple[str, int]] = {}
    same: dict[str, str] = {}
    duplicates: list[tuple[str, str]] = []
    for point in found:
        digest_of_weights = done[point.name][0]["weights_hash"] if done[point.name] else ""
        earlier = first_of.get(digest_of_weights)
        if earlier is None:
            first_of[digest_of_weights] = (point.name, point.step)
            same[point.name] = ""
        elif earlier[1] != point.step:
            same[point.name] = earlier[0]
            duplicates.append((earlier[0], point.name))
        else:
            same[point.name] = ""
    for a, b in duplicates:
        steps = {c.name: c.step for c in found}
        warnings.warn(
            f"checkpoints {a!r} (step {steps[a]}) and {b!r} (step {steps[b]}) hold the same weights: one of them is "
            "not the step it says (a hub branch serving another step's weights, a copied folder); its row says so in "
            "same_weights_as",
            UserWarning,
            stacklevel=2,
        )
    frame.insert(3, "same_weights_as", frame["checkpoint"].map(same).fillna(""))
    frame.attrs.update(
        checkpoints=names,
        steps=[c.step for c in found],
        duplicates=duplicates,
        texts=len(tokenized.texts),
        tokens=sum(len(ids) for ids, _, _ in tokenized.encoded),
        seed=seed,
        resumed_after=resumed_after,
        sources=[str(c.folder) if c.folder is not None else f"{c.model}@{c.revision}" for c in found],
        loss=_loss_log(found),
    )
    return frame


def _loss_log(points: list[Checkpoint]) -> dict[int, float]:
    """``{step: loss}`` of the training log the latest checkpoint's ``trainer_state.json`` holds (the HF Trainer's
    ``log_history``), or {} when there is none."""
    for point in sorted(points, key=lambda c: c.step, reverse=True):
        state = point.folder / "trainer_state.json" if point.folder is not None else None
        if state is None or not state.is_file():
            continue
        try:
            history = json.loads(state.read_text()).get("log_history") or []
        except (OSError, ValueError):
            return {}
        return {
            int(e["step"]): float(e["loss"])
            for e in history
            if isinstance(e, dict) and isinstance(e.get("step"), int) and isinstance(e.get("loss"), (int, float))
        }
    return {}


def _counter(
    stop: Any, on_progress: Callable[[int, int], None] | None, before: int, total: int, error: type[Exception]
) -> Callable[[int, int], None]:
    """One checkpoint's ``on_progress(done, total)`` for head_atlas: ``before`` + its count, out of the timeline's
    ``total``; it raises ``error`` once a stop signal came (the checkpoints before this one are saved)."""

    def report(done: int, _total: int) -> None:
        if stop.signal is not None:
            raise error
        if on_progress is not None:
            on_progress(before + done, total)

    return report


def _failed(
    name: str, k: int, found: list[Checkpoint], err: BaseException, done: dict[str, list[dict]], path: Path | None
) -> AttnvizError:
    """The error of a checkpoint that failed (its ``k``, from 0), naming it, as the error it was (its class kept:
    a :class:`~attnviz.errors.ModelNotFoundError` stays one); the rows of the checkpoints finished before it
    are saved in ``path`` (given) and carried as ``.partial`` (a partial long table) for a caller to write."""
    import pandas as pd  # deferred: importing attnviz does not import pandas

    said = " ".join(str(err).split())
    kept = ""
    if done and path is not None:
        kept = (
            f"; the atlases of the {len(done)} checkpoint{'' if len(done) == 1 else 's'} before it are kept in "
            f"{str(path)!r}: fix it and run the same call with resume=True (--resume) to continue"
        )
    message = f"checkpoint {name!r} ({k + 1} of {len(found)}) failed: {said}{kept}"
    kind = type(err) if isinstance(err, AttnvizError) else InputError
    try:
        failed = kind(message)
    except TypeError:  # an error class that takes other arguments
        failed = InputError(message)
    rows = [row for point in found if point.name in done for row in done[point.name]]
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "same_weights_as"])
    table.insert(3, "same_weights_as", "")
    failed.partial = table  # the rows finished, for the caller (the command line writes them)
    return failed


def _interrupted(path: Path | None, signal: str, saved: int, rank: int) -> Interrupted:
    return Interrupted(
        f"stopped by {signal}: {saved} checkpoint{'' if saved == 1 else 's'}' atlases saved in {str(path)!r}; run the "
        "same call with resume=True (--resume) to continue",
        checkpoint=path,
        signal=signal,
        rank=rank,
    )
