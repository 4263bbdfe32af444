"""Probe sets for coreference: what a probe is (a text, its pronoun, the candidates and the gold
antecedent, optionally where each stands in the text), the shipped sets, and reading probe sets
from the files and tables people have (the formats themselves are :mod:`attnviz.analysis.probe_formats`).

Scoring a probe set runs a model, so it lives beside the runner (:func:`attnviz.evaluate_probes`);
ranking one capture's heads is :func:`attnviz.analysis.rank_heads`.
"""

from __future__ import annotations

import csv
import json
import operator
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ArgumentTypeError, InputError
from ..files import read_utf8
from . import probe_formats as pf
from .probe_formats import PROBE_FORMATS, UnusableProbe
from .probe_result import ProbeResult  # re-exported here, its first home

__all__ = [
    "DETERMINERS",
    "PROBE_FORMATS",
    "PROBE_SETS",
    "Probe",
    "ProbeResult",
    "ProbeSet",
    "UnusableProbe",
    "load_probes",
]

#: Leading words a candidate may carry that the text may say differently ("the son" is "his son").
DETERMINERS = ("the", "a", "an", "this", "that", "these", "those", "his", "her", "its", "their", "my", "our", "your")

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_LEADING = re.compile(rf"^(?:{'|'.join(DETERMINERS)})\s+(?=\S)", re.IGNORECASE)


