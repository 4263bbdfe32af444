"""Probe sets read from the layouts real datasets ship in (GAP, SuperGLUE WSC, CLUEWSC2020, Hugging
Face winograd_wsc, a split Winograd layout, column mappings), and Probe.locate's offsets.

Every file is written here in the dataset's own column layout; the expected places are found in the
text itself (str.index / str.rindex), never by the code under test. No model: these are pure text.
"""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

import attnviz
from attnviz.analysis import PROBE_FORMATS, Probe, ProbeSet, load_probes
from attnviz.data.words import segment

GAP_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"


def gap_row(ident, text, pronoun, p_at, a, a_coref, b, b_coref, url="http://en.wikipedia.org/wiki/X"):
    """A GAP row, its offsets found in the text: the pronoun at ``p_at``, A and B at their first place."""
    return "\t".join(
        str(v) for v in (ident, text, pronoun, p_at, a, text.index(a), a_coref, b, text.index(b), b_coref, url)
    )


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def quiet(source, **kwargs):
    """load_probes, with its warning (if any) caught and returned beside the set."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probes = load_probes(source, **kwargs)
    return probes, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def spans(probe):
    """The located pronoun and candidates as the text's own substrings."""
    (ps, pe), places = probe.locate()
    return probe.text[ps:pe], [probe.text[s:e] for s, e in places]


# --- Probe.locate -------------------------------------------------------------------------------------------


def test_a_pronoun_offset_picks_that_occurrence_not_the_last():
    text = "The cat saw the dog before it ran, and it barked."
    first, last = text.index(" it ") + 1, text.rindex(" it ") + 1
    assert first != last
    (ps, pe), places = Probe(text, "it", ("cat", "dog"), "cat", pronoun_start=first).locate()
    assert (ps, pe) == (first, first + 2)
    # without an offset: the last whole-word occurrence ("it" inside "bit" would not count)
    assert Probe(text, "it", ("cat", "dog"), "cat").locate()[0] == (last, last + 2)
    assert places == [(text.index("cat"), text.index("cat") + 3), (text.index("dog"), text.index("dog") + 3)]


def test_candidates_match_across_case_and_a_leading_determiner():
    text = "A man and his son went fishing. The trophy he won was his."
    probe = Probe(text, "he", ("the son", "The Trophy", "a man"), "the son")
    pronoun, candidates = spans(probe)
    assert pronoun == "he" and candidates == ["son", "The trophy", "A man"]
    (_, _), places = probe.locate()
    assert places[0][0] == text.index("son")  # "the son" finds "son" in "his son"
    # an offset may point at the candidate or at its head; the text there must say it
    at_head = Probe(text, "he", ("the son", "a man"), "the son", candidate_starts=(text.index("son"), 0))
    assert spans(at_head)[1] == ["son", "A man"]
    # a whole-word match: "man" is not found inside "many"
    with pytest.raises(attnviz.InputError, match=r"^candidate 'man' is not in the text$"):
        Probe("Many went home. It rained.", "it", ("man", "many"), "many").locate()


def test_wrong_offsets_say_what_the_text_has_there():
    text = "The trophy and its case: it is big."
    with pytest.raises(attnviz.InputError) as err:
        Probe(text, "it", ("trophy", "case"), "trophy", pronoun_start=text.index("its")).locate()
    assert str(err.value) == f"pronoun offset {text.index('its')} does not match: the text there is 'its'"
    with pytest.raises(
        attnviz.InputError, match=r"^candidate 'case' offset 0 does not match: the text there is 'The'$"
    ):
        Probe(text, "it", ("trophy", "case"), "trophy", candidate_starts=(None, 0)).locate()
    with pytest.raises(attnviz.InputError, match=r"^pronoun offset 99 is past the end of the text \(35 characters\)$"):
        Probe(text, "it", ("trophy", "case"), "trophy", pronoun_start=99).locate()
    with pytest.raises(attnviz.InputError, match=r"^pronoun 'she' is not in the text$"):
        Probe(text, "she", ("trophy", "case"), "trophy").locate()


