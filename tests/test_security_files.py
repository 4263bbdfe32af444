"""Security issue #51: a capture file is checked when it loads, and saved atomically.

A capture file is data from anywhere. Crafted files (one per field, the table below) are each refused by
``attnviz.load`` with a :class:`~attnviz.errors.CaptureFileError` naming the field; random mutations of a
real file's metadata (hypothesis) either load into a capture that works or are refused so — never another
exception, never a MemoryError. Every file attnviz itself writes loads back (each kind of capture). A save
goes through :func:`attnviz.files.atomic_path`: stopped by SIGTERM or SIGKILL, or failing on a full disk
(safetensors' own error), it leaves the previous file whole and no temporary file behind.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from skimage.data import chelsea

import attnviz
from attnviz.data import io_schema
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.generation_result import Generation

TMP = ".attnviz-tmp"


def read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["attnviz"]), {key: f.get_tensor(key) for key in f.keys()}


def write(path: Path, meta, tensors: dict[str, torch.Tensor]) -> Path:
    text = meta if isinstance(meta, str) else json.dumps(meta)
    save_file(tensors, str(path), metadata={"attnviz": text})
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), "1 2 3 4", IdsTokenizer())
    return cap.save(tmp_path_factory.mktemp("text") / "text.attnviz")


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> Path:
    cap = attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit"))
    return cap.save(tmp_path_factory.mktemp("image") / "image.attnviz")


def _set(path: str, value):
    """A mutation setting the metadata field at ``path`` (``/`` between keys; list indices as numbers) to ``value``."""

    def mutate(meta, tensors):
        *where, last = path.split("/")
        node = meta
        for key in where:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _drop(path: str):
    def mutate(meta, tensors):
        *where, last = path.split("/")
        node = meta
        for key in where:
            node = node[key]
        del node[last]

    return mutate


def _tensor(key: str, value):
    def mutate(meta, tensors):
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value

    return mutate


def _meta_text(text: str):
    def mutate(meta, tensors):
        return text

    return mutate


def _both(*mutations):
    def mutate(meta, tensors):
        for m in mutations:
            m(meta, tensors)

    return mutate


DEEP = "[" * 200_000 + "]" * 200_000
R0 = "records.decoder.0"  # as messages name it
P0 = "records/decoder.0"  # its path in the metadata

#: (file, how it is crafted, what the refusal says): the attacker's files, one field each
CRAFTED = {
    "metadata a list": ("text", _meta_text("[1, 2, 3]"), "its metadata must be a JSON object, not a list"),
    "200k-deep array": ("text", _meta_text(DEEP), "nested 200000 levels deep"),
    "200k-deep inside": (
        "text",
        _meta_text('{"format": "attnviz-capture", "model": ' + DEEP + "}"),
        "nested 200001 levels deep",
    ),
    "not JSON": ("text", _meta_text("{format: attnviz"), "missing or broken metadata"),
    "int of 5000 digits": ("text", _meta_text('{"version": ' + "9" * 5000 + "}"), "missing or broken metadata"),
    "version a string": ("text", _set("version", "2"), "metadata field version must be an integer"),
    "version from the future": ("text", _set("version", 99), "written by a newer attnviz (format version 99)"),
    "tokens one short": ("text", _set("tokens", ["1", "2", "3"]), "field token_ids must have 3 entries"),
    "tokens and ids one short": (
        "text",
        _both(
            _set("tokens", ["1", "2", "3"]),
            _set("token_ids", [1, 2, 3]),
            _set("offsets", [[0, 1]] * 3),
            _set("words", [["1", 0, 1, 0, 1], ["2", 2, 3, 1, 2], ["3", 4, 5, 2, 3]]),
        ),
        f"field {R0}.q must have one query position per token of the text (tokens) (3 tokens)",
    ),
    "integer tokens": ("text", _set("tokens", [1, 2, 3, 4]), "metadata field tokens.0 must be a string, got 1"),
    "token id a float": ("text", _set("token_ids/1", 2.5), "metadata field token_ids.1 must be an integer"),
    "token id 2**40": ("text", _set("token_ids/1", 2**40), "metadata field token_ids.1 must be an integer"),
    "offsets past the text": ("text", _set("offsets/3", [6, 99]), "metadata field offsets.3.1 must be an integer"),
    "offsets a pair of three": ("text", _set("offsets/0", [0, 1, 2]), "offsets.0 must have 2 entries"),
    "word span of 10**9": ("text", _set("words/0/4", 10**9), "field words.0.4 (its end token) must be an integer"),
    "word of no token": ("text", _set("words/0", ["1", 0, 1, 2, 2]), "words.0.4 (its end token)"),
    "word past the text": ("text", _set("words/0/2", 10**6), "words.0.2 (its end character)"),
    "words an object": ("text", _set("words", {"a": 1}), "metadata field words must be a list"),
    "text a number": ("text", _set("text", 1234), "metadata field text must be a string, got 1234"),
    "model a list": ("text", _set("model", []), "metadata field model must be an object, got []"),
    "model missing": ("text", _drop("model"), "metadata field model must be an object, got null"),
    "n_heads 10**12": ("text", _set("model/parts/decoder/n_heads", 10**12), "model.parts.decoder.n_heads must be"),
    "n_heads 8 of 4 stacked": ("text", _set("model/parts/decoder/n_heads", 8), f"{R0}.q must stack the part's 8 heads"),
    "d_head of another width": ("text", _set("model/parts/decoder/d_head", 16), f"{R0}.q must be 16 wide"),
    "n_kv_heads over n_heads": ("text", _set("model/parts/decoder/n_kv_heads", 5), "n_kv_heads must be at most"),
    "n_layers 0": ("text", _set("model/parts/decoder/n_layers", 0), "model.parts.decoder.n_layers must be"),
    "unknown part": ("text", _set("model/parts", {"nose": {}}), "metadata field model.parts must name parts among"),
    "check_error 10**400": (
        "text",
        _set("model/check_error", 10**400),
        "model.check_error must be a number, got a huge",
    ),
    "scaling 10**400": ("text", _set(f"{P0}/scaling", 10**400), f"{R0}.scaling must be a positive number, got a huge"),
    "a key of two lines": (
        "text",
        _set("model/provenance/evil\nkey\u2028", [1]),
        "metadata field model.provenance.evil\\nkey\\u2028 must be a string, number or true/false or null",
    ),
    "check_error big": ("text", _set("model/check_error", "big"), 'model.check_error must be a number, got "big"'),
    "dtype a list": ("text", _set("model/dtype", ["float32"]), "metadata field model.dtype must be a string"),
    "kept unknown": ("text", _set("model/kept", ["q", "k", "rm -rf"]), "metadata field model.kept.2 must be one of"),
    "provenance a list": ("text", _set("model/provenance", [1]), "metadata field model.provenance must be an object"),
    "check_passed a string": (
        "text",
        _set("model/provenance/check_passed", "yes"),
        "model.provenance.check_passed must be true or false or null",
    ),
    "weights hash a number": (
        "text",
        _set("model/provenance/weights_sha256", 12),
        "model.provenance.weights_sha256 must be a string or null",
    ),
    "check_worst a string": ("text", _set("model/provenance/check_worst", "1"), "check_worst must be a number"),
    "prompt_length 10**9": (
        "text",
        _set("model/generation", {"prompt_length": 10**9, "text": "", "steps": [4]}),
        "model.generation.prompt_length must be an integer from 0 to 4",
    ),
    "records a list": ("text", _set("records", []), "metadata field records must be an object, got []"),
    "scaling null": ("text", _set(f"{P0}/scaling", None), f"{R0}.scaling must be a positive number, got null"),
    "scaling negative": ("text", _set(f"{P0}/scaling", -0.5), f"{R0}.scaling must be a positive number, got -0.5"),
    "scaling NaN": ("text", _set(f"{P0}/scaling", float("nan")), f"{R0}.scaling must be a positive number, got NaN"),
    "scaling true": ("text", _set(f"{P0}/scaling", True), f"{R0}.scaling must be a positive number, got true"),
    "causal a string": ("text", _set(f"{P0}/causal", "yes"), f"{R0}.causal must be true or false"),
    "window negative": ("text", _set(f"{P0}/window", -3), f"{R0}.window must be an integer"),
    "softcap zero": ("text", _set(f"{P0}/softcap", 0), f"{R0}.softcap must be a positive number or null"),
    "name a number": ("text", _set(f"{P0}/name", 3), f"{R0}.name must be a string"),
    "an unknown record field": ("text", _set(f"{P0}/__class__", "x"), f"{R0} may have the fields name, scaling"),
    "record of no part": ("text", _set("records/nose.0", {}), "records.nose.0 must name a part of model.parts"),
    "record past n_layers": ("text", _set("records/decoder.7", {}), "must name a layer 0..1 of decoder"),
    "record layer not a number": ("text", _set("records/decoder.x", {}), "must name a layer 0..1 of decoder"),
    "heads of another count": ("text", _set(f"{P0}/heads", [0, 1]), f"{R0}.heads must have 4 entries"),
    "heads past n_heads": ("text", _set(f"{P0}/heads", [0, 1, 2, 9]), f"{R0}.heads.3 must be an integer from 0 to 3"),
    "heads twice": ("text", _set(f"{P0}/heads", [0, 1, 1, 2]), f"{R0}.heads must name distinct heads"),
    "kv_heads past n_kv_heads": (
        "text",
        _set(f"{P0}/kv_heads", [0, 1, 2, 7]),
        f"{R0}.kv_heads.3 must be an integer from 0 to 3",
    ),
    "shared to a missing key": (
        "text",
        _set(f"{P0}/shared", {"k": "records.decoder.9.k"}),
        f"{R0}.shared.k must name a tensor the file has",
    ),
    "shared of an unknown field": (
        "text",
        _set(f"{P0}/shared", {"evil": f"{R0}.q"}),
        f"{R0}.shared must name tensors among",
    ),
    "shared an object": ("text", _set(f"{P0}/shared", {"q": {"a": 1}}), f"{R0}.shared.q must name a tensor"),
    "q missing": ("text", _tensor(f"{R0}.q", None), f'{R0} must come with its q, k and v tensors, got "no q"'),
    "q 1-D": ("text", _tensor(f"{R0}.q", torch.zeros(8)), f"{R0}.q must be a floating-point tensor [head"),
    "q of integers": ("text", _tensor(f"{R0}.q", torch.zeros(4, 4, 8, dtype=torch.int64)), f"{R0}.q must be a"),
    "k of 3 heads": ("text", _tensor(f"{R0}.k", torch.zeros(3, 4, 8)), f"{R0}.k must stack the part's 4 key/value"),
    "k of another width": ("text", _tensor(f"{R0}.k", torch.zeros(4, 4, 5)), f"{R0}.k must have the shape"),
    "v of other keys": ("text", _tensor(f"{R0}.v", torch.zeros(4, 3, 8)), f"{R0}.v must have the shape"),
    "out of other rows": ("text", _tensor(f"{R0}.out", torch.zeros(4, 5, 8)), f"{R0}.out must have the shape"),
    "weights 2-D": ("text", _tensor(f"{R0}.weights", torch.zeros(4, 4)), f"{R0}.weights must be a floating-point"),
    "mask of 4 dimensions": ("text", _tensor(f"{R0}.mask", torch.zeros(1, 1, 4, 4)), f"{R0}.mask must be a bool"),
    "value_dots of no width": ("text", _tensor(f"{R0}.value_dots", torch.zeros(4, 4, 0)), "at least one column"),
    "sinks of other heads": ("text", _tensor(f"{R0}.sinks", torch.zeros(3)), f"{R0}.sinks must have the shape 4"),
    "projection_check of 2": ("text", _tensor(f"{R0}.projection_check", torch.zeros(2)), "projection_check must"),
    "grid past the pixels": ("image", _set("image/grid", [5, 4]), "image.grid.0 (rows of patches on 32 pixels)"),
    "grid of 10**9": ("image", _set("image/grid", [10**9, 10**9]), "image.grid.0 (rows of patches"),
    "patch 0": ("image", _set("image/patch", [0, 8]), "image.patch.0 must be an integer from 1 to 32"),
    "prefix of numbers": ("image", _set("image/prefix", [1]), "image.prefix.0 must be a string"),
    "pixels missing": ("image", _tensor("image.pixels", None), "names tensor 'image.pixels', which the file does not"),
    "pixels float": ("image", _tensor("image.pixels", torch.zeros(32, 32, 3)), "pixels of height × width × 3 uint8"),
    "grid of other tokens than the text": (
        "image",
        _set("image/prefix", ["[CLS]", "[REG]"]),
        "image must have as many",
    ),
    "vision record of no part": ("image", _set("records/vision.0", {}), "records.vision.0 must name a part of"),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_file_is_refused_naming_its_field(name, text_file, image_file, tmp_path):
    which, mutate, message = CRAFTED[name]
    meta, tensors = read(text_file if which == "text" else image_file)
    meta = mutate(meta, tensors) or meta
    path = write(tmp_path / "crafted.attnviz", meta, tensors)
    with pytest.raises(attnviz.CaptureFileError) as refused:
        attnviz.load(path)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 400


def test_metadata_longer_than_the_limit_is_refused_before_it_is_parsed(text_file, tmp_path, monkeypatch):
    meta, tensors = read(text_file)
    monkeypatch.setattr(io_schema, "MAX_META_CHARS", 1000)
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed"))
    with pytest.raises(attnviz.CaptureFileError, match="more than the 1,000 a capture file may carry"):
        attnviz.load(write(tmp_path / "long.attnviz", meta, tensors))


def _json_depth(text: str) -> int:
    """JSON's own reading of a valid document's depth, a character at a time."""
    depth = deepest = 0
    inside = escaped = False
    for ch in text:
        if inside:
            escaped, inside = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            inside = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def test_a_capture_whose_metadata_load_would_refuse_is_not_written(two_captures, tmp_path, monkeypatch):
    first, second = two_captures
    path = first.save(tmp_path / "cap.attnviz")
    monkeypatch.setattr(io_schema, "MAX_META_CHARS", 1000)
    with pytest.raises(attnviz.CaptureFileError, match="more than the 1,000 a capture file may carry"):
        second.save(path)
    monkeypatch.undo()
    assert attnviz.load(path).tokens == first.tokens and _leftovers(tmp_path) == []


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1 << 20])
def test_the_depth_scan_ignores_brackets_inside_strings_across_its_pieces(piece, monkeypatch):
    monkeypatch.setattr(io_schema, "_PIECE", piece)
    assert io_schema.json_depth('{"a": "[[[[[[{{{{\\"]]]", "b": [[1]]}') == 3
    assert io_schema.json_depth("[" * 1000 + "]" * 1000) == 1000
    nested: object = []
    for word in ['a"[', "\\", '\\"{', "]}", "漢[", '\\\\"', ""]:
        nested = [word, nested, {word: nested}]
    for text in (json.dumps(nested), json.dumps(nested, ensure_ascii=False)):
        assert io_schema.json_depth(text) == _json_depth(text) == 15


def test_the_depth_scan_is_linear_on_a_string_of_escaped_quotes(text_file, tmp_path):
    """A regular expression for JSON strings retried from every quote of '"\\"\\"\\"…' took time quadratic in its
    length (days for these 6 MB); the scan reads each byte once."""
    _, tensors = read(text_file)
    path = write(tmp_path / "quotes.attnviz", '"' + '\\"' * 3_000_000, tensors)
    code = "import sys, attnviz\ntry:\n    attnviz.load(sys.argv[1])\nexcept attnviz.CaptureFileError as err:\n    print(err)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, env=env)
    assert "missing or broken metadata" in done.stdout, done.stderr[-2000:]


# ------------------------------------------------------------------ random mutations (hypothesis)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 1, 2**31, 10**12, 2**63, -(2**63)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def _paths(node, prefix=()):
    """Every (path) into the metadata's tree (the records' tensors are not in it)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