def _offset(value: Any, what: str) -> int | None:
    """A character offset: a non-negative int (numpy ints too), or ``None`` for "not given"."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise UnusableProbe(f"{what} must be a character offset (an int ≥ 0) or None, got {value!r}", "bad offset")
    try:
        offset = operator.index(value)
    except TypeError:
        raise UnusableProbe(
            f"{what} must be a character offset (an int ≥ 0) or None, got {value!r}", "bad offset"
        ) from None
    if offset < 0:
        raise UnusableProbe(f"{what} must be a character offset (an int ≥ 0), got {offset}", "bad offset")
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
                raise UnusableProbe(f"candidate_starts must be a tuple of offsets, got {starts!r}", "bad offset")
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
        return UnusableProbe(f"probe {self.id or self.text!r}: {reason}", kind, reason)

    @classmethod
    def from_dict(cls, item: Any, default_id: str = "") -> Probe:
        """A probe from ``{"text", "pronoun", "candidates", "gold"}`` (``id``, ``lang``, ``pronoun_start``,
        ``candidate_starts`` optional).

        A candidate is its text or ``{"text": "the trophy", "start": 0}`` (``start`` optional);
        ``gold`` is a candidate's text or its 0-based index in ``candidates`` (digits in a string count as
        the index when no candidate is written so).
        """
        if not isinstance(item, dict):
            raise UnusableProbe(
                f"a probe is a dict with text, pronoun, candidates and gold; got {type(item).__name__}", "not a probe"
            )
        missing = [k for k in ("text", "pronoun", "candidates", "gold") if k not in item or item[k] is None]
        if missing:
            raise UnusableProbe(f"a probe needs {', '.join(missing)}; got keys {sorted(item)}", "missing field")
        candidates = item["candidates"]
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, (list, tuple)):
            if hasattr(candidates, "tolist"):  # a numpy array (a DataFrame's or a Dataset's list column)
                candidates = candidates.tolist()
            else:
                raise UnusableProbe(f"candidates must be a list of strings, got {candidates!r}", "bad candidates")
        texts: list[Any] = []
        starts: list[int | None] = []
        for c in candidates:
            if isinstance(c, dict):
                if "text" not in c:
                    raise UnusableProbe(f"a candidate given as a dict needs 'text', got {c!r}", "bad candidates")
                texts.append(c["text"])
                starts.append(c.get("start"))
            else:
                texts.append(c)
                starts.append(None)
        given = item.get("candidate_starts")
        if given is not None and not isinstance(given, (str, bytes)) and hasattr(given, "__len__"):
            if any(s is not None for s in starts):
                raise UnusableProbe(
                    "give candidate offsets either as candidate_starts or as 'start's, not both", "bad offset"
                )
            starts = list(given.tolist() if hasattr(given, "tolist") else given)
        elif given is not None:
            raise UnusableProbe(f"candidate_starts must be a list of offsets, got {given!r}", "bad offset")
        gold = item["gold"]
        if isinstance(gold, str) and gold not in texts and gold.strip().isdigit():
            gold = int(gold)  # a CSV's gold column mixing texts and indices is read as texts
        if isinstance(gold, bool) or not isinstance(gold, str):
            try:
                index = operator.index(gold)
            except TypeError:
                raise UnusableProbe(
                    f"gold must be a candidate's text or its index, got {gold!r}", "gold not a candidate"
                ) from None
            if not 0 <= index < len(texts):
                raise UnusableProbe(
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
                raise UnusableProbe(f"pronoun {self.pronoun!r} is not in the text", "pronoun not in the text")
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
                raise UnusableProbe(f"candidate {candidate!r} is not in the text", "candidate not in the text")
            best = min(matches, key=lambda m: (m.start(), -m.end()))
            ranges.append((best.start(), best.end()))
        return pronoun, ranges

    def _at(self, phrase: str, start: int, what: str, *, allow_head: bool) -> tuple[int, int]:
        """The range of ``phrase`` at ``start`` in the text (or of its head without the determiner)."""
        text = self.text
        if start >= len(text):
            raise UnusableProbe(
                f"{what} offset {start} is past the end of the text ({len(text)} characters)",
                f"{what} offset does not match",
            )
        forms = dict.fromkeys((phrase.strip(), _head(phrase))) if allow_head else (phrase.strip(),)
        for form in forms:
            m = re.compile(_pattern(form), re.IGNORECASE).match(text, start)
            if m is not None:
                return m.start(), m.end()
        end = min(start + len(phrase.strip()), len(text))
        while 0 < end < len(text) and re.fullmatch(r"\w\w", text[end - 1 : end + 1]) and not _CJK.search(text[end]):
            end += 1  # show the whole word the offset points into: 'its', not 'it'
        there = text[start:end].rstrip() or text[start:end]
        label = "pronoun" if what == "pronoun" else f"candidate {phrase!r}"
        raise UnusableProbe(
            f"{label} offset {start} does not match: the text there is {there!r}", f"{what} offset does not match"
        )


PROBE_SETS = {"en": "en.jsonl", "zh": "zh.jsonl"}

_TABLES = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".tab", ".parquet", ".pq")


class ProbeSet(list):
    """The probes a source held that can be used (a ``list`` of :class:`Probe`, so old code keeps
    working), with what could not be:

    - ``problems``: a DataFrame, one row per unusable probe: ``id`` (its id where it had one), ``row``
      (its line in a JSONL file, else its 1-based row; a grouped format's first row), ``rows`` (every
      row it came from), ``kind`` (a short stable name: "candidate not in the text") and ``reason``;
    - ``summary``: one line, e.g. "GAP gap-test: 1,998 probes from 2,000 rows; 2 unusable
      (2× neither candidate is coreferent) — see .problems";
    - ``format``: the format it was read as, and ``source``: what it was read from.

    The kinds: "not JSON", "not a probe", "missing field", "bad candidates", "bad offset", "bad label",
    "no label", "fewer than 2 candidates", "gold not a candidate", "gold given twice", "no gold candidate",
    "several gold candidates", "conflicting labels", "neither candidate is coreferent", "both candidates
    coreferent", "pronoun not in the text", "candidate not in the text", "pronoun offset does not match",
    "candidate offset does not match" (and "no text" / "no pronoun" / "no gold" for empty ones).
    """

    problems: Any
    summary: str
    format: str
    source: str

    def __init__(self, probes: Any = (), problems: Any = None, summary: str = "", format: str = "", source: str = ""):
        super().__init__(probes)
        if problems is None:
            import pandas as pd

            problems = pd.DataFrame({c: [] for c in _PROBLEM_COLUMNS})
        self.problems, self.summary, self.format, self.source = problems, summary, format, source


_PROBLEM_COLUMNS = ("id", "row", "rows", "kind", "reason")


def _reason(err: InputError) -> tuple[str, str]:
    """(kind, reason) of a probe's problem: the reason without the "probe 'x': " prefix."""
    if isinstance(err, UnusableProbe):
        return err.kind, err.reason
    return str(err), str(err)