def test_bad_offsets_are_refused_when_the_probe_is_made():
    for kwargs, message in [
        ({"pronoun_start": True}, "pronoun_start must be a character offset (an int ≥ 0) or None, got True"),
        ({"pronoun_start": -1}, "pronoun_start must be a character offset (an int ≥ 0), got -1"),
        ({"pronoun_start": "3"}, "pronoun_start must be a character offset (an int ≥ 0) or None, got '3'"),
        ({"candidate_starts": (1,)}, "candidate_starts has 1 offset(s) for 2 candidates"),
    ]:
        with pytest.raises(attnviz.InputError) as err:
            Probe("a b it", "it", ("a", "b"), "a", **kwargs)
        assert str(err.value).startswith(f"probe 'a b it': {message}")
    # the old positional call still works, and offsets default to "find it"
    old = Probe("a b it", "it", ("a", "b"), "a", "p1", "en")
    assert (old.pronoun_start, old.candidate_starts) == (None, ())


def test_from_dict_reads_offsets_candidate_dicts_and_a_gold_index():
    text = "The trophy doesn't fit in the suitcase because it is too big."
    probe = Probe.from_dict(
        {
            "text": text,
            "pronoun": "it",
            "pronoun_start": text.index(" it ") + 1,
            "candidates": [{"text": "the trophy", "start": 0}, "the suitcase"],
            "gold": 0,
        },
        "x-1",
    )
    assert probe.gold == "the trophy" and probe.id == "x-1"
    assert probe.candidate_starts == (0, None)
    assert spans(probe) == ("it", ["The trophy", "the suitcase"])
    with pytest.raises(attnviz.InputError, match=r"^gold index 2 is not a candidate's: there are 2 candidates"):
        Probe.from_dict({"text": text, "pronoun": "it", "candidates": ["trophy", "suitcase"], "gold": 2})


# --- the formats --------------------------------------------------------------------------------------------


def test_gap_tsv_with_its_offsets_and_its_unusable_rows(tmp_path):
    text = "Zoe played Cheryl, a friend of Pauline. She dumped her boyfriend after he left her for Pauline's sister."
    first_her = text.index(" her ") + 1
    assert first_her != text.rindex(" her ") + 1  # the offset must pick the first "her", not the last
    rows = [
        GAP_HEADER,
        gap_row("test-1", text, "her", first_her, "Cheryl", "TRUE", "Pauline", "FALSE"),
        gap_row("test-2", text, "her", first_her, "Cheryl", "FALSE", "Pauline", "FALSE"),
        gap_row("test-3", text, "her", first_her, "Cheryl", "TRUE", "Pauline", "TRUE"),
        gap_row("test-4", text, "her", first_her + 1, "Cheryl", "FALSE", "Pauline", "TRUE"),
        # a text with a quote at its start: GAP's TSV quotes nothing, so the quote is text
        gap_row("test-5", '"Anna" met Bea; she smiled.', "she", 16, "Anna", "FALSE", "Bea", "TRUE"),
    ]
    path = tmp_path / "gap-test.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    probes, warned = quiet(path)
    assert isinstance(probes, ProbeSet) and isinstance(probes, list) and probes.format == "gap"
    assert [p.id for p in probes] == ["test-1", "test-5"]
    first = probes[0]
    assert (first.candidates, first.gold, first.lang) == (("Cheryl", "Pauline"), "Cheryl", "en")
    assert first.locate()[0] == (first_her, first_her + 3)
    assert probes[1].text == '"Anna" met Bea; she smiled.' and probes[1].gold == "Bea"
    assert probes.problems[["id", "row", "kind"]].values.tolist() == [
        ["test-2", 2, "neither candidate is coreferent"],
        ["test-3", 3, "both candidates coreferent"],
        ["test-4", 4, "pronoun offset does not match"],
    ]
    assert probes.problems["reason"].tolist() == [
        "neither candidate is coreferent (A-coref and B-coref are false)",
        "both candidates are marked coreferent (A-coref and B-coref)",
        f"pronoun offset {first_her + 1} does not match: the text there is 'er'",
    ]
    summary = (
        "GAP gap-test.tsv: 2 probes from 5 rows; 3 unusable (1× neither candidate is coreferent, "
        "1× both candidates coreferent, 1× pronoun offset does not match) — see .problems"
    )
    assert probes.summary == summary and warned == [summary]


