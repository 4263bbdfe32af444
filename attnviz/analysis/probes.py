"""Probe sets for coreference: what a probe is (a text, its pronoun, the candidates and the gold
antecedent, optionally where each stands in the text), the shipped sets, and reading probe sets
from the files and tables people have (the formats themselves are :mod:`attnviz.analysis.probe_formats`).

Scoring a probe set runs a model, so it lives beside the runner (:func:`attnviz.evaluate_probes`);
ranking one capture's heads is :func:`attnviz.analysis.rank_heads`.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import InputError
from .probe_result import ProbeResult  # re-exported here, its first home

__all__ = ["DETERMINERS", "PROBE_SETS", "Probe", "ProbeResult", "load_probes"]

#: Leading words a candidate may carry that the text may say differently ("the son" is "his son").
DETERMINERS = ("the", "a", "an", "this", "that", "these", "those", "his", "her", "its", "their", "my", "our", "your")

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_LEADING = re.compile(rf"^(?:{'|'.join(DETERMINERS)})\s+(?=\S)", re.IGNORECASE)


def _problem(reason: str, kind: str) -> InputError:
    """An :class:`InputError` whose message is ``reason``, with ``.kind``: the stable name of the problem
    (what a probe set's summary counts)."""
    err = InputError(reason)
    err.kind = kind  # type: ignore[attr-defined]
    return err


def _offset(value: Any, what: str) -> int | None:
    """A character offset: a non-negative int (numpy ints too), or ``None`` for "not given"."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _problem(f"{what} must be a character offset (an int ≥ 0) or None, got {value!r}", "bad offset")
    try:
        offset = operator.index(value)
    except TypeError:
        raise _problem(f"{what} must be a character offset (an int ≥ 0) or None, got {value!r}", "bad offset") from None
    if offset < 0:
        raise _problem(f"{what} must be a character offset (an int ≥ 0), got {offset}", "bad offset")
    return offset


def _pattern(phrase: str) -> str:
    """``phrase`` as a case-insensitive regex: any run of spaces matches any run, and a Latin-script
    phrase matches whole words only (a CJK one matches anywhere, as the words of CJK text are not spaced)."""
    body = r"\s+".join(re.escape(part) for part in phrase.split())
    return body if _CJK.search(phrase) else rf"(?<!\w){body}(?!\w)"


def _head(candidate: str) -> str:
    """``candidate`` without its leading determiner ("the son" → "son"); itself where it has none."""
    return _LEADING.sub("", candidate.strip(), count=1)


@dataclass(frozen=True)
class Probe:
    """One probe: in ``text``, ``pronoun`` refers to ``gold``, one of ``candidates``.

    ``pronoun_start`` and ``candidate_starts`` say where they stand (character offsets into ``text``)
    when the text holds them more than once; ``None`` (or an empty ``candidate_starts``) means "find it":
    see :meth:`locate`. ``gold`` is a candidate's text, as written in ``candidates``.
    """

    text: str
    pronoun: str
    candidates: tuple[str, ...]
    gold: str
    id: str = ""
    lang: str = ""
    pronoun_start: int | None = None
    candidate_starts: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        for field in ("text", "pronoun", "gold"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value.strip():
                raise self._bad(f"{field} must be a non-empty string, got {value!r}", f"no {field}")
        if isinstance(self.candidates, str) or not all(isinstance(c, str) and c.strip() for c in self.candidates):
            raise self._bad(
                f"candidates must be a list of non-empty strings, got {self.candidates!r}", "bad candidates"
            )
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if len(self.candidates) < 2:
            raise self._bad(f"needs at least 2 candidates, got {list(self.candidates)}", "fewer than 2 candidates")
        if self.gold not in self.candidates:
            raise self._bad(
                f"gold {self.gold!r} is not one of the candidates {list(self.candidates)}", "gold not a candidate"
            )
        if self.candidates.count(self.gold) > 1:
            raise self._bad(
                f"gold {self.gold!r} is given twice among the candidates {list(self.candidates)}", "gold given twice"
            )
        try:
            object.__setattr__(self, "pronoun_start", _offset(self.pronoun_start, "pronoun_start"))
            starts = self.candidate_starts
            if isinstance(starts, (str, bytes)) or not hasattr(starts, "__len__"):
                raise _problem(f"candidate_starts must be a tuple of offsets, got {starts!r}", "bad offset")
            starts = tuple(_offset(s, f"candidate_starts[{i}]") for i, s in enumerate(starts))
        except InputError as err:
            raise self._bad(str(err), "bad offset") from None
        if starts and len(starts) != len(self.candidates):
            raise self._bad(
                f"candidate_starts has {len(starts)} offset(s) for {len(self.candidates)} candidates; give one per "
                "candidate (None where not known) or none",
                "bad offset",
            )
        object.__setattr__(self, "candidate_starts", starts)

    def _bad(self, reason: str, kind: str) -> InputError:
        err = _problem(f"probe {self.id or self.text!r}: {reason}", kind)
        err.reason = reason  # type: ignore[attr-defined]
        return err

    @classmethod
    def from_dict(cls, item: Any, default_id: str = "") -> Probe:
        """A probe from ``{"text", "pronoun", "candidates", "gold"}`` (``id``, ``lang``, ``pronoun_start``,
        ``candidate_starts`` optional).

        A candidate is its text or ``{"text": "the trophy", "start": 0}`` (``start`` optional);
        ``gold`` is a candidate's text or its 0-based index in ``candidates``.
        """
        if not isinstance(item, dict):
            raise _problem(
                f"a probe is a dict with text, pronoun, candidates and gold; got {type(item).__name__}", "not a probe"
            )
        missing = [k for k in ("text", "pronoun", "candidates", "gold") if k not in item or item[k] is None]
        if missing:
            raise _problem(f"a probe needs {', '.join(missing)}; got keys {sorted(item)}", "missing field")
        candidates = item["candidates"]
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, (list, tuple)):
            if hasattr(candidates, "tolist"):  # a numpy array (a DataFrame's or a Dataset's list column)
                candidates = candidates.tolist()
            else:
                raise _problem(f"candidates must be a list of strings, got {candidates!r}", "bad candidates")
        texts: list[Any] = []
        starts: list[int | None] = []
        for c in candidates:
            if isinstance(c, dict):
                if "text" not in c:
                    raise _problem(f"a candidate given as a dict needs 'text', got {c!r}", "bad candidates")
                texts.append(c["text"])
                starts.append(c.get("start"))
            else:
                texts.append(c)
                starts.append(None)
        given = item.get("candidate_starts")
        if given is not None and not isinstance(given, (str, bytes)) and hasattr(given, "__len__"):
            if any(s is not None for s in starts):
                raise _problem(
                    "give candidate offsets either as candidate_starts or as 'start's, not both", "bad offset"
                )
            starts = list(given.tolist() if hasattr(given, "tolist") else given)
        elif given is not None:
            raise _problem(f"candidate_starts must be a list of offsets, got {given!r}", "bad offset")
        gold = item["gold"]
        if isinstance(gold, bool) or not isinstance(gold, str):
            try:
                index = operator.index(gold)
            except TypeError:
                raise _problem(
                    f"gold must be a candidate's text or its index, got {gold!r}", "gold not a candidate"
                ) from None
            if not 0 <= index < len(texts):
                raise _problem(
                    f"gold index {index} is not a candidate's: there are {len(texts)} candidates {texts}",
                    "gold not a candidate",
                )
            gold = texts[index]
        return cls(
            item["text"],
            item["pronoun"],
            tuple(texts),
            gold,
            str(item.get("id", default_id) if item.get("id") is not None else default_id),
            str(item.get("lang") or ""),
            item.get("pronoun_start"),
            tuple(starts) if any(s is not None for s in starts) else (),
        )

    def locate(self) -> tuple[tuple[int, int], list[tuple[int, int]]]:
        """Where the pronoun and each candidate stand in the text: the pronoun's ``(start, end)`` character
        range and each candidate's, in the order of ``candidates``.

        A given offset is used after checking that the text there says the same (case-insensitively; a
        candidate's offset may point at it with or without its leading determiner). Without one, the
        pronoun is its *last* whole-word occurrence and a candidate its *first* (CJK: anywhere, as
        :func:`attnviz.analysis.coref.find_span` does), matched case-insensitively and across a leading
        determiner: "the son" finds "son" in "his son", "The trophy" finds "the trophy"; the range covers
        what the text says. Raises :class:`InputError` whose message is the reason when it cannot.
        """
        text = self.text
        if self.pronoun_start is not None:
            pronoun = self._at(self.pronoun, self.pronoun_start, "pronoun", allow_head=False)
        else:
            found = list(re.finditer(_pattern(self.pronoun), text, flags=re.IGNORECASE))
            if not found:
                raise _problem(f"pronoun {self.pronoun!r} is not in the text", "pronoun not in the text")
            pronoun = (found[-1].start(), found[-1].end())
        starts = self.candidate_starts or (None,) * len(self.candidates)
        ranges = []
        for candidate, start in zip(self.candidates, starts, strict=True):
            if start is not None:
                ranges.append(self._at(candidate, start, "candidate", allow_head=True))
                continue
            matches = [
                m
                for form in dict.fromkeys((candidate.strip(), _head(candidate)))
                for m in [re.search(_pattern(form), text, flags=re.IGNORECASE)]
                if m is not None
            ]
            if not matches:
                raise _problem(f"candidate {candidate!r} is not in the text", "candidate not in the text")
            best = min(matches, key=lambda m: (m.start(), -m.end()))
            ranges.append((best.start(), best.end()))
        return pronoun, ranges

    def _at(self, phrase: str, start: int, what: str, *, allow_head: bool) -> tuple[int, int]:
        """The range of ``phrase`` at ``start`` in the text (or of its head without the determiner)."""
        text = self.text
        if start >= len(text):
            raise _problem(
                f"{what} offset {start} is past the end of the text ({len(text)} characters)",
                f"{what} offset does not match",
            )
        forms = dict.fromkeys((phrase.strip(), _head(phrase))) if allow_head else (phrase.strip(),)
        for form in forms:
            m = re.compile(_pattern(form), re.IGNORECASE).match(text, start)
            if m is not None:
                return m.start(), m.end()
        end = start + len(phrase.strip())
        while end < len(text) and re.match(r"\w", text[end]) and not _CJK.match(text[end]):
            end += 1  # show the whole word the offset points into: 'its', not 'it'
        there = text[start:end]
        label = "pronoun" if what == "pronoun" else f"candidate {phrase!r}"
        raise _problem(
            f"{label} offset {start} does not match: the text there is {there!r}", f"{what} offset does not match"
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
