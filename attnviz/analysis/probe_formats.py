"""The layouts probe sets come in, read into attnviz's own probe fields.

:func:`attnviz.analysis.load_probes` reads a source into *records* (one dict a row or line), maps
columns if asked, picks a format (given, or told from the columns) and hands the records to the
format's reader, which gives one attnviz probe dict — ``text``, ``pronoun``, ``pronoun_start``,
``candidates``, ``candidate_starts``, ``gold``, ``id``, ``lang`` — or the reason it cannot, for each
probe. :class:`~attnviz.analysis.Probe` checks the dict and :meth:`~attnviz.analysis.Probe.locate`
places it; nothing here knows what a probe is beyond its fields.

The formats (offsets: how a given place counts):

- ``attnviz``: text, pronoun, candidates, gold (+ id, lang, pronoun_start, candidate_starts; a candidate
  may be ``{"text", "start"}``) — characters, optional;
- ``gap``: the GAP TSV: ID, Text, Pronoun, Pronoun-offset, A, A-offset, A-coref, B, B-offset, B-coref,
  URL — characters;
- ``superglue-wsc``: SuperGLUE WSC JSONL: text, target {span1_text, span1_index, span2_text,
  span2_index}, label, idx; one row a candidate — words of ``text.split()``;
- ``cluewsc``: CLUEWSC2020 JSON lines, the same layout in Chinese, label "true"/"false" — characters;
- ``wsc``: Hugging Face ``winograd_wsc``: text, pronoun, pronoun_loc, quote, quote_loc, options, label
  (index into options), source — characters (the pronoun's; options are found in the text);
- ``winograd``: before, pronoun, after (the text split around the pronoun), candidates, answer (a
  candidate's text or index) — the pronoun's place comes from the split.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = [
    "PROBE_FORMATS",
    "ProbeFormat",
    "Record",
    "UnusableProbe",
    "apply_columns",
    "check_format",
    "detect_format",
    "frame_of_dataset",
    "records_from_jsonl",
    "records_from_table",
]

#: One row or line of a source: its 1-based number (a JSONL file's line) and its fields.
Record = tuple[int, dict[str, Any]]
#: What a reader gives for one probe: the source rows it came from, an id, and the attnviz probe dict —
#: or the :class:`InputError` saying why those rows make no probe.
Item = tuple[tuple[int, ...], str, "dict[str, Any] | InputError"]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_FIELDS = ("text", "pronoun", "pronoun_start", "candidates", "candidate_starts", "gold", "id", "lang")


class UnusableProbe(InputError):
    """A probe that cannot be used: ``reason`` what is wrong (the message, which may name the probe
    first), ``kind`` its stable name (what a probe set's summary counts and ``ProbeSet.problems`` lists)."""

    def __init__(self, message: str, kind: str = "unusable", reason: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = message if reason is None else reason


def _missing(value: Any) -> bool:
    """``None``, NaN or pandas' NA: a cell with nothing in it."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    try:
        import pandas as pd

        return value is pd.NA or value is pd.NaT
    except ImportError:  # pragma: no cover - pandas is a dependency
        return False


def _get(fields: Mapping[str, Any], key: str) -> Any:
    value = fields.get(key)
    return None if _missing(value) else value


def _need(fields: Mapping[str, Any], *keys: str) -> list[Any]:
    """The values of ``keys``; a "missing field" problem naming every one that is absent or empty."""
    absent = [k for k in keys if _get(fields, k) is None]
    if absent:
        raise UnusableProbe(f"missing {', '.join(absent)}", "missing field")
    return [fields[k] for k in keys]


def _as_int(value: Any, what: str) -> int | None:
    """An offset or index from a cell: an int, a whole float (a column with gaps), or digits."""
    if value is None or _missing(value):
        return None
    if isinstance(value, bool):
        raise UnusableProbe(f"{what} must be a whole number, got {value!r}", "bad offset")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    try:
        return operator.index(value)
    except TypeError:
        raise UnusableProbe(f"{what} must be a whole number, got {value!r}", "bad offset") from None


def _truth(value: Any, what: str) -> bool:
    """A label: a bool, 0/1, or the words true/false (yes/no, 1/0), any case."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float)) and not _missing(value) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"true", "false", "yes", "no", "1", "0", "t", "f"}:
        return value.strip().lower() in {"true", "yes", "1", "t"}
    raise UnusableProbe(f"{what} must be true or false, got {value!r}", "bad label")


def _list(value: Any, what: str) -> list[Any]:
    """A list cell: a list/tuple/array, a JSON list in a string, or a string split on ``|``."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                raise UnusableProbe(f"{what} is not a JSON list: {value!r}", "bad candidates") from None
            if isinstance(parsed, list):
                return parsed
        return [part.strip() for part in text.split("|")]
    raise UnusableProbe(
        f"{what} must be a list (or a JSON list, or texts separated by |), got {value!r}", "bad candidates"
    )


def _id(fields: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = _get(fields, key)
        if value is not None and str(value).strip():
            return str(value)
    return ""


# --- the formats -------------------------------------------------------------------------------------------


def _read_attnviz(records: Sequence[Record]) -> Iterator[Item]:
    for row, fields in records:
        if "__not_a_probe__" in fields:
            yield (row,), "", UnusableProbe(f"a probe is a dict, got {fields['__not_a_probe__']}", "not a probe")
            continue
        try:
            out = {k: v for k, v in fields.items() if not (k in _FIELDS and _missing(v))}
            if "candidates" in out:
                out["candidates"] = _list(out["candidates"], "candidates")
            if "candidate_starts" in out:
                out["candidate_starts"] = [
                    _as_int(s, "candidate_starts") for s in _list(out["candidate_starts"], "candidate_starts")
                ]
            if "pronoun_start" in out:
                out["pronoun_start"] = _as_int(out["pronoun_start"], "pronoun_start")
            if isinstance(out.get("gold"), float):
                out["gold"] = _as_int(out["gold"], "gold")
            yield (row,), _id(fields, "id"), out
        except InputError as err:
            yield (row,), _id(fields, "id"), err


def _read_gap(records: Sequence[Record]) -> Iterator[Item]:
    for row, fields in records:
        ident = _id(fields, "ID")
        try:
            text, pronoun, p_at, a, a_at, a_coref, b, b_at, b_coref = _need(
                fields, "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref"
            )
            a_true, b_true = _truth(a_coref, "A-coref"), _truth(b_coref, "B-coref")
            if a_true and b_true:
                raise UnusableProbe(
                    "both candidates are marked coreferent (A-coref and B-coref)", "both candidates coreferent"
                )
            if not (a_true or b_true):
                raise UnusableProbe(
                    "neither candidate is coreferent (A-coref and B-coref are false)", "neither candidate is coreferent"
                )
            yield (
                (row,),
                ident,
                {
                    "text": text,
                    "pronoun": pronoun,
                    "pronoun_start": _as_int(p_at, "Pronoun-offset"),
                    "candidates": [a, b],
                    "candidate_starts": [_as_int(a_at, "A-offset"), _as_int(b_at, "B-offset")],
                    "gold": 0 if a_true else 1,
                    "id": ident,
                    "lang": "en",
                },
            )
        except InputError as err:
            yield (row,), ident, err


def _spans(fields: Mapping[str, Any]) -> tuple[str, int, str, int]:
    """span1_text, span1_index, span2_text, span2_index: from ``target`` or flat columns (Hugging Face)."""
    target = _get(fields, "target")
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except json.JSONDecodeError:
            raise UnusableProbe(f"target is not a JSON object: {target!r}", "missing field") from None
    source = target if isinstance(target, Mapping) else fields
    s1, i1, s2, i2 = _need(source, "span1_text", "span1_index", "span2_text", "span2_index")
    return str(s1), _as_int(i1, "span1_index"), str(s2), _as_int(i2, "span2_index")  # type: ignore[return-value]


def _word_starts(text: str) -> list[int]:
    return [m.start() for m in re.finditer(r"\S+", text)]


def _grouped(records: Sequence[Record], *, words: bool, lang: str) -> Iterator[Item]:
    """SuperGLUE / CLUE WSC: one row a (pronoun, candidate, label); rows of one text and pronoun place
    make one probe whose gold is the candidate labelled true."""
    groups: dict[tuple[str, int], list[tuple[int, str, str, int, bool, str]]] = {}
    for row, fields in records:
        ident = _id(fields, "idx", "id")
        try:
            (text,) = _need(fields, "text")
            s1, i1, s2, i2 = _spans(fields)
            if _get(fields, "label") is None:
                raise UnusableProbe("no label (a test split has none)", "no label")
            label = _truth(fields["label"], "label")
            if words:
                starts = _word_starts(text)
                for name, index in (("span1_index", i1), ("span2_index", i2)):
                    if not 0 <= index < len(starts):
                        raise UnusableProbe(
                            f"{name} {index} is not a word of the text (it has {len(starts)} words)", "bad offset"
                        )
                i1, i2 = starts[i1], starts[i2]
        except InputError as err:
            yield (row,), ident, err
            continue
        groups.setdefault((str(text), i2), []).append((row, ident, s1, i1, label, s2))
    for (text, p_at), items in groups.items():
        rows = tuple(i[0] for i in items)
        ident = "+".join(dict.fromkeys(i[1] for i in items if i[1]))
        pronoun = items[0][5]
        where = f"the pronoun {pronoun!r} at {'word' if words else 'character'} {_place(text, p_at, words)}"
        candidates: dict[str, tuple[str, int, bool]] = {}
        try:
            for _, _, s1, i1, label, _ in items:
                key = s1.strip().lower()
                if key in candidates and candidates[key][2] != label:
                    raise UnusableProbe(
                        f"candidate {s1!r} is labelled both true and false for {where}", "conflicting labels"
                    )
                candidates.setdefault(key, (s1, i1, label))
            if len(candidates) < 2:
                names = [c[0] for c in candidates.values()]
                raise UnusableProbe(f"only one candidate ({names[0]!r}) for {where}", "fewer than 2 candidates")
            golds = [c[0] for c in candidates.values() if c[2]]
            if not golds:
                raise UnusableProbe(f"no candidate is labelled true for {where}", "no gold candidate")
            if len(golds) > 1:
                raise UnusableProbe(
                    f"{len(golds)} candidates are labelled true for {where}: {golds}", "several gold candidates"
                )
        except InputError as err:
            yield rows, ident, err
            continue
        values = list(candidates.values())
        yield (
            rows,
            ident,
            {
                "text": text,
                "pronoun": pronoun,
                "pronoun_start": p_at,
                "candidates": [c[0] for c in values],
                "candidate_starts": [c[1] for c in values],
                "gold": [c[2] for c in values].index(True),
                "id": ident,
                "lang": lang,
            },
        )


def _place(text: str, start: int, words: bool) -> int:
    """The word index (for messages) of the character ``start``, or ``start`` itself."""
    return sum(1 for s in _word_starts(text) if s < start) if words else start


def _read_superglue(records: Sequence[Record]) -> Iterator[Item]:
    return _grouped(records, words=True, lang="en")


def _read_cluewsc(records: Sequence[Record]) -> Iterator[Item]:
    return _grouped(records, words=False, lang="zh")


def _read_wsc(records: Sequence[Record]) -> Iterator[Item]:
    for row, fields in records:
        ident = _id(fields, "id")
        try:
            text, pronoun, p_at, options, label = _need(fields, "text", "pronoun", "pronoun_loc", "options", "label")
            yield (
                (row,),
                ident,
                {
                    "text": text,
                    "pronoun": pronoun,
                    "pronoun_start": _as_int(p_at, "pronoun_loc"),
                    "candidates": _list(options, "options"),
                    "gold": _as_int(label, "label"),
                    "id": ident,
                    "lang": "en",
                },
            )
        except InputError as err:
            yield (row,), ident, err


def _joined(before: str, pronoun: str, after: str) -> tuple[str, int]:
    """``before pronoun after`` as one text and where the pronoun starts: a space is put between parts
    unless one is already there, a CJK character meets the pronoun, or ``after`` starts with punctuation."""
    cjk = bool(_CJK.search(pronoun))
    left = before
    if before and not before[-1].isspace() and not (cjk or _CJK.match(before[-1])):
        left += " "
    right = after
    if (
        after
        and not after[0].isspace()
        and (after[0].isalnum() or after[0] in "(\"'“‘")
        and not (cjk or _CJK.match(after[0]))
    ):
        right = " " + after
    return left + pronoun + right, len(left)


def _read_winograd(records: Sequence[Record]) -> Iterator[Item]:
    for row, fields in records:
        ident = _id(fields, "id")
        try:
            pronoun, candidates, answer = _need(fields, "pronoun", "candidates", "answer")
            before, after = _get(fields, "before") or "", _get(fields, "after") or ""
            text, p_at = _joined(str(before), str(pronoun), str(after))
            if isinstance(answer, float):
                answer = _as_int(answer, "answer")
            yield (
                (row,),
                ident,
                {
                    "text": text,
                    "pronoun": pronoun,
                    "pronoun_start": p_at,
                    "candidates": _list(candidates, "candidates"),
                    "gold": answer,
                    "id": ident,
                    "lang": _get(fields, "lang") or "",
                },
            )
        except InputError as err:
            yield (row,), ident, err


@dataclass(frozen=True)
class ProbeFormat:
    """A probe-set layout: its name, the dataset it is, the columns it needs, how its offsets count,
    and the reader that turns its records into attnviz probe dicts."""

    name: str
    label: str
    needs: tuple[str, ...]
    offsets: str
    reads: str
    read: Callable[[Sequence[Record]], Iterator[Item]]


PROBE_FORMATS: dict[str, ProbeFormat] = {
    f.name: f
    for f in (
        ProbeFormat(
            "attnviz",
            "attnviz",
            ("text", "pronoun", "candidates", "gold"),
            "characters, optional (pronoun_start, candidate_starts)",
            "attnviz's own probes: text, pronoun, candidates (texts, or {text, start}), gold (a candidate's text "
            "or index); id, lang, pronoun_start, candidate_starts optional",
            _read_attnviz,
        ),
        ProbeFormat(
            "gap",
            "GAP",
            ("Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref"),
            "characters",
            "GAP (Webster et al. 2018) TSV: ID, Text, Pronoun, Pronoun-offset, A, A-offset, A-coref, B, B-offset, "
            "B-coref, URL; a row with neither or both of A and B coreferent is unusable",
            _read_gap,
        ),
        ProbeFormat(
            "superglue-wsc",
            "SuperGLUE WSC",
            ("text", "target", "label"),
            "words of text.split()",
            "SuperGLUE WSC JSONL: text, target {span1_text, span1_index, span2_text, span2_index}, label, idx "
            "(or Hugging Face's flat span1_index… columns); span2 is the pronoun, span1 a candidate; the rows of "
            "one text and pronoun make one probe, gold the candidate labelled true",
            _read_superglue,
        ),
        ProbeFormat(
            "cluewsc",
            "CLUEWSC2020",
            ("text", "target", "label"),
            "characters",
            'CLUEWSC2020 JSON lines: the SuperGLUE WSC layout with character indices, Chinese, label "true"/"false"',
            _read_cluewsc,
        ),
        ProbeFormat(
            "wsc",
            "WSC",
            ("text", "pronoun", "pronoun_loc", "options", "label"),
            "characters (the pronoun's)",
            "Hugging Face winograd_wsc (wsc273/wsc285): text, pronoun, pronoun_loc, quote, quote_loc, options, "
            "label (the index of the answer in options), source",
            _read_wsc,
        ),
        ProbeFormat(
            "winograd",
            "Winograd",
            ("before", "pronoun", "after", "candidates", "answer"),
            "from the split",
            "the text split around the pronoun: before, pronoun, after (joined with a space where none is), "
            "candidates (a list, a JSON list or texts separated by |), answer (a candidate's text or index); "
            "id, lang optional",
            _read_winograd,
        ),
    )
}


def _formats_line() -> str:
    return "; ".join(f"{f.name} ({', '.join(f.needs)})" for f in PROBE_FORMATS.values())


def _keys(records: Sequence[Record]) -> set[str]:
    keys: set[str] = set()
    for _, fields in records:
        keys.update(fields)
    return keys


def detect_format(records: Sequence[Record], where: str) -> str:
    """The format whose columns the records have; an :class:`InputError` naming the formats when none fits."""
    keys = _keys(records)
    spans = "target" in keys or {"span1_index", "span2_index", "span1_text", "span2_text"} <= keys
    if {"Pronoun-offset", "A-coref", "B-coref"} <= keys:
        return "gap"
    if spans and "text" in keys:
        texts = (str(f.get("text", "")) for _, f in records[:50])
        return "cluewsc" if any(_CJK.search(t) for t in texts) else "superglue-wsc"
    if {"pronoun_loc", "options"} <= keys:
        return "wsc"
    if {"before", "after", "pronoun"} <= keys:
        return "winograd"
    if {"text", "pronoun", "candidates", "gold"} <= keys:
        return "attnviz"
    raise InputError(
        f"cannot tell the format of {where} from its columns {sorted(keys)}; the formats are {_formats_line()}. "
        "Pass format=…, or columns={'text': 'your_column', …} to read yours as attnviz's fields"
    )


def check_format(name: str, records: Sequence[Record], where: str) -> ProbeFormat:
    """The format ``name``, after checking that the records have its columns at all."""
    if name not in PROBE_FORMATS:
        raise InputError(f"unknown probe format {name!r}; the formats are {', '.join(PROBE_FORMATS)}")
    fmt = PROBE_FORMATS[name]
    keys = _keys(records)
    needs = set(fmt.needs)
    if name in {"superglue-wsc", "cluewsc"} and "target" not in keys:
        needs = (needs - {"target"}) | {"span1_text", "span1_index", "span2_text", "span2_index"}
    if name == "winograd":
        needs -= {"before", "after"}  # either may be empty: a pronoun that starts or ends the text
    absent = sorted(needs - keys)
    if records and absent:
        raise InputError(
            f"{where} is not in the {name} format: it has no {', '.join(absent)} (its columns are {sorted(keys)}); "
            f"the formats are {_formats_line()}"
        )
    return fmt


def apply_columns(records: Sequence[Record], columns: Mapping[str, str | Sequence[str]], where: str) -> list[Record]:
    """Rename columns: ``columns`` maps a field the format reads (attnviz's ``text``, ``pronoun``,
    ``pronoun_start``, ``candidates``, ``candidate_starts``, ``gold``, ``id``, ``lang`` — or a preset's
    own) to the source's column; ``candidates`` and ``candidate_starts`` may name several columns,
    one a candidate."""
    if not isinstance(columns, Mapping):
        raise InputError(f"columns must map a probe field to your column, e.g. {{'text': 'sentence'}}; got {columns!r}")
    keys = _keys(records)
    absent = []
    for field, source in columns.items():
        if not isinstance(source, str) and not (
            isinstance(source, Sequence) and source and all(isinstance(n, str) for n in source)
        ):
            raise InputError(
                f"columns[{field!r}] must name a column (or, for candidates, a list of columns); got {source!r}"
            )
        for name in [source] if isinstance(source, str) else list(source):
            if name not in keys:
                absent.append(f"{field} → {name!r}")
    if absent:
        raise InputError(
            f"columns names what {where} does not have: {', '.join(absent)}; its columns are {sorted(keys)}"
        )
    out = []
    for row, fields in records:
        new = dict(fields)
        for field, source in columns.items():
            if isinstance(source, str):
                new[field] = fields.get(source)
            else:
                new[field] = [fields.get(name) for name in source]
        out.append((row, new))
    return out


def records_from_jsonl(text: str) -> tuple[list[Record], list[tuple[int, InputError]]]:
    """The records of JSON lines (blank lines and ``//`` comments skipped; a byte-order mark before the first
    is no part of it), and the lines that are not a JSON object."""
    text = text.removeprefix("\ufeff")
    records: list[Record] = []
    bad: list[tuple[int, InputError]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            bad.append((number, UnusableProbe(f"not JSON ({err.msg})", "not JSON")))
            continue
        if not isinstance(value, dict):
            bad.append((number, UnusableProbe(f"not a JSON object but {type(value).__name__}", "not JSON")))
            continue
        records.append((number, value))
    return records, bad


def records_from_table(frame: Any) -> list[Record]:
    """The rows of a pandas DataFrame as records, numbered from 1."""
    return [(i, dict(fields)) for i, fields in enumerate(frame.to_dict("records"), 1)]


def frame_of_dataset(dataset: Any) -> Any:
    """A Hugging Face ``datasets.Dataset`` (or anything with ``.to_pandas()``) as a DataFrame, with
    class labels as their names (SuperGLUE's 0/1 are False/True, CLUE's are "true"/"false")."""
    frame = dataset.to_pandas()
    features = getattr(dataset, "features", None) or {}
    for name, feature in dict(features).items():
        names = getattr(feature, "names", None)
        if names and name in frame.columns:
            frame[name] = [names[v] if isinstance(v, int) and 0 <= v < len(names) else v for v in frame[name].tolist()]
    return frame