def superglue_rows(text, pronoun_word, candidates):
    """SuperGLUE WSC rows (word indices into text.split()), one per (candidate, word index, label)."""
    words = text.split()
    out = []
    for n, (candidate, index, label) in enumerate(candidates):
        assert words[index].lower().startswith(candidate.split()[0].lower()), (words[index], candidate)
        out.append(
            {
                "text": text,
                "target": {
                    "span1_text": candidate,
                    "span1_index": index,
                    "span2_text": words[pronoun_word].strip(".,"),
                    "span2_index": pronoun_word,
                },
                "idx": n,
                "label": label,
            }
        )
    return out


def test_superglue_wsc_rows_are_grouped_into_probes_by_word_index(tmp_path):
    text = "The dog chased the cat because it was hungry, and it was fast."
    words = text.split()
    first_it, last_it = words.index("it"), len(words) - 1 - words[::-1].index("it")
    rows = superglue_rows(text, first_it, [("The dog", 0, True), ("the cat", 3, False)])
    rows += superglue_rows("Sam thanked Kim because he was kind.", 4, [("Kim", 2, True)])  # one candidate only
    rows += superglue_rows("Ann met Bea and she left.", 4, [("Ann", 0, True), ("Bea", 2, True)])  # two true
    rows += superglue_rows("Ann met Bea and she left early.", 4, [("Ann", 0, False), ("Bea", 2, False)])  # none
    rows += superglue_rows(text, last_it, [("The dog", 0, False)])
    rows[-1]["label"] = None  # a test split's row: no label
    for i, row in enumerate(rows):
        row["idx"] = i
    path = jsonl(tmp_path / "val.jsonl", rows)
    probes, warned = quiet(path)
    assert probes.format == "superglue-wsc" and len(probes) == 1
    probe = probes[0]
    char_first = text.index(" it ") + 1
    assert char_first != text.rindex(" it ") + 1
    assert probe.locate()[0] == (char_first, char_first + 2)  # word 6 is the first "it", not the last
    assert (probe.candidates, probe.gold, probe.id) == (("The dog", "the cat"), "The dog", "0+1")
    assert spans(probe)[1] == ["The dog", "the cat"]
    problems = probes.problems
    assert problems["kind"].tolist() == [
        "fewer than 2 candidates",
        "several gold candidates",
        "no gold candidate",
        "no label",
    ]
    assert problems["reason"].tolist() == [
        "only one candidate ('Kim') for the pronoun 'he' at word 4",
        "2 candidates are labelled true for the pronoun 'she' at word 4: ['Ann', 'Bea']",
        "no candidate is labelled true for the pronoun 'she' at word 4",
        "no label (a test split has none)",
    ]
    assert problems["rows"].tolist() == [(3,), (4, 5), (6, 7), (8,)] and problems["row"].tolist() == [3, 4, 6, 8]
    assert warned == [probes.summary] and probes.summary.startswith("SuperGLUE WSC val.jsonl: 1 probe from 8 lines;")