def _read(source: Any) -> tuple[list[Any], list[tuple[int, InputError]], str, str | None]:
    """(records, lines that are no records, a name for messages, the format the source implies)."""
    import pandas as pd

    if isinstance(source, (str, Path)) and str(source) in PROBE_SETS:
        text = resources.files("attnviz").joinpath("probes", PROBE_SETS[str(source)]).read_text(encoding="utf-8")
        return (*pf.records_from_jsonl(text), f"the shipped set {str(source)!r}", "attnviz")
    if isinstance(source, pd.DataFrame):
        return pf.records_from_table(source), [], "DataFrame", None
    if hasattr(source, "to_pandas") and not isinstance(source, (str, Path)):
        return pf.records_from_table(pf.frame_of_dataset(source)), [], type(source).__name__, None
    if isinstance(source, (list, tuple)):
        records = []
        for i, item in enumerate(source, 1):
            if isinstance(item, Probe):
                fields = {f: getattr(item, f) for f in Probe.__dataclass_fields__}
                records.append((i, {**fields, "candidates": list(item.candidates)}))
            elif isinstance(item, dict):
                records.append((i, item))
            else:
                records.append((i, {"__not_a_probe__": type(item).__name__}))
        return records, [], "list", None
    if not isinstance(source, (str, Path)):
        raise ArgumentTypeError(
            "probes come from a shipped set's name (" + ", ".join(PROBE_SETS) + "), a JSONL/JSON/CSV/TSV/Parquet "
            f"file, a pandas DataFrame, a Hugging Face Dataset or a list of dicts; got {type(source).__name__}"
        )
    path = Path(source)
    if not path.is_file():
        raise InputError(
            f"no probe file at {str(path)!r}; use a JSONL, JSON, CSV, TSV or Parquet file, or one of "
            + ", ".join(PROBE_SETS)
        )
    suffix = path.suffix.lower()
    where = str(path)
    try:
        if suffix in _TABLES:
            quoting = csv.QUOTE_NONE if _TABLES[suffix] == "\t" else csv.QUOTE_MINIMAL  # GAP's TSV quotes nothing
            frame = pd.read_csv(
                path, sep=_TABLES[suffix], quoting=quoting, keep_default_na=False, na_values=[""], encoding="utf-8-sig"
            )
            return pf.records_from_table(frame), [], where, None
        if suffix in (".parquet", ".pq"):
            return pf.records_from_table(pd.read_parquet(path)), [], where, None
    except (ValueError, OSError, ImportError) as err:
        raise InputError(f"cannot read {where} as a {suffix[1:].upper()} table: {err}") from err
    text = read_utf8(path)
    if suffix == ".json":
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSON lines named .json, as CLUEWSC2020 ships them
        if isinstance(whole, list):
            records = [
                (i, item if isinstance(item, dict) else {"__not_a_probe__": type(item).__name__})
                for i, item in enumerate(whole, 1)
            ]
            return records, [], where, None
    elif suffix not in (".jsonl", ".ndjson", ""):
        raise InputError(f"cannot tell how to read {where}: name it .jsonl, .json, .csv, .tsv or .parquet")
    return (*pf.records_from_jsonl(text), where, None)