@st.composite
def mutations(draw, meta: dict):
    paths = [p for p in _paths(meta) if p]
    meta = copy.deepcopy(meta)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = meta
        try:
            for key in path[:-1]:
                parent = parent[key]
            last = path[-1]
            current = parent[last]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation changed the way there
        kind = draw(st.sampled_from(["drop", "value", "deep", "longer", "shorter", "number"]))
        if kind == "drop":
            if isinstance(parent, dict):
                del parent[last]
            else:
                parent.pop(last)
        elif kind == "value":
            parent[last] = draw(JSON_VALUES)
        elif kind == "deep":
            parent[last] = json.loads("[" * 40 + "]" * 40)
        elif kind == "longer" and isinstance(current, list):
            current.append(copy.deepcopy(current[-1]) if current else draw(JSON_VALUES))
        elif kind == "shorter" and isinstance(current, list) and current:
            current.pop()
        elif kind == "number":
            parent[last] = draw(st.sampled_from([-1, 0, 10**9, 10**12, 2**63, -(10**12), 10**400, 0.5, float("inf")]))
    return meta


def _loads_and_works_or_is_refused(path: Path) -> None:
    """attnviz.load(path) is a capture whose repr, tokens, attention and validate work, or a CaptureFileError."""
    try:
        cap = attnviz.load(path)
    except attnviz.CaptureFileError:
        return
    repr(cap)
    assert len(cap.tokens) == cap.n_tokens
    for part in cap.parts:
        layers = cap.layer_indices(part)
        if layers:
            heads = cap.kept_heads(part)
            assert cap.attention(layers[0], heads[0], part=part).dim() == 2
    try:
        cap.validate()
    except attnviz.InputError as err:  # kept= left out v or out: a refusal that says so
        assert "kept" in str(err)


