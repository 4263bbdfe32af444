"""What ``attnviz stats``, ``attnviz atlas`` and ``attnviz probes`` share (``attnviz.cli.runs``): ``-o``
refused by its suffixes before anything runs, each warning on one line, the report on the process of rank 0
only, a signal's stop (``Interrupted``) as one line and exit status 75 — and ``attnviz probes`` through it,
its run replaced by one that warns, stops or ends, so no model loads."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pandas as pd
import pytest

from attnviz.cli import EXIT_INTERRUPTED, main
from attnviz.cli.runs import in_processes, run_corpus_command
from attnviz.errors import InputError, Interrupted


def _table(rank: int) -> pd.DataFrame:
    df = pd.DataFrame({"head": [0, 1]})
    df.attrs["rank"] = rank
    return df


def test_an_out_path_of_another_suffix_is_refused_naming_them_in_order_before_the_run(tmp_path):
    ran = []
    args = SimpleNamespace(out=str(tmp_path / "t.xlsx"))
    with pytest.raises(InputError) as err:
        run_corpus_command(args, (".csv", ".parquet", ".html"), lambda: ran.append(1), print)
    assert str(err.value) == f"-o/--out {str(tmp_path / 't.xlsx')!r}: give a .csv, .parquet or .html path"
    with pytest.raises(InputError, match=r"give a \.parquet or \.csv path$"):
        run_corpus_command(args, (".parquet", ".csv"), lambda: ran.append(1), print)
    with pytest.raises(InputError, match="does not exist"):
        run_corpus_command(SimpleNamespace(out=str(tmp_path / "no" / "t.csv")), (".csv",), lambda: ran.append(1), print)
    assert ran == []


@pytest.mark.parametrize("rank", [0, 1])
def test_the_report_is_the_first_processes_only_and_each_warning_one_line(rank, capsys):
    reported = []

    def run():
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
        return _table(rank)

    assert in_processes(run, reported.append, rank=lambda df: df.attrs["rank"]) == 0
    assert len(reported) == (1 if rank == 0 else 0)
    assert capsys.readouterr().err == "warning: a library's warning\n"


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stop_by_a_signal_is_one_line_on_the_first_process_and_exit_75(rank, capsys):
    def run():
        raise Interrupted("stopped by SIGTERM: 3 texts saved in 'c.ckpt'; run it with --resume", rank=rank)

    assert in_processes(run, pytest.fail, rank=lambda df: 0) == EXIT_INTERRUPTED == 75
    err = capsys.readouterr().err
    assert err == ("error: stopped by SIGTERM: 3 texts saved in 'c.ckpt'; run it with --resume\n" if rank == 0 else "")


def test_another_error_leaves_the_run_as_itself():
    def run():
        raise InputError("no corpus file 'c.txt'")

    with pytest.raises(InputError, match="no corpus file"):
        in_processes(run, pytest.fail, rank=lambda df: 0)


class _Result:
    accuracy = pd.DataFrame({"layer": [0], "head": [0], "accuracy": [1.0]})

    def __str__(self) -> str:
        return "2 probes on m"

    def ranked(self) -> pd.DataFrame:
        return self.accuracy

    def picks_table(self, top: int) -> pd.DataFrame:
        return pd.DataFrame({"text": ["a"], "top": [top]})


@pytest.fixture
def probes_run(monkeypatch):
    """``attnviz probes``' reading and run replaced: ``outcome`` says what the run does."""
    outcome = {"raise": None}
    monkeypatch.setattr("attnviz.analysis.load_probes", lambda *a, **k: ["probe"])  # the public names the CLI reads

    def evaluate(model, probes, **kwargs):
        outcome["kwargs"] = kwargs
        warnings.warn("a tokenizer's warning", UserWarning, stacklevel=1)
        if outcome["raise"] is not None:
            raise outcome["raise"]
        return _Result()

    monkeypatch.setattr("attnviz.evaluate_probes", evaluate)
    return outcome


def test_attnviz_probes_reports_after_its_run_with_the_warning_on_one_line(probes_run, tmp_path, capsys):
    acc, per_probe = tmp_path / "acc.csv", tmp_path / "picks.csv"
    assert main(["probes", "m", "en", "--top", "2", "-o", str(acc), "--per-probe", str(per_probe)]) == 0
    out, err = capsys.readouterr()
    assert err == "warning: a tokenizer's warning\n"
    assert out.startswith("2 probes on m\n") and f"per-head accuracy written to {acc}" in out
    assert pd.read_csv(acc).accuracy.tolist() == [1.0] and pd.read_csv(per_probe).top.tolist() == [2]


def test_attnviz_probes_prepends_no_bos_unless_told_as_the_library_and_quiet_hides_its_bar(probes_run, capsys):
    """``attnviz probes`` follows ``evaluate_probes``' ``add_bos=False`` (it prepended one until --no-bos);
    --no-bos, kept one release, says so on one line and changes nothing."""
    seen = []
    for extra in ([], ["--add-bos"], ["--no-bos"], ["--quiet"]):
        assert main(["probes", "m", "en", *extra]) == 0
        seen.append((probes_run["kwargs"]["add_bos"], probes_run["kwargs"]["progress"]))
    assert seen == [(False, True), (True, True), (False, True), (False, False)]
    deprecation = "warning: --no-bos is deprecated and will be removed in the next release; it does nothing"
    assert capsys.readouterr().err.count(deprecation) == 1


def test_attnviz_probes_stopped_by_a_signal_exits_75_with_one_line(probes_run, capsys):
    probes_run["raise"] = Interrupted("stopped by SIGINT: 5 probes saved in 'p.ckpt'", rank=0)
    assert main(["probes", "m", "en", "--checkpoint", "p.ckpt"]) == EXIT_INTERRUPTED
    out, err = capsys.readouterr()
    assert out == "" and err == "warning: a tokenizer's warning\nerror: stopped by SIGINT: 5 probes saved in 'p.ckpt'\n"


def test_quiet_leaves_out_a_gguf_files_conversion_bar_while_the_command_runs(monkeypatch):
    """--quiet disabled transformers' bars, but SmolLM2's "Converting and de-quantizing GGUF tensors" bar
    is tqdm's own, drawn by transformers directly: it stayed. Both come back after the command (an
    in-process ``main`` left them off for the rest of the process)."""
    import tqdm.auto
    from transformers import modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging as transformers_logging

    from attnviz.cli.runs import quiet_loading

    monkeypatch.setattr(gguf_loading, "tqdm", tqdm.auto.tqdm)  # as transformers has it; put back after the test
    before = transformers_logging.is_progress_bar_enabled()
    with quiet_loading():
        assert gguf_loading.tqdm(range(2)).disable and not transformers_logging.is_progress_bar_enabled()
    assert gguf_loading.tqdm is tqdm.auto.tqdm and transformers_logging.is_progress_bar_enabled() == before