def load_probes(
    source: Any,
    *,
    format: str | None = None,
    columns: dict[str, Any] | None = None,
    strict: bool = False,
) -> ProbeSet:
    """Read a probe set, keep every probe that can be used, and say why each other one cannot.

    ``source``: a shipped set's name (``"en"``, ``"zh"``); a file, read by its suffix (``.jsonl``; ``.json``
    as a list of records or JSON lines; ``.csv``; ``.tsv`` unquoted, as GAP ships it; ``.parquet``); a
    pandas DataFrame; a Hugging Face ``datasets.Dataset`` (anything with ``.to_pandas()``; class labels
    are read as their names); or a list of dicts / :class:`Probe`.

    ``format``: one of :data:`~attnviz.analysis.probe_formats.PROBE_FORMATS` — ``attnviz``, ``gap``,
    ``superglue-wsc``, ``cluewsc``, ``wsc``, ``winograd`` (see that module for each layout); told from
    the columns when ``None``. ``columns`` maps a field the format reads to a column of yours
    (``{"text": "sentence", "pronoun": "pron", "candidates": ["option1", "option2"]}``) before that.

    Each probe is built and located (:meth:`Probe.locate`) here, so a candidate not in the text, an offset that
    does not match, one candidate only, no or two gold answers, a missing field or a line that is not
    JSON are found now, not when scoring. They are left out and reported: the :class:`ProbeSet` has
    ``.problems`` and ``.summary``, and a ``UserWarning`` carries the summary; ``strict=True`` raises an
    :class:`InputError` listing them instead. An :class:`InputError` also when no probe is usable.
    """
    records, bad_lines, where, implied = _read(source)
    if columns:
        records = pf.apply_columns(records, columns, where)
        implied = None
    if format is not None:
        name = format
    elif implied is not None or not records:  # nothing to tell a format from: report the lines as they are
        name = implied or "attnviz"
    else:
        name = pf.detect_format(records, where)
    fmt = pf.check_format(name, records, where)
    jsonl = bool(bad_lines) or (
        isinstance(source, (str, Path))
        and (str(source) in PROBE_SETS or Path(source).suffix.lower() in (".jsonl", ".ndjson", ".json", ""))
    )
    unit = "line" if jsonl else "row"
    problems: list[dict[str, Any]] = []
    for number, err in bad_lines:
        kind, reason = _reason(err)
        problems.append({"id": "", "row": number, "rows": (number,), "kind": kind, "reason": reason})
    probes: list[tuple[int, Probe]] = []
    stem = Path(str(source)).stem if isinstance(source, (str, Path)) else "probe"
    for rows, ident, item in fmt.read(records):
        default_id = ident or f"{stem}-{rows[0]}"
        try:
            if isinstance(item, InputError):
                raise item
            probe = Probe.from_dict(item, default_id)
            probe.locate()
        except InputError as err:
            kind, reason = _reason(err)
            problems.append({"id": default_id, "row": rows[0], "rows": rows, "kind": kind, "reason": reason})
            continue
        probes.append((rows[0], probe))
    import pandas as pd

    problems.sort(key=lambda p: p["row"])
    table = pd.DataFrame(problems, columns=list(_PROBLEM_COLUMNS))
    n_rows = len(records) + len(bad_lines)
    if isinstance(source, (str, Path)):
        label = where if str(source) in PROBE_SETS else f"{fmt.label} {Path(source).name}"
    else:
        label = f"{fmt.label} {where}"
    summary = f"{label}: {len(probes):,} probe{'s' * (len(probes) != 1)} from {n_rows:,} {unit}{'s' * (n_rows != 1)}"
    if problems:
        counts = table["kind"].value_counts(sort=True)
        summary += (
            f"; {len(problems):,} unusable ({', '.join(f'{n:,}× {k}' for k, n in counts.items())}) — see .problems"
        )
    if problems and (strict or not probes):
        listed = "; ".join(
            f"{unit} {p['row']}" + (f" ({p['id']})" if p["id"] else "") + f": {p['reason']}" for p in problems
        )
        why = "strict=True refuses any unusable probe" if probes else "no probe is usable"
        raise InputError(f"{summary}. Nothing was scored: {why} — {listed}")
    if not probes:
        raise InputError(f"{where} holds no probes")
    if problems:
        warnings.warn(summary, UserWarning, stacklevel=2)
    return ProbeSet([p for _, p in probes], table, summary, fmt.name, where)
