"""Probe sets for coreference: what a probe is (a text, its pronoun, the candidates and the gold
antecedent), the shipped sets and JSONL files, and the per-head result of scoring them.

Scoring a probe set runs a model, so it lives beside the runner (:func:`attnviz.evaluate_probes`);
ranking one capture's heads is :func:`attnviz.analysis.rank_heads`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InputError
from .probe_result import ProbeResult  # re-exported here, its first home

__all__ = ["PROBE_SETS", "Probe", "ProbeResult", "load_probes"]


@dataclass(frozen=True)
class Probe:
    """One probe: in ``text``, ``pronoun`` refers to ``gold``, one of ``candidates``."""

    text: str
    pronoun: str
    candidates: tuple[str, ...]
    gold: str
    id: str = ""
    lang: str = ""

    def __post_init__(self) -> None:
        for name in ("text", "pronoun", "gold"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise InputError(
                    f"probe {self.id or self.text!r}: {name} must be a non-empty string, got {getattr(self, name)!r}"
                )
        if isinstance(self.candidates, str) or not all(isinstance(c, str) for c in self.candidates):
            raise InputError(
                f"probe {self.id or self.text!r}: candidates must be a list of strings, got {self.candidates!r}"
            )
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if len(self.candidates) < 2:
            raise InputError(
                f"probe {self.id or self.text!r}: needs at least 2 candidates, got {list(self.candidates)}"
            )
        if self.gold not in self.candidates:
            raise InputError(
                f"probe {self.id or self.text!r}: gold {self.gold!r} is not one of the candidates "
                f"{list(self.candidates)}"
            )

    @classmethod
    def from_dict(cls, item: Any, default_id: str = "") -> Probe:
        """A probe from ``{"text", "pronoun", "candidates", "gold"}`` (``id`` and ``lang`` optional)."""
        if not isinstance(item, dict):
            raise InputError(f"a probe is a dict with text, pronoun, candidates and gold; got {type(item).__name__}")
        missing = [k for k in ("text", "pronoun", "candidates", "gold") if k not in item]
        if missing:
            raise InputError(f"a probe needs {', '.join(missing)}; got keys {sorted(item)}")
        candidates = item["candidates"]
        if not isinstance(candidates, (list, tuple)):
            raise InputError(f"candidates must be a list of strings, got {candidates!r}")
        return cls(
            item["text"],
            item["pronoun"],
            tuple(candidates),
            item["gold"],
            str(item.get("id", default_id)),
            str(item.get("lang", "")),
        )


PROBE_SETS = {"en": "en.jsonl", "zh": "zh.jsonl"}


def load_probes(source: str | Path) -> list[Probe]:
    """Read a probe set: a shipped name (``"en"``, ``"zh"``) or a JSONL file, one object a line:
    ``{"text": ..., "pronoun": ..., "candidates": [...], "gold": ...}`` (``id``, ``lang`` optional)."""
    if str(source) in PROBE_SETS:
        text = resources.files("attnviz").joinpath("probes", PROBE_SETS[str(source)]).read_text(encoding="utf-8")
        where = f"the shipped probe set {source!r}"
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"no probe file at {str(path)!r}; use a JSONL file or one of {', '.join(PROBE_SETS)}")
        text, where = path.read_text(encoding="utf-8"), str(path)
    probes, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            probes.append(Probe.from_dict(json.loads(line), f"{Path(str(source)).stem}-{number}"))
        except json.JSONDecodeError as err:
            problems.append(f"line {number}: not JSON ({err.msg})")
        except InputError as err:
            problems.append(f"line {number}: {err}")
    if problems:
        raise InputError(f"{where}: {len(problems)} bad line(s), nothing was scored — " + "; ".join(problems))
    if not probes:
        raise InputError(f"{where} holds no probes")
    return probes