def test_cluewsc_character_offsets_in_chinese_pick_the_first_pronoun(tmp_path):
    text = "我把手机放在枕头旁边，可是它一直在响，我拿起它一看，是妈妈打来的。"
    first, last = text.index("它"), text.rindex("它")
    assert first != last

    def row(idx, candidate, label):
        target = {
            "span1_text": candidate,
            "span1_index": text.index(candidate),
            "span2_text": "它",
            "span2_index": first,
        }
        return {"target": target, "idx": idx, "label": label, "text": text}

    # CLUEWSC2020 ships JSON lines in files named .json
    path = jsonl(tmp_path / "dev.json", [row(0, "手机", "true"), row(1, "枕头", "false")])
    probes, warned = quiet(path)
    assert (
        warned == [] and probes.format == "cluewsc" and probes.summary == "CLUEWSC2020 dev.json: 1 probe from 2 lines"
    )
    probe = probes[0]
    assert (probe.gold, probe.lang, probe.candidates) == ("手机", "zh", ("手机", "枕头"))
    (ps, pe), places = probe.locate()
    assert (ps, pe) == (first, first + 1)
    # the places are words of the jieba segmentation the captures use (attnviz.data.words)
    words = segment(text)
    assert (ps, pe) in words and all(place in words for place in places)
    # without the offset, the last 它 would be taken: the offset is what makes this probe right
    assert Probe(text, "它", ("手机", "枕头"), "手机").locate()[0] == (last, last + 1)


def test_hugging_face_winograd_wsc_layout_with_options_found_across_determiners(tmp_path):
    text = "The city councilmen refused the demonstrators a permit because they feared violence."
    row = {
        "text": text,
        "pronoun": "they",
        "pronoun_loc": text.index("they"),
        "quote": "they feared violence",
        "quote_loc": text.index("they"),
        "options": ["The city councilmen", "The demonstrators"],
        "label": 0,
        "source": "(Winograd 1972)",
    }
    council = text.replace("councilmen", "council")
    moved = dict(row, text=council, pronoun_loc=council.index("they"), label=1)  # an option no longer in the text
    probes, warned = quiet(jsonl(tmp_path / "wsc273.jsonl", [row, moved]))
    assert probes.format == "wsc" and probes[0].gold == "The city councilmen"
    assert spans(probes[0]) == ("they", ["The city councilmen", "the demonstrators"])
    assert probes.problems[["id", "row", "kind", "reason"]].values.tolist() == [
        ["wsc273-2", 2, "candidate not in the text", "candidate 'The city councilmen' is not in the text"]
    ]


def test_a_winograd_split_around_the_pronoun_is_joined_with_the_pronoun_placed(tmp_path):
    path = tmp_path / "split.csv"
    pd.DataFrame(
        {
            "id": ["w1", "w2", "w3"],
            "before": ["The trophy doesn't fit in the suitcase because", "小猫抓不到老鼠，因为", "Anna thanked Bea as"],
            "pronoun": ["it", "它", "she"],
            "after": ["is too big.", "跑得太快了。", ", she said, had helped."],
            "candidates": ["trophy|suitcase", '["小猫", "老鼠"]', "Anna|Bea"],
            "answer": ["trophy", "老鼠", "Cleo"],
        }
    ).to_csv(path, index=False)
    probes, _ = quiet(path)
    assert probes.format == "winograd" and [p.id for p in probes] == ["w1", "w2"]
    assert probes[0].text == "The trophy doesn't fit in the suitcase because it is too big."
    assert probes[1].text == "小猫抓不到老鼠，因为它跑得太快了。"
    for probe in probes:
        assert probe.text[probe.pronoun_start :].startswith(probe.pronoun)
        assert probe.locate()[0][0] == probe.pronoun_start
    assert probes[1].gold == "老鼠" and probes[1].candidates == ("小猫", "老鼠")
    assert probes.problems["reason"].tolist() == ["gold 'Cleo' is not one of the candidates ['Anna', 'Bea']"]