def _mutated_files_load_or_are_refused(base: Path, folder: Path):
    meta, tensors = read(base)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(mutations(meta))
    def run(mutated):
        path = write(folder / "mutated.attnviz", mutated, tensors)
        _loads_and_works_or_is_refused(path)

    run()


@st.composite
def tensor_mutations(draw, tensors: dict[str, torch.Tensor]):
    """The file's tensors with one to three replaced (any rank up to 4, sizes 0..5, float / int / bool) or dropped."""
    tensors = dict(tensors)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(tensors)))
        if draw(st.booleans()):
            tensors.pop(key, None)
            continue
        shape = draw(st.lists(st.integers(0, 5), max_size=4))
        dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool]))
        tensors[key] = torch.ones(shape, dtype=dtype)
    return tensors


@pytest.mark.parametrize("base", ["text_file", "image_file"])
def test_random_tensors_in_place_of_a_captures_load_or_are_refused(base, request, tmp_path):
    meta, tensors = read(request.getfixturevalue(base))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(tensor_mutations(tensors))
    def run(mutated):
        _loads_and_works_or_is_refused(write(tmp_path / "mutated.attnviz", meta, mutated))

    run()


def test_random_mutations_of_a_text_capture_load_or_are_refused(text_file, tmp_path):
    _mutated_files_load_or_are_refused(text_file, tmp_path)


