"""The command line's errors: one line on stderr, no library warning before it, no progress bar on
its line, and early — an unknown model in seconds, layer / head / query arguments checked against
the model's config and the tokenized text before its weights load. And the option names the
subcommands share (``-o/--out``, ``--layers``, ``--device`` …), the old spellings kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from attnviz.cli import build_parser, main
from attnviz.errors import InputError

LONG = "the cat sat on the mat. " * 200  # 1,402 MiniLM tokens; it reads 512


def cli(*args: str, **env: str) -> tuple[int, str, float]:
    """(exit status, stderr, seconds) of ``python -m attnviz ARGS`` in a fresh process."""
    environ = {**os.environ, **env}
    for name, value in env.items():
        if value == "":
            environ.pop(name)  # "" unsets
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", *args], capture_output=True, text=True, env=environ, timeout=300
    )
    return result.returncode, result.stderr, time.monotonic() - start


@pytest.fixture(scope="module")
def startup() -> float:
    """Seconds a fresh process takes to import what the command line imports before it can fail
    (torch, transformers): the bound on "in seconds" is this plus a margin, measured in the same run,
    so a loaded machine does not fail it while ~25 s of hub retries still would (twice the import plus 8 s)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, transformers, attnviz.cli"], check=True, timeout=300)
    return time.monotonic() - start


def one_error_line(err: str) -> str:
    """The single line stderr holds; fails if it holds more (a warning, a second line, a bar)."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def no_weights(monkeypatch):
    """Loading a model's weights fails the test: what is refused must be refused before them."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the argument was checked")

    monkeypatch.setattr("attnviz.workflows.capture.pipeline.load_model", refuse)