def test_a_column_mapping_reads_any_table_and_names_columns_that_are_not_there():
    frame = pd.DataFrame(
        {
            "sentence": ["The trophy doesn't fit in the suitcase because it is too big."],
            "pron": ["it"],
            "opt1": ["the trophy"],
            "opt2": ["the suitcase"],
            "answer": [0],
        }
    )
    columns = {"text": "sentence", "pronoun": "pron", "candidates": ["opt1", "opt2"], "gold": "answer"}
    probes, warned = quiet(frame, columns=columns)
    assert warned == [] and probes.format == "attnviz" and probes.summary == "attnviz DataFrame: 1 probe from 1 row"
    assert (probes[0].candidates, probes[0].gold, probes[0].id) == (
        ("the trophy", "the suitcase"),
        "the trophy",
        "probe-1",
    )
    with pytest.raises(attnviz.InputError) as err:
        load_probes(frame, columns={"text": "sentence", "pronoun": "pronoun"})
    assert str(err.value) == (
        "columns names what DataFrame does not have: pronoun → 'pronoun'; its columns are "
        "['answer', 'opt1', 'opt2', 'pron', 'sentence']"
    )


def test_a_dataframe_and_a_hugging_face_dataset_with_class_labels():
    datasets = pytest.importorskip("datasets")
    text = "Mark told Pete many lies about himself, which Pete included in his book. He should have been more truthful."
    he = text.split().index("He")
    flat = pd.DataFrame(
        [
            {
                "text": text,
                "span1_index": 0,
                "span2_index": he,
                "span1_text": "Mark",
                "span2_text": "He",
                "idx": 0,
                "label": 1,
            },
            {
                "text": text,
                "span1_index": 2,
                "span2_index": he,
                "span1_text": "Pete",
                "span2_text": "He",
                "idx": 1,
                "label": 0,
            },
        ]
    )
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "span1_index": datasets.Value("int32"),
            "span2_index": datasets.Value("int32"),
            "span1_text": datasets.Value("string"),
            "span2_text": datasets.Value("string"),
            "idx": datasets.Value("int32"),
            "label": datasets.ClassLabel(names=["False", "True"]),  # SuperGLUE's: 1 is True
        }
    )
    dataset = datasets.Dataset.from_pandas(flat, features=features, preserve_index=False)
    probes, warned = quiet(dataset)
    assert warned == [] and probes.format == "superglue-wsc" and probes.summary.startswith("SuperGLUE WSC Dataset:")
    assert probes[0].gold == "Mark" and spans(probes[0]) == ("He", ["Mark", "Pete"])
    # the same table as a DataFrame: its 1/0 labels are true/false too
    assert load_probes(flat)[0].gold == "Mark"
    own = pd.DataFrame([{"text": text, "pronoun": "He", "candidates": ["Mark", "Pete"], "gold": "Mark"}])
    assert load_probes(own)[0].locate()[0] == (text.index("He"), text.index("He") + 2)


def test_json_lists_parquet_and_lists_of_dicts_or_probes(tmp_path):
    item = {
        "text": "The cat sat on the mat because it was warm.",
        "pronoun": "it",
        "candidates": ["cat", "mat"],
        "gold": "mat",
    }
    (tmp_path / "list.json").write_text(json.dumps([item, item]), encoding="utf-8")
    assert len(load_probes(tmp_path / "list.json")) == 2
    pd.DataFrame([item]).to_parquet(tmp_path / "p.parquet")
    assert load_probes(tmp_path / "p.parquet")[0].candidates == ("cat", "mat")
    made = Probe(item["text"], "it", ("cat", "mat"), "mat", "mine", pronoun_start=item["text"].index(" it ") + 1)
    probes = load_probes([made, item])
    assert probes[0] == made and probes[1].id == "probe-2"


# --- what cannot be read ------------------------------------------------------------------------------------