def test_random_mutations_of_an_image_capture_load_or_are_refused(image_file, tmp_path):
    _mutated_files_load_or_are_refused(image_file, tmp_path)


def test_random_mutations_of_a_seq2seq_capture_with_heads_load_or_are_refused(tmp_path):
    model = attnviz.testing.tiny_model("t5")
    cap = attnviz.capture(
        model, input_ids=torch.randint(3, 120, (1, 5)), decoder_input_ids=torch.arange(3, 7)[None], heads=[1, 2]
    )
    _mutated_files_load_or_are_refused(cap.save(tmp_path / "t5.attnviz"), tmp_path)


# ------------------------------------------------------------------ every file attnviz writes loads back
def _same(back: attnviz.Capture, cap: attnviz.Capture) -> None:
    assert (back.tokens, back.token_ids, back.offsets, back.words) == (
        cap.tokens,
        cap.token_ids,
        cap.offsets,
        cap.words,
    )
    assert back.model == json.loads(json.dumps(cap.model)) and back.provenance == cap.provenance
    assert back.records.keys() == cap.records.keys() and repr(back) == repr(cap)
    for part in cap.parts:
        layer = cap.layer_indices(part)[-1]
        head = cap.kept_heads(part)[-1]
        torch.testing.assert_close(back.attention(layer, head, part=part), cap.attention(layer, head, part=part))
    if cap.model.get("kept") is None or {"v", "out"} <= set(cap.model["kept"]):
        assert back.validate().passed