# ---------------------------------------------------------------- an unknown model, in seconds
@pytest.mark.parametrize(
    "env",
    [
        {"HF_HUB_OFFLINE": "1"},
        # online, the hub unreachable (a closed local port: nothing leaves the machine); transformers
        # alone retried for ~25 s here and printed two lines
        {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"},
    ],
    ids=["offline", "online-unreachable"],
)
def test_an_unknown_model_fails_in_seconds_on_one_line_with_what_to_do(env, startup):
    rc, err, seconds = cli("capture", "no-such/model-xyz", "hi", **env)
    line = one_error_line(err)
    assert rc == 2
    assert line.startswith(
        "error: could not load model 'no-such/model-xyz': it is not an embedded alias (minilm, smollm2), not a "
        "local folder"
    )
    assert "not in the Hugging Face cache" in line and "HF_HUB_OFFLINE" in line and "Pass a local folder" in line
    # ~4 s here, most of it importing torch and transformers (was ~27 s online)
    assert seconds < 2 * startup + 8, (seconds, startup)


def test_a_name_that_is_no_hub_id_is_refused_at_once(startup):
    rc, err, seconds = cli("capture", "not a model!", "hi", HF_HUB_OFFLINE="")
    assert rc == 2 and seconds < 2 * startup + 8, (seconds, startup)
    assert one_error_line(err).startswith(
        "error: could not load model 'not a model!': it is not an embedded alias (minilm, smollm2), not a local "
        "folder, and not a hub name (owner/name). Pass a local folder"
    )


def test_a_blank_model_name_is_said_as_blank(startup):
    rc, err, _ = cli("capture", "", "hi")
    assert rc == 2
    assert one_error_line(err) == (
        "error: no model named (got ''): give an embedded alias (minilm, smollm2), a hub name or a model's folder"
    )


# ---------------------------------------------------------------- checked before the forward
def test_layer_without_query_is_refused_not_ignored(startup):
    """It used to exit 0 with --layer silently ignored."""
    rc, err, seconds = cli("capture", "smollm2", "The dog ran.", "--layer", "99")
    assert rc == 2 and seconds < 2 * startup + 8, (seconds, startup)  # refused before any model is read
    assert one_error_line(err) == (
        "error: --layer chooses what --query prints: add --query WORD (to capture only some layers, use --layers)"
    )
    assert main(["generate", "smollm2", "Once", "--layer", "3"]) == 2  # --layer of generate is --steps'


@pytest.mark.slow
def test_layer_and_query_are_checked_against_the_config_and_the_text_before_the_weights(no_weights, capsys):
    assert main(["capture", "smollm2", "The dog ran.", "--query", "dog", "--layer", "99"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --layer 99 is out of range: smollm2 has layers 0..29"
    assert main(["capture", "smollm2", "The dog ran.", "--query", "cat"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: no word 'cat' in the text; --query takes one of its words: ['The', 'dog', 'ran', '.']"
    )
    assert main(["capture", "smollm2", "The dog ran.", "--layers", "0,1", "--query", "dog", "--layer", "5"]) == 2
    assert (
        one_error_line(capsys.readouterr().err) == "error: --layer 5 is not among --layers [0, 1]: add it to --layers"
    )
    assert main(["capture", "smollm2", "The dog ran.", "--layers", "0,40"]) == 2
    assert (
        one_error_line(capsys.readouterr().err) == "error: --layers: layer 40 is out of range: smollm2 has layers 0..29"
    )
    assert main(["capture", "smollm2", "The dog ran.", "--layers", ","]) == 2  # said as layers=[] (Python)
    assert one_error_line(capsys.readouterr().err) == (
        "error: --layers names no layer: give some, like 0,3,5, or leave it out for every layer"
    )
    assert main(["generate", "smollm2", "Once", "--steps", "--layer", "30"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --layer 30 is out of range: smollm2 has layers 0..29"


@pytest.mark.slow
def test_head_and_layer_of_export_are_checked_before_the_weights(no_weights, tmp_path, capsys):
    out = str(tmp_path / "x.html")
    assert main(["export", "minilm", "The dog ran.", "--head", "12", "-o", out]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --head 12 is out of range: minilm has heads 0..11"
    assert main(["export", "minilm", "The dog ran.", "--layer", "6", "--out", out]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --layer 6 is out of range: minilm has layers 0..5"


def test_export_from_a_capture_names_the_option_it_cannot_show(tmp_path, capsys):
    """They were the library's 'layer 9 is out of range: this model has …', naming no option."""
    import torch

    import attnviz

    path = attnviz.capture(attnviz.testing.tiny_model("bert"), input_ids=torch.tensor([[5, 9, 17]]), layers=[1]).save(
        tmp_path / "c.attnviz"
    )
    out = str(tmp_path / "x.html")
    cases = [
        (["--layer", "0"], f"error: --layer 0: {path} holds layers [1] of its encoder; give one of them"),
        (["--head", "4"], f"error: --head 4 is out of range: {path} has heads 0..3"),
        (["--part", "cross"], f"error: --part cross: {path} holds encoder; give one of them"),
    ]
    for extra, said in cases:
        assert main(["export", "--capture", str(path), "-o", out, *extra]) == 2
        assert one_error_line(capsys.readouterr().err) == said
    assert main(["export", "--capture", str(path), "-o", out, "--head", "3"]) == 0


@pytest.mark.slow
def test_a_too_long_text_is_one_line_without_transformers_warning_before_the_weights(no_weights, capsys):
    assert main(["capture", "minilm", LONG]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: The text has 1,402 tokens; minilm accepts at most 512. Shorten the text or pass max_length=512 "
        "to truncate."
    )


@pytest.mark.slow
def test_the_command_line_prints_exactly_that_line():
    """The same refusals in a fresh process: stderr holds the one line (no transformers warning,
    no loading bar: the weights never load)."""
    rc, err, _ = cli("capture", "minilm", LONG)
    assert rc == 2 and one_error_line(err).startswith("error: The text has 1,402 tokens")
    rc, err, _ = cli("capture", "minilm", "The dog ran.", "--query", "cat", "--layer", "3")
    assert rc == 2 and one_error_line(err).startswith("error: no word 'cat' in the text")


@pytest.mark.slow
def test_an_error_of_stats_is_never_on_the_progress_bars_line(tmp_path):
    corpus = tmp_path / "long.txt"
    corpus.write_text(LONG + "\n")
    rc, err, _ = cli("stats", "minilm", str(corpus), "--no-truncate")
    assert rc == 2
    lines = err.splitlines()
    errors = [line for line in lines if "error:" in line]
    assert errors == [lines[-1]] and lines[-1].startswith("error: text 1 of the corpus has 1,402 tokens"), err
    assert any("corpus:" in line for line in lines[:-1]), err  # the bar was shown, and ended its own line


@pytest.mark.slow
def test_an_error_of_probes_is_never_on_the_progress_bars_line(monkeypatch, capsys):
    def fails(self, batch):
        raise InputError("a probe failed mid-run")

    monkeypatch.setattr("attnviz.workflows.corpus.probing.ProbeRun.score", fails)
    assert main(["probes", "minilm", "en"]) == 2
    err = capsys.readouterr().err
    assert "probes:" in err and err.endswith("\nerror: a probe failed mid-run\n"), err


# ---------------------------------------------------------------- usage errors and shared names
def test_a_usage_error_is_one_line_too(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["capture", "minilm", "hi", "--layers", "0,x"])
    assert stop.value.code == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: argument --layers: --layers takes comma-separated integers like 0,3,5, got '0,x' "
        "(see attnviz capture --help)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["capture", "m", "t"],
        ["generate", "m", "t"],
        ["validate", "m", "t"],
        ["probes", "m", "en"],
        ["stats", "m", "c.txt"],
        ["atlas", "m", "c.txt"],
        ["export", "m", "t"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_subcommand_that_writes_takes_o_and_out_and_its_old_spelling(argv, capsys):
    parser = build_parser()
    for flag in ("-o", "--out", "--output"):
        assert parser.parse_args([*argv, flag, "f.x"]).out == "f.x", flag
    assert capsys.readouterr().err == ""
    if argv[0] in ("validate", "probes"):  # --csv works one release more, and says what to give instead
        assert parser.parse_args([*argv, "--csv", "f.x"]).out == "f.x"
        assert capsys.readouterr().err == (
            "warning: --csv is deprecated and will be removed in the next release; use -o/--out\n"
        )
    args = (
        parser.parse_args([*argv, "-o", "f.x", "--layers", "0,2", "--device", "cpu"]) if argv[0] != "probes" else None
    )
    if args is not None:
        assert args.layers == [0, 2] and args.device == "cpu"


def test_help_says_layer_needs_query_and_names_out():
    result = subprocess.run(
        [sys.executable, "-m", "attnviz", "capture", "--help"], capture_output=True, text=True, check=True
    )
    assert "needs --query" in result.stdout and "-o FILE, --out FILE, --output FILE" in result.stdout


# ---------------------------------------------------------------- a corpus command's arguments, before the weights
@pytest.fixture
def no_corpus_weights(monkeypatch):
    """Loading the weights in ``attnviz stats`` / ``atlas`` fails the test (what is refused must be refused first)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model's weights were loaded before the argument was checked")

    monkeypatch.setattr("attnviz.workflows.corpus.corpus._load", refuse)
    monkeypatch.setattr("attnviz.workflows.corpus.atlas.load_model", refuse)


@pytest.mark.parametrize("command", ["stats", "atlas"])
def test_a_corpus_commands_bad_length_and_corpus_are_said_before_the_weights(
    command, tmp_path, no_corpus_weights, capsys
):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat.\nIt slept.\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stop:  # was a ZeroDivisionError's traceback
        main([command, "minilm", str(corpus), "--max-length", "0"])
    assert stop.value.code == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: argument --max-length: a whole number ≥ 1, got '0' (see attnviz {command} --help)"
    )
    missing = tmp_path / "missing.txt"
    assert main([command, "minilm", str(missing)]) == 2  # was said after the weights had loaded (36 s on SmolLM2)
    assert one_error_line(capsys.readouterr().err) == (
        f"error: no corpus file at {str(missing)!r}: give a .txt (one text per line) or .jsonl file"
    )
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    assert main([command, "minilm", str(blank)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        'error: the corpus has no text: give one text per line (.txt) or {"text": ...} per line (.jsonl)'
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    assert main([command, "minilm", str(bad)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {bad}:1 is not JSON")


def test_the_atlas_reads_its_probe_set_before_the_weights_and_the_corpus(tmp_path, no_corpus_weights, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat.\n", encoding="utf-8")
    missing = tmp_path / "nofile.jsonl"
    assert main(["atlas", "minilm", str(corpus), "--probes", str(missing)]) == 2  # was after the whole corpus
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: no probe file at") and str(missing) in line, line


def test_coref_top_must_be_a_count_of_heads(no_weights, capsys):
    for top in ("0", "-2"):  # 0 printed an empty table and -2 every head but two (pandas' head(-2))
        with pytest.raises(SystemExit) as stop:
            main(["coref", "minilm", "The cat sat. It slept.", "--pronoun", "It", "--top", top])
        assert stop.value.code == 2
        assert one_error_line(capsys.readouterr().err) == (
            f"error: argument --top: a whole number ≥ 1, got {top!r} (see attnviz coref --help)"
        )


SUBCOMMANDS = {  # each subcommand with its required arguments
    "capture": ["m", "t"],
    "generate": ["m", "t"],
    "validate": ["m", "t"],
    "coref": ["m", "t", "--pronoun", "it"],
    "explain": ["m", "t", "--layer", "0", "--head", "0", "--query", "it", "--key", "cat"],
    "probes": ["m", "en"],
    "stats": ["m", "c.txt"],
    "atlas": ["m", "c.txt"],
    "export": ["m", "t", "-o", "x.html"],
    "report": ["m", "t", "-o", "x.html"],
    "app": [],
}


def test_one_option_name_and_default_per_idea_across_every_subcommand(capsys):
    """--top 10, --seed 0, --add-bos off, --part with every part a capture can hold, -o/--out/--output: the
    same in every subcommand that has it; --no-bos and --csv set nothing of their own."""
    from attnviz.cli.options import PARTS
    from attnviz.engine.specs import PARTS as CAPTURE_PARTS

    assert PARTS == CAPTURE_PARTS  # written again in the CLI only so that --help loads no torch
    parser = build_parser()
    defaults = {command: vars(parser.parse_args([command, *argv])) for command, argv in SUBCOMMANDS.items()}
    having = {
        name: {c for c, d in defaults.items() if name in d} for name in ("top", "seed", "add_bos", "part", "quiet")
    }
    assert having["top"] == {"coref", "explain", "probes"} and having["seed"] == {"generate", "atlas"}
    assert having["add_bos"] == set(SUBCOMMANDS) - {"app"} and having["part"] == {"capture", "coref", "stats", "export"}
    assert having["quiet"] == {"stats", "atlas", "probes"}  # the commands with a progress bar
    for name, value in (("top", 10), ("seed", 0), ("add_bos", False), ("part", None), ("quiet", False)):
        assert {defaults[c][name] for c in having[name]} == {value}, name
    for command in having["part"]:
        for part in PARTS:
            assert parser.parse_args([command, *SUBCOMMANDS[command], "--part", part]).part == part
    assert not any("no_bos" in d or "csv" in d for d in defaults.values())
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["coref", "probes"])
def test_exclude_sinks_as_the_api_names_it_and_keep_sinks_its_deprecated_spelling(command, capsys):
    """``exclude_sinks`` of rank_heads / evaluate_probes is --exclude-sinks (on) / --no-exclude-sinks; the old
    --keep-sinks still keeps them, with one deprecation line."""
    parser = build_parser()
    argv = [command, *SUBCOMMANDS[command]]
    assert parser.parse_args(argv).exclude_sinks is True
    assert parser.parse_args([*argv, "--no-exclude-sinks"]).exclude_sinks is False
    assert capsys.readouterr().err == ""
    old = parser.parse_args([*argv, "--keep-sinks"])
    assert old.exclude_sinks is False and "keep_sinks" not in vars(old)
    assert capsys.readouterr().err == (
        "warning: --keep-sinks is deprecated and will be removed in the next release; use --no-exclude-sinks\n"
    )


def test_no_bos_is_deprecated_and_does_nothing_for_off_is_the_default(capsys):
    parser = build_parser()
    plain, old = parser.parse_args(["probes", "m", "en"]), parser.parse_args(["probes", "m", "en", "--no-bos"])
    assert plain.add_bos is False and old.add_bos is False and vars(plain) == vars(old)
    assert capsys.readouterr().err == (
        "warning: --no-bos is deprecated and will be removed in the next release; it does nothing: no BOS token "
        "is prepended unless --add-bos is given\n"
    )
    assert parser.parse_args(["probes", "m", "en", "--add-bos"]).add_bos is True


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["coref", "minilm", "The cat sat. It slept.", "--pronoun", "It", "--part", "cross"], "encoder or decoder"),
        (["stats", "minilm", "c.txt", "--part", "vision"], "encoder or decoder"),
        (["capture", "minilm", "The cat.", "--query", "cat", "--part", "text"], "encoder, decoder or cross"),
        (["export", "minilm", "The cat.", "-o", "x.html", "--part", "vision"], "encoder, decoder or cross"),
    ],
)
def test_a_part_the_command_cannot_read_is_refused_in_one_line(argv, said, no_weights, capsys):
    assert main(argv) == 2
    command = " ".join(argv[:1] + (["--query"] if argv[0] == "capture" else []))
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --part {argv[-1]}: attnviz {command} reads the {said} attention; give one of them"
    )


@pytest.mark.parametrize("command", [["probes", "minilm", "en"], ["stats", "minilm", "c.txt"]])
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_checkpoint_interval_of_no_time_is_refused_by_the_parser(command, value, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*command, "--checkpoint-every-seconds", value])
    assert stop.value.code == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: argument --checkpoint-every-seconds: a number of seconds > 0, got {value!r} "
        f"(see attnviz {command[0]} --help)"
    )


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["capture", "minilm", "The cat.", "--max-length", "0"], "--max-length"),  # said 'max_length must be'
        (["generate", "smollm2", "The cat", "--max-new-tokens", "0"], "--max-new-tokens"),  # 'max_new_tokens'
        (["probes", "minilm", "en", "--batch-size", "-1"], "--batch-size"),
        (["probes", "minilm", "en", "--top", "x"], "--top"),
        (["stats", "minilm", "c.txt", "--checkpoint-every-texts", "0"], "--checkpoint-every-texts"),
    ],
)
def test_a_count_below_one_is_refused_by_the_parser_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: argument {option}: a whole number ≥ 1, got "), line


@pytest.fixture
def no_model(monkeypatch, no_weights):
    """Describing the model (its config and tokenizer: seconds for a GGUF) fails the test too."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was described before the text was checked")

    monkeypatch.setattr("attnviz.workflows.capture.models.describe_model", refuse)
    monkeypatch.setattr("attnviz.models.describe_model", refuse)  # the public name the CLI's preflight reads


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["capture", "smollm2", "  "], "error: the text is empty or only whitespace; give at least one word"),
        (["generate", "smollm2", ""], "error: the prompt is empty or only whitespace; give at least one word"),
        (
            ["coref", "smollm2", "The cat sat. It slept.", "--pronoun", "she"],
            "error: --pronoun 'she' is not in the text 'The cat sat. It slept.': give a word of it",
        ),
        (
            ["coref", "smollm2", "The cat sat. It slept.", "--pronoun", "it", "--candidates", "Cat,dog"],
            "error: --candidates 'dog' is not in the text 'The cat sat. It slept.': give a word of it",
        ),
    ],
)
def test_a_text_that_cannot_serve_is_said_before_the_model_loads(argv, said, no_model, capsys):
    """An empty text took ~20 s on SmolLM2 (its GGUF tokenizer) before the refusal; a pronoun or a
    candidate missing from the text came after the weights and the forward."""
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == said


def test_statistics_part_and_generation_are_checked_against_the_model_before_its_weights(
    tmp_path, no_weights, no_corpus_weights, capsys
):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat.\n", encoding="utf-8")
    assert main(["stats", "minilm", str(corpus), "--statistics", "entropy,foo"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: --statistics: no statistic 'foo' to compute; choose from first, special"
    )
    assert main(["capture", "minilm", "The cat.", "--part", "cross", "--query", "cat"]) == 2  # printed, then refused
    assert one_error_line(capsys.readouterr().err) == (
        "error: --part cross reads an encoder-decoder's cross-attention; minilm has one stack: leave --part out"
    )
    assert main(["generate", "minilm", "The cat"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: minilm cannot generate text (it has no language-model head"
    )


def test_a_backend_the_model_cannot_run_is_named_not_the_model(capsys):
    """It said 'minilm' was not an embedded alias, in a list that named minilm."""
    assert main(["capture", "minilm", "The bank.", "--attn-implementation", "bogus"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line.startswith("error: 'minilm' cannot run with attn_implementation='bogus': ")
        and "not an embedded" not in line
    )


@pytest.mark.parametrize(
    ("argv", "ignored"),
    [
        (["export", "minilm", "The dog.", "--capture", "{cap}", "-o", "{out}"], "MODEL, TEXT"),
        (["export", "--capture", "{cap}", "-o", "{out}", "--layers", "3", "--dtype", "float16"], "--layers, --dtype"),
        (["validate", "--capture", "{cap}", "--layers", "3"], "--layers"),
        (["validate", "--capture", "{cap}", "--add-bos", "--max-length", "9"], "--max-length, --add-bos"),
    ],
)
def test_a_saved_capture_with_options_for_running_a_model_is_refused_not_ignored(argv, ignored, tmp_path, capsys):
    """--capture reads a file, so a model, a text or a loading option beside it would be dropped: refused
    before the file is read (it is not a capture at all here)."""
    cap = tmp_path / "c.attnviz"
    cap.write_bytes(b"not read")
    assert main([a.format(cap=cap, out=tmp_path / "x.html") for a in argv]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--capture reads a saved capture, so {ignored} would be ignored" in line, line
    assert not (tmp_path / "x.html").exists()


def test_export_writes_html_alone_and_says_so_for_another_suffix(tmp_path, capsys):
    cap = tmp_path / "c.attnviz"
    cap.write_bytes(b"not read")
    assert main(["export", "--capture", str(cap), "-o", str(tmp_path / "x.png")]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: attnviz export writes one HTML page: give an .html path for -o (got {str(tmp_path / 'x.png')!r})"
    )
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("option", ["--capture", "--stats", "--corpus"])
def test_the_app_refuses_a_missing_file_before_it_serves(option, tmp_path, monkeypatch, capsys):
    import attnviz.dashboard

    def serve(**kwargs):
        raise AssertionError("the server started with a missing file")

    monkeypatch.setattr(attnviz.dashboard, "run", serve)
    missing = str(tmp_path / "nothing.here")
    assert main(["app", option, missing, "--port", "8097"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: attnviz app {option}: no file {missing!r}; give the path of one (or leave {option} out)"
    )


@pytest.mark.parametrize("port", ["80970", "0", "http"])
def test_a_port_out_of_range_is_a_usage_error_not_a_traceback(port, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["app", "--port", port])
    assert stop.value.code == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: argument --port: a port is a whole number from 1 to 65535, got {port!r} (see attnviz app --help)"
    )


# ---------------------------------------------------------------- attnviz app --corpus, read as attnviz atlas reads it
NO_TEXT = 'the corpus has no text: give one text per line (.txt) or {"text": ...} per line (.jsonl)'


@pytest.fixture
def no_server(monkeypatch) -> list[dict]:
    """``attnviz.dashboard.run`` replaced: what the app command would serve, recorded (nothing served)."""
    import attnviz.dashboard

    served: list[dict] = []
    monkeypatch.setattr(attnviz.dashboard, "run", lambda **kwargs: served.append(kwargs))
    return served


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("empty.txt", b"", NO_TEXT),
        ("blank.txt", b"\n  \n\t\n", NO_TEXT),
        ("bad.jsonl", b"not json\n", "{path}:1 is not JSON (Expecting value)"),
        ("untitled.jsonl", b'{"title": "The cat sat."}\n', '{path}:1 has no "text" string'),
        ("late.jsonl", b'{"text": "The cat sat."}\n' * 3 + b"oops\n", "{path}:4 is not JSON"),  # the page reads it
        ("good.csv", b"The cat sat.\nIt slept.\n", "{path!r} is a .csv table"),
        ("latin1.txt", "Café au lait.\n".encode("latin-1"), "{path!r} is not UTF-8 text (invalid continuation byte)"),
    ],
)
def test_the_app_refuses_a_corpus_the_atlas_would_refuse_before_it_serves(
    name, content, said, tmp_path, no_server, capsys
):
    # each was served, the page saying "Could not open the corpus file" and the atlas reading the shipped sentences
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["app", "--corpus", str(path), "--port", "8097"]) == 2
    line = one_error_line(capsys.readouterr().err)
    said = said.replace("{path!r}", repr(str(path))).replace("{path}", str(path))
    assert line.startswith("error: attnviz app --corpus: " + said), line
    assert no_server == []


def test_the_app_serves_a_corpus_as_far_as_the_page_reads_it(tmp_path, no_server, capsys):
    from attnviz.dashboard import space_view

    from attnviz.cli.app_command import APP_CORPUS_TEXTS

    assert APP_CORPUS_TEXTS == space_view.CORPUS_TEXTS  # the check reads what the page reads, no more
    corpus = tmp_path / "long.jsonl"
    corpus.write_text('{"text": "The cat sat."}\n' * APP_CORPUS_TEXTS + "past what the page reads\n", encoding="utf-8")
    assert main(["app", "--corpus", str(corpus), "--port", "8097"]) == 0
    assert [kwargs["corpus_file"] for kwargs in no_server] == [str(corpus)]
    assert capsys.readouterr().err == ""
    assert len(space_view.read_corpus(str(corpus))) == APP_CORPUS_TEXTS  # and the page opens it


def test_app_help_says_the_corpus_goes_to_the_q_k_space_and_the_head_atlas():
    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["app"].format_help().split())
    assert "Q·K space view" in help_text and "the Head atlas" in help_text


# ---------------------------------------------------------------- comma-separated options and -o suffixes
def test_comma_separated_options_take_spaces_after_the_commas():
    parser = build_parser()
    atlas = parser.parse_args(["atlas", "minilm", "c.txt", "--roles", "previous_token, sink ,", "--layers", "0, 3"])
    assert atlas.roles == ["previous_token", "sink"]  # was refused: unknown role ' sink'
    assert atlas.layers == [0, 3]


def test_stats_statistics_take_spaces_and_an_empty_list_is_refused(tmp_path, no_corpus_weights, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat.\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="weights were loaded"):  # the names passed: the model would load
        main(["stats", "minilm", str(corpus), "--statistics", " entropy, previous ,"])
    assert main(["stats", "minilm", str(corpus), "--statistics", " , "]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --statistics takes comma-separated names (e.g. entropy,previous), got ' , '"
    )


def test_an_upper_case_out_suffix_is_that_format(tmp_path, monkeypatch, capsys):
    import pandas as pd

    from attnviz.workflows.corpus.corpus import read_table

    def atlas(model, corpus, **kwargs):
        df = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "roles": ["sink", ""], "texts": 1, "tokens": 4})
        df.attrs.update(texts=1, tokens=4, rank=0)
        return df

    monkeypatch.setattr("attnviz.workflows.corpus.atlas.head_atlas", atlas)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat.\n", encoding="utf-8")
    out = tmp_path / "atlas.CSV"
    assert main(["atlas", "minilm", str(corpus), "-o", str(out), "--quiet"]) == 0  # was: give a .csv … path
    assert capsys.readouterr().err.splitlines()[-1] == f"wrote {out}"
    assert list(read_table(out)["roles"].fillna("")) == ["sink", ""]  # written as CSV, and read back as CSV
    pages: list[str] = []
    monkeypatch.setattr("attnviz.figures.atlas_page", lambda df, path: pages.append(path))  # the CLI's public name
    page = str(tmp_path / "atlas.HTML")
    assert main(["atlas", "minilm", str(corpus), "-o", page, "--quiet"]) == 0
    assert pages == [page]  # a page, not a table's "cannot tell the format"