def test_every_reason_is_reported_and_strict_refuses(tmp_path):
    text = "The trophy doesn't fit in the suitcase because its lid is small and it is big."
    good = {"text": text, "pronoun": "it", "candidates": ["trophy", "suitcase"], "gold": "trophy"}
    rows = [
        good,
        dict(good, candidates=["trophy", "box"]),
        dict(good, pronoun_start=text.index("its")),
        dict(good, candidates=["trophy"]),
        {k: v for k, v in good.items() if k != "gold"},
        dict(good, gold="box"),
        dict(good, candidates=["trophy", "trophy"]),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n[1, 2]\n", encoding="utf-8")
    probes, warned = quiet(path)
    assert len(probes) == 1
    assert probes.problems[["row", "kind"]].values.tolist() == [
        [2, "candidate not in the text"],
        [3, "pronoun offset does not match"],
        [4, "fewer than 2 candidates"],
        [5, "missing field"],
        [6, "gold not a candidate"],
        [7, "gold given twice"],
        [8, "not JSON"],
        [9, "not JSON"],
    ]
    assert probes.problems["reason"].tolist() == [
        "candidate 'box' is not in the text",
        f"pronoun offset {text.index('its')} does not match: the text there is 'its'",
        "needs at least 2 candidates, got ['trophy']",
        "a probe needs gold; got keys ['candidates', 'pronoun', 'text']",
        "gold 'box' is not one of the candidates ['trophy', 'suitcase']",
        "gold 'trophy' is given twice among the candidates ['trophy', 'trophy']",
        "not JSON (Expecting property name enclosed in double quotes)",
        "not a JSON object but list",
    ]
    assert probes.problems["id"].tolist()[:2] == ["mixed-2", "mixed-3"]
    assert warned == [probes.summary] and probes.summary.startswith(
        "attnviz mixed.jsonl: 1 probe from 9 lines; 8 unusable (2× not JSON, "
    )
    with pytest.raises(attnviz.InputError) as err:
        load_probes(path, strict=True)
    message = str(err.value)
    assert message.startswith(probes.summary + ". Nothing was scored: strict=True refuses any unusable probe — ")
    assert "line 2 (mixed-2): candidate 'box' is not in the text; line 3 (mixed-3): pronoun offset" in message
    # nothing usable at all is an error, with every reason
    path.write_text(json.dumps(rows[1]) + "\n", encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"no probe is usable — line 1 \(mixed-1\): candidate 'box' is not in"):
        load_probes(path)


def test_formats_that_cannot_be_told_or_do_not_fit_say_which_exist(tmp_path):
    frame = pd.DataFrame({"sentence": ["a b it"], "pron": ["it"]})
    with pytest.raises(attnviz.InputError) as err:
        load_probes(frame)
    message = str(err.value)
    assert message.startswith(
        "cannot tell the format of DataFrame from its columns ['pron', 'sentence']; the formats are "
    )
    assert all(name in message for name in PROBE_FORMATS) and "columns={'text': 'your_column'" in message
    with pytest.raises(
        attnviz.InputError, match=r"^DataFrame is not in the gap format: it has no A, A-coref, A-offset"
    ):
        load_probes(frame, format="gap")
    with pytest.raises(attnviz.InputError, match=r"^unknown probe format 'gab'; the formats are attnviz, gap, "):
        load_probes(frame, format="gab")
    (tmp_path / "p.txt").write_text("x", encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"name it \.jsonl, \.json, \.csv, \.tsv or \.parquet"):
        load_probes(tmp_path / "p.txt")
    with pytest.raises(attnviz.InputError, match=r"^no probe file at 'nowhere.jsonl'; use a JSONL, JSON, CSV"):
        load_probes("nowhere.jsonl")
    with pytest.raises(attnviz.ArgumentTypeError, match=r"got int$"):
        load_probes(42)


def test_the_shipped_sets_and_old_files_still_load_and_locate(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(
        '{"text": "The trophy doesn\'t fit in the suitcase because it is too big.", "pronoun": "it", '
        '"candidates": ["trophy", "suitcase"], "gold": "trophy"}\n',
        encoding="utf-8",
    )
    for source in ("en", "zh", old):
        probes, warned = quiet(source)
        assert warned == [] and len(probes.problems) == 0 and probes.format == "attnviz"
        for probe in probes:
            pronoun, candidates = spans(probe)
            assert pronoun.lower() == probe.pronoun.lower()
            assert [c.lower() for c in candidates] == [c.lower() for c in probe.candidates]
    assert load_probes("en").summary == "the shipped set 'en': 42 probes from 42 lines"


def test_a_file_of_only_bad_lines_reports_them_and_names_are_never_read_as_missing(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text("{oops\n", encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"no probe is usable — line 1: not JSON"):
        load_probes(path)
    # GAP has people called Nan and NA: a TSV cell is text, not a missing value
    text = "Nan met NA at noon, and she waved."
    gap = tmp_path / "gap.tsv"
    gap.write_text(
        GAP_HEADER + "\n" + gap_row("t-1", text, "she", text.index("she"), "Nan", "TRUE", "NA", "FALSE") + "\n",
        encoding="utf-8",
    )
    assert load_probes(gap)[0].candidates == ("Nan", "NA")
    with pytest.raises(attnviz.InputError, match=r"^columns\['candidates'\] must name a column"):
        load_probes(pd.DataFrame({"a": [1]}), columns={"candidates": 3})
    # offsets and candidates in a CSV of attnviz's fields: a JSON list, texts split on |, gaps as None
    csv = tmp_path / "own.csv"
    sentence = "It fell because it was heavy, the box on the shelf."
    pd.DataFrame(
        [
            {"text": sentence, "pronoun": "it", "pronoun_start": 0, "candidates": "box|shelf", "gold": "box"},
            {"text": sentence, "pronoun": "it", "pronoun_start": None, "candidates": '["box", "shelf"]', "gold": 1},
        ]
    ).to_csv(csv, index=False)
    first, second = load_probes(csv)
    assert first.locate()[0] == (0, 2) and second.locate()[0] == (
        sentence.index(" it ") + 1,
        sentence.index(" it ") + 3,
    )
    assert (first.gold, second.gold, second.pronoun_start) == ("box", "shelf", None)


def test_the_other_reasons_conflicting_or_unreadable_labels_and_bad_places(tmp_path):
    text = "Ann met Bea and she left."
    rows = superglue_rows(text, 4, [("Ann", 0, True), ("Bea", 2, False), ("ann", 0, False)])  # Ann: true and false
    rows += superglue_rows("Cy met Di and he left.", 4, [("Cy", 0, "maybe"), ("Di", 2, False)])
    rows += superglue_rows("Cy met Di and he left now.", 4, [("Cy", 0, True), ("Di", 2, False)])
    rows[-1]["target"]["span1_index"] = 40
    with pytest.raises(attnviz.InputError) as err:
        load_probes(jsonl(tmp_path / "wsc.jsonl", rows))
    assert str(err.value).endswith(
        "no probe is usable — "
        "line 1 (0+1+2): candidate 'ann' is labelled both true and false for the pronoun 'she' at word 4; "
        "line 4 (0): label must be true or false, got 'maybe'; "
        "line 5 (1): only one candidate ('Di') for the pronoun 'he' at word 4; "
        "line 6 (0): only one candidate ('Cy') for the pronoun 'he' at word 4; "
        "line 7 (1): span1_index 40 is not a word of the text (it has 7 words)"
    )
    with pytest.warns(UserWarning, match=r"^attnviz list: 1 probe from 2 rows; 1 unusable \(1× not a probe\)"):
        listed = load_probes([{"text": "a b it", "pronoun": "it", "candidates": ["a", "b"], "gold": "a"}, 7])
    assert listed.problems[["row", "kind", "reason"]].values.tolist() == [
        [2, "not a probe", "a probe is a dict, got int"]
    ]