def _joint(family: str) -> attnviz.Capture:
    model, processor = attnviz.testing.tiny_joint(family)
    return attnviz.capture(model, "the cat", chelsea(), processor=processor)


KINDS = {
    "text": lambda: attnviz.capture(attnviz.testing.tiny_model("llama"), "1 2 3 4 5", IdsTokenizer()),
    "t5": lambda: attnviz.capture(
        attnviz.testing.tiny_model("t5"),
        input_ids=torch.randint(3, 120, (1, 7)),
        decoder_input_ids=torch.arange(3, 8)[None],
    ),
    "bart": lambda: attnviz.capture(
        attnviz.testing.tiny_model("bart"),
        input_ids=torch.randint(3, 60, (1, 6)),
        decoder_input_ids=torch.arange(3, 6)[None],
    ),
    "heads": lambda: attnviz.capture(
        attnviz.testing.tiny_model("llama", num_key_value_heads=2), "1 2 3 4", IdsTokenizer(), heads=[1, 3]
    ),
    "heads per layer": lambda: attnviz.capture(
        attnviz.testing.tiny_model("gpt2"), "1 2 3 4", IdsTokenizer(), heads={0: [2], 1: [0, 3]}
    ),
    "keep": lambda: attnviz.capture(attnviz.testing.tiny_model("gpt2"), "1 2 3 4", IdsTokenizer(), keep="q,k"),
    "vit": lambda: attnviz.capture(attnviz.testing.tiny_model("vit"), chelsea(), attnviz.testing.tiny_processor("vit")),
    "dinov2 registers": lambda: attnviz.capture(
        attnviz.testing.tiny_model("dinov2_registers"), chelsea(), attnviz.testing.tiny_processor("dinov2_registers")
    ),
    "gpt_oss sinks": lambda: attnviz.capture(attnviz.testing.tiny_model("gpt_oss"), "1 2 3 4", IdsTokenizer()),
    "falcon alibi": lambda: attnviz.capture(attnviz.testing.tiny_model("falcon_alibi"), "1 2 3 4", IdsTokenizer()),
    "clip joint": lambda: _joint("clip"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_capture_attnviz_writes_loads_back(kind, tmp_path):
    cap = KINDS[kind]()
    _same(attnviz.load(cap.save(tmp_path / f"{kind}.attnviz")), cap)


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_a_generation_loads_back_as_the_same_generation(family, tmp_path):
    model = attnviz.testing.tiny_model(family)
    gen = attnviz.generate(model, "1 2 3", IdsTokenizer(), max_new_tokens=3)
    back = Generation.of(attnviz.load(gen.save(tmp_path / "gen.attnviz")))
    _same(back.capture, gen.capture)
    assert (back.new_tokens, back.text, back.steps) == (gen.new_tokens, gen.text, gen.steps)
    assert torch.equal(back.step(-1).weights, gen.step(-1).weights)


def test_a_vision_language_capture_loads_back(tmp_path):
    model, processor = attnviz.testing.tiny_vlm()
    cap = attnviz.capture(model, "A photo: <image> the cat", chelsea(), processor=processor)
    _same(attnviz.load(cap.save(tmp_path / "vlm.attnviz")), cap)


def test_a_format_1_file_with_words_and_a_mask_loads(tmp_path):
    q = torch.randn(2, 3, 4)
    meta = {
        "format": "attnviz-capture",
        "version": 1,
        "text": "a b c",
        "tokens": ["a", "b", "c"],
        "token_ids": [1, 2, 3],
        "offsets": [[0, 1], [2, 3], [4, 5]],
        "words": [["a", 0, 1, 0, 1], ["b c", 2, 5, 1, 3]],
        "model": {"name": "old", "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "d_head": 4, "backend": "sdpa"},
        "layers": {"1": {"name": "h.1.attn", "scaling": 0.5, "causal": False, "window": None, "softcap": None}},
    }
    tensors = {
        "layers.1.q": q,
        "layers.1.k": q[:1].clone(),
        "layers.1.v": q[:1].clone(),
        "layers.1.mask": torch.ones(3, 3) > 0,
    }
    old = attnviz.load(write(tmp_path / "old.attnviz", meta, tensors))
    assert old.parts == ("encoder",) and old.layer_indices() == [1] and old.attention(1, 1).shape == (3, 3)
    for name in ("target", "image"):  # read by the loader whatever the version: refused in a format-1 file
        crafted = {**meta, name: {"patch": [0, 0], "grid": [10**9, 10**9], "prefix": [], "text": 1}}
        with pytest.raises(attnviz.CaptureFileError, match=f"metadata field {name} is not part of a format-1 file"):
            attnviz.load(write(tmp_path / "old.attnviz", crafted, tensors))
    meta["layers"]["1"]["scaling"] = "half"
    with pytest.raises(attnviz.CaptureFileError, match="metadata field layers.1.scaling must be a positive number"):
        attnviz.load(write(tmp_path / "old.attnviz", meta, tensors))


# ------------------------------------------------------------------ the save is atomic
def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TMP))


@pytest.fixture
def two_captures():
    model = attnviz.testing.tiny_model("gpt2")
    return attnviz.capture(model, "1 2 3 4", IdsTokenizer()), attnviz.capture(model, "5 6 7 8 9 10", IdsTokenizer())


def _half_then(action: str) -> str:
    """Code for a process that saves a capture over ``sys.argv[1]`` with safetensors writing half a file,
    then doing ``action`` (waiting to be signalled, or raising safetensors' own error)."""
    return textwrap.dedent(
        f"""
        import os, sys, time
        import attnviz, safetensors.torch
        from safetensors import SafetensorError
        from attnviz.workflows.capture.models import IdsTokenizer
        real = safetensors.torch.save_file

        def half(tensors, filename, metadata=None):
            real(tensors, filename, metadata=metadata)
            size = os.path.getsize(filename)
            with open(filename, "r+b") as f:
                f.truncate(size // 2)
            {action}

        safetensors.torch.save_file = half
        cap = attnviz.capture(attnviz.testing.tiny_model("gpt2"), "5 6 7 8 9 10", IdsTokenizer())
        cap.save(sys.argv[1])
        """
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_save_stopped_by_a_signal_leaves_the_previous_file_whole(sig, two_captures, tmp_path):
    first, _ = two_captures
    path = first.save(tmp_path / "cap.attnviz")
    before = path.read_bytes()
    code = _half_then('print("writing", flush=True); time.sleep(60)')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
    finally:
        proc.kill()
        proc.wait()
    assert path.read_bytes() == before and attnviz.load(path).tokens == first.tokens
    if sig == signal.SIGTERM:
        assert _leftovers(tmp_path) == []  # the process removed its temporary file on its way out
    else:
        assert len(_leftovers(tmp_path)) == 1  # SIGKILL: nothing can run; the next write removes it
        first.save(path)
        assert _leftovers(tmp_path) == []


def test_a_save_on_a_full_disk_leaves_the_previous_file_whole(two_captures, tmp_path, monkeypatch):
    first, second = two_captures
    path = first.save(tmp_path / "cap.attnviz")
    before = path.read_bytes()
    real = sys.modules["safetensors.torch"].save_file

    def disk_full(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        raise SafetensorError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'
        )

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)
    with pytest.raises(attnviz.CaptureFileError, match="cannot write the capture .*StorageFull") as failed:
        second.save(path)
    assert isinstance(failed.value, attnviz.FileWriteError) and isinstance(failed.value, OSError)
    assert "\n" not in str(failed.value) and "unchanged" in str(failed.value)
    assert path.read_bytes() == before and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert attnviz.load(second.save(path)).tokens == second.tokens


def test_a_save_to_a_folder_or_into_a_missing_folder_is_refused(two_captures, tmp_path):
    cap, _ = two_captures
    with pytest.raises(attnviz.CaptureFileError, match="it is a folder") as failed:
        cap.save(tmp_path)
    assert isinstance(failed.value, attnviz.FileWriteError)
    with pytest.raises(attnviz.FileWriteError, match="the folder .* does not exist"):
        cap.save(tmp_path / "missing" / "cap.attnviz")
    assert list(tmp_path.iterdir()) == []
