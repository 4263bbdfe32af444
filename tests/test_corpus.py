"""Head statistics over a corpus: lazy reading, length batching, the same numbers as head_stats,
and the same numbers again when torchrun spreads the work over two processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz.analysis import corpus_stats, head_stats
from attnviz.cli import main
from attnviz.workflows.capture.models import IdsTokenizer
from attnviz.workflows.corpus.corpus import MAX_PADDING, POOL, length_batches, read_texts


def _texts(count: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (count,), generator=g).tolist()
    return [" ".join(str(i) for i in torch.randint(3, 120, (n,), generator=g).tolist()) for n in lengths]


def test_corpus_stats_equal_head_stats_over_the_same_texts():
    model = attnviz.testing.tiny_model("llama")
    tok = IdsTokenizer()
    texts = _texts(23)
    df = corpus_stats(model, iter(texts), tok, batch_size=4, progress=False)
    expected = head_stats([attnviz.capture(model, t, tok) for t in texts])
    columns = [c for c in expected.columns if c not in ("layer", "head")]
    pd.testing.assert_frame_equal(df[["layer", "head"]], expected[["layer", "head"]])
    diff = (df[columns] - expected[columns]).abs().max().max()
    assert diff <= 1e-6, diff
    lengths = [len(t.split()) for t in texts]
    assert set(df["texts"]) == {23} and set(df["tokens"]) == {sum(lengths)}
    assert df.attrs["per_process"] == [23] and 0 <= df.attrs["padding"] <= MAX_PADDING


# Texts of very different lengths in one padded batch (corpus_stats batches by length, so only a
# BatchReducer called directly pads this much): the padded query rows must count nothing and the
# padded keys get no weight, in every family the batch path reads — GQA (llama), learned sinks and a
# sliding window (gpt_oss), ALiBi through projection hooks (bloom), eager weights and a real
# tokenizer's special and punctuation tokens (bert).
_UNEVEN = [
    "5 6",
    " ".join(str(3 + i % 7) for i in range(45)),
    "9 9 9 10 9 10",
    " ".join(str(20 + i) for i in range(23)),
]


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("llama", {"num_key_value_heads": 2}), ("gpt_oss", {}), ("bloom", {}), ("bert", {})],
)
@pytest.mark.parametrize("budget", [None, 300], ids=["whole", "chunked"])
def test_a_padded_batch_reduced_at_once_equals_its_texts_one_by_one(family, overrides, budget, bert_tokenizer):
    from attnviz.analysis.layer_reduction import BUDGET
    from attnviz.workflows.corpus.batched import BatchReducer

    if family == "bert":
        model = attnviz.testing.tiny_model("bert", attn_implementation="eager", vocab_size=bert_tokenizer.vocab_size)
        tok = bert_tokenizer
        texts = ["Hi.", "The cat sat on the mat, and the dog sat on the cat's mat too; then it slept!", "Dogs bark."]
    else:
        model, tok, texts = attnviz.testing.tiny_model(family, **overrides), IdsTokenizer(), _UNEVEN
    reducer = BatchReducer(model, tok, budget=budget or BUDGET)
    sums, lengths = reducer.add(None, texts)
    assert lengths == [len(tok(t)["input_ids"]) for t in texts] and len(set(lengths)) == len(texts)
    batched = sums.frame()
    expected = head_stats([attnviz.capture(model, t, tok) for t in texts])
    pd.testing.assert_frame_equal(batched[["layer", "head"]], expected[["layer", "head"]])
    columns = [c for c in expected.columns if c not in ("layer", "head")]
    diff = (batched[columns] - expected[columns]).abs().max().max()
    assert diff <= 1e-6, (family, diff)
    assert sums.texts == len(texts) and sums.tokens == sum(lengths)


def test_padded_keys_get_no_weight_even_where_the_kernel_had_no_mask():
    """A kernel called without a mask (each text computed alone, so nothing to pad) still gets
    padded keys blocked in the batch's recomputation: the batch equals its texts reduced one by one,
    and the check passes."""
    from attnviz.analysis.batch_texts import COLUMNS, BatchTexts
    from attnviz.analysis.layer_reduction import reduce_layer
    from attnviz.attention import scaled_dot_product
    from attnviz.engine.taps import AttentionCall

    g = torch.Generator().manual_seed(0)
    lengths, n, heads, d = [3, 11, 7], 11, 2, 4
    q, k, v = (torch.randn(len(lengths), heads, n, d, generator=g) for _ in range(3))
    out = torch.zeros(len(lengths), n, heads, d)
    for b, m in enumerate(lengths):
        out[b, :m] = scaled_dot_product(q[b : b + 1, :, :m], k[b : b + 1, :, :m], v[b : b + 1, :, :m])[0][0].transpose(
            0, 1
        )
    texts = ["a " * m for m in lengths]
    encoded = [([3 + i % 4 for i in range(m)], [(2 * i, 2 * i + 1) for i in range(m)], ["a"] * m) for m in lengths]

    def call(q, k, v, out):
        return AttentionCall("attn", "encoder", 0, d**-0.5, False, None, None, "test", q=q, k=k, v=v, out=out)

    norms = torch.rand(len(lengths), heads, n, generator=g) + 0.1  # the padded keys' too: they must move nothing
    batched, errors = reduce_layer(call(q, k, v, out), BatchTexts(encoded, texts, detectors=True), norms=norms)
    singles = sum(
        reduce_layer(
            call(q[b : b + 1, :, :m], k[b : b + 1, :, :m], v[b : b + 1, :, :m], out[b : b + 1, :m]),
            BatchTexts([encoded[b]], [texts[b]], detectors=True),
            norms=norms[b : b + 1, :, :m],
        )[0]
        for b, m in enumerate(lengths)
    )
    assert batched.shape == (2 * len(COLUMNS), heads) and bool(batched[len(COLUMNS) :].abs().sum() > 0)
    # sums over 21 rows: the batch's softmax (11 keys, the padded ones blocked) and each text's own
    # differ in the last bits of a float32 weight, ~1e-6 once the distance sums 58 tokens' worth
    assert torch.allclose(batched, singles, atol=1e-6, rtol=1e-6), (batched - singles).abs().max()
    err, scale = errors["output"]
    assert bool((err <= 1e-5 + 1.3e-6 * scale).all()), err.max()


# llama's weights come from reduce_layer's own GEMM and softmax (entropy without a log per weight),
# gpt_oss's sinks and bloom's ALiBi from scaled_dot_product: a wrong scale must fail both.
@pytest.mark.parametrize("family", ["llama", "gpt_oss", "bloom"])
def test_a_recomputation_that_misses_the_kernel_raises_validation_error(monkeypatch, family):
    from attnviz.workflows.corpus import batched

    model, tok = attnviz.testing.tiny_model(family), IdsTokenizer()
    original = batched.reduce_layer

    def off_scale(call, *args):
        call.scaling *= 1.01
        return original(call, *args)

    monkeypatch.setattr(batched, "reduce_layer", off_scale)
    with pytest.raises(attnviz.ValidationError, match="could not reproduce") as caught:
        corpus_stats(model, _UNEVEN, tok, progress=False)
    assert not caught.value.report.passed and caught.value.capture is not None


def test_entropy_read_at_each_rows_own_key_or_from_the_log_when_that_key_weighs_nothing(monkeypatch):
    """reduce_layer reads a row's entropy as Σ a (lse - s) with lse taken at the row's own key; a
    real row whose own key weighs ~0 (here e^-400: its log unreadable) sends the layer to
    -Σ a log a. Both equal the entropy of the weights scaled_dot_product computes."""
    from attnviz.analysis import batch_texts, layer_reduction
    from attnviz.attention import scaled_dot_product
    from attnviz.engine.taps import AttentionCall

    logs = []
    row_entropy = layer_reduction._row_entropy
    monkeypatch.setattr(layer_reduction, "_row_entropy", lambda *a: logs.append(1) or row_entropy(*a))
    lengths, n, heads, d = [5, 9], 9, 2, 4
    texts = ["a " * m for m in lengths]
    encoded = [([3 + i % 4 for i in range(m)], [(2 * i, 2 * i + 1) for i in range(m)], ["a"] * m) for m in lengths]
    for far in (False, True):
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(len(lengths), heads, n, d, generator=g) for _ in range(3))
        if far:  # text 1, head 0, row 3: its own score ~ -400 below the others
            k[1, 0, 3] = -q[1, 0, 3] * 400 / q[1, 0, 3].square().sum() / d**-0.5
        out = torch.zeros(len(lengths), n, heads, d)
        expected = torch.zeros(heads, dtype=torch.float64)
        for b, m in enumerate(lengths):
            o, a = scaled_dot_product(q[b : b + 1, :, :m], k[b : b + 1, :, :m], v[b : b + 1, :, :m])
            out[b, :m] = o[0].transpose(0, 1)
            expected -= torch.special.xlogy(a, a).double().sum((0, 2, 3))
        call = AttentionCall("attn", "encoder", 0, d**-0.5, False, None, None, "test", q=q, k=k, v=v, out=out)
        logs.clear()
        sums, _ = layer_reduction.reduce_layer(call, batch_texts.BatchTexts(encoded, texts, detectors=True))
        assert len(logs) == far  # the log only where a row's own key weighs nothing
        got = sums[batch_texts.COLUMNS.index("entropy")]
        assert torch.allclose(got, expected, atol=1e-5, rtol=0), (far, got - expected)


def test_the_forward_stops_once_the_last_wanted_layer_is_reduced(monkeypatch):
    """After the last wanted layer's attention nothing the model computes feeds a statistic: the
    forward stops there (the final norm never runs; with layers=[0], nor layer 1) and the numbers
    are those of head_stats. A model with forward hooks (accelerate's offloading) runs whole."""
    model, tok = attnviz.testing.tiny_model("llama"), IdsTokenizer()
    texts = _texts(9, seed=4)
    ran: list[str] = []
    for name, module in [("norm", model.model.norm), ("layer 1", model.model.layers[1])]:
        forward = module.forward
        monkeypatch.setattr(module, "forward", lambda *a, _f=forward, _n=name, **kw: ran.append(_n) or _f(*a, **kw))
    expected = head_stats([attnviz.capture(model, t, tok) for t in texts])
    columns = [c for c in expected.columns if c not in ("layer", "head")]
    ran.clear()
    df = corpus_stats(model, texts, tok, batch_size=4, progress=False)
    assert "norm" not in ran and "layer 1" in ran
    assert (df[columns] - expected[columns]).abs().max().max() <= 1e-6
    ran.clear()
    first = corpus_stats(model, texts, tok, batch_size=4, layers=[0], progress=False)
    assert ran == [] and list(first["layer"].unique()) == [0]
    first_expected = expected[expected["layer"] == 0].reset_index(drop=True)
    assert (first[columns] - first_expected[columns]).abs().max().max() <= 1e-6
    handle = model.model.layers[1].register_forward_hook(lambda *a: None)
    try:
        ran.clear()
        whole = corpus_stats(model, texts, tok, batch_size=4, progress=False)
    finally:
        handle.remove()
    assert ran.count("norm") == ran.count("layer 1") >= 3  # once per batch: 9 texts, batches of ≤ 4
    assert (whole[columns] - df[columns]).abs().max().max() <= 1e-12


def test_texts_are_read_lazily(monkeypatch):
    """The corpus is never in memory: when the first batch is captured, at most one pool of texts
    has been read from the generator."""
    from attnviz.workflows.corpus.batched import BatchReducer

    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    read = []

    def texts():
        for i, text in enumerate(_texts(POOL * 2 * 2 + 5)):
            read.append(i)
            yield text

    seen_at_first_capture = []
    original = BatchReducer.add

    def spy(*args, **kwargs):
        seen_at_first_capture.append(len(read))
        return original(*args, **kwargs)

    monkeypatch.setattr(BatchReducer, "add", spy)
    df = corpus_stats(model, texts(), tok, batch_size=2, progress=False)
    assert seen_at_first_capture[0] == POOL * 2 and len(read) == POOL * 2 * 2 + 5
    assert set(df["texts"]) == {POOL * 4 + 5}


def test_length_batches_hold_every_text_once_with_little_padding():
    texts = _texts(300, seed=3)
    pools = list(length_batches(iter(texts), lambda t: len(t.split()), 8, pool=8))
    batches = [b for pool in pools for b in pool]
    assert sorted(t for b in batches for t, _ in b) == sorted(texts)
    for b in batches:
        lengths = [n for _, n in b]
        assert len(b) <= 8 and 1 - sum(lengths) / (max(lengths) * len(b)) <= MAX_PADDING


def test_read_texts_from_files_and_bad_lines(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_text("one text\n\n  \ntwo texts here\n", encoding="utf-8")
    assert list(read_texts(txt)) == ["one text", "two texts here"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"text": "小猫很可爱"}) + "\n" + json.dumps({"text": "b"}) + "\n", encoding="utf-8")
    assert list(read_texts(jsonl)) == ["小猫很可爱", "b"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\n{"txt": "b"}\n', encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"broken.jsonl:2 has no \"text\""):
        list(read_texts(broken))
    broken.write_text('{"text": "a"}\nnot json\n', encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"broken.jsonl:2 is not JSON"):
        list(read_texts(broken))
    with pytest.raises(attnviz.InputError, match="no corpus file"):
        list(read_texts(tmp_path / "missing.txt"))
    latin = tmp_path / "latin.txt"  # a UnicodeDecodeError's traceback from attnviz atlas / stats before
    latin.write_bytes("Café au lait.\n".encode("latin-1"))
    with pytest.raises(attnviz.InputError, match=r"latin.txt' is not UTF-8 text \(invalid continuation byte\)"):
        list(read_texts(latin))
    upper = tmp_path / "C.JSONL"  # its lines were read as texts, each a JSON string
    upper.write_text(json.dumps({"text": "a"}) + "\n", encoding="utf-8")
    assert list(read_texts(upper)) == ["a"]
    table = tmp_path / "corpus.csv"  # read line by line, its header "text,label" and "hello,1" were two texts
    table.write_text("text,label\nhello,1\n", encoding="utf-8")
    with pytest.raises(attnviz.InputError, match=r"is a \.csv table: a corpus is a \.txt .* pandas\.read_csv"):
        list(read_texts(table))
    with pytest.raises(attnviz.ArgumentTypeError, match="item 1"):
        list(read_texts(["a", 3]))
    with pytest.raises(attnviz.InputError, match="no text"):
        corpus_stats(attnviz.testing.tiny_model("gpt2"), [], IdsTokenizer(), progress=False)
    with pytest.raises(attnviz.InputError, match="batch_size"):
        corpus_stats(attnviz.testing.tiny_model("gpt2"), ["1 2"], IdsTokenizer(), batch_size=0)


def test_device_map_auto_loads_through_accelerate_and_gives_the_same_numbers(tmp_path, bert_tokenizer):
    folder = tmp_path / "bert"
    model = attnviz.testing.tiny_model("bert", vocab_size=bert_tokenizer.vocab_size)
    model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    texts = ["The cat sat on the mat.", "It was tired, so it slept.", "Dogs bark."]
    mapped = corpus_stats(str(folder), texts, device_map="auto", progress=False)
    plain = corpus_stats(str(folder), texts, progress=False)
    columns = [c for c in plain.columns if c not in ("layer", "head")]
    assert (mapped[columns] - plain[columns]).abs().max().max() <= 1e-6
    # layer 1 offloaded to disk: accelerate's hooks load its weights for each forward
    on_disk = {"embeddings": "cpu", "encoder.layer.0": "cpu", "encoder.layer.1": "disk", "pooler": "cpu"}
    offloaded = corpus_stats(
        str(folder), texts, device_map=on_disk, offload_folder=tmp_path / "offload", progress=False
    )
    assert (offloaded[columns] - plain[columns]).abs().max().max() <= 1e-6
    from transformers import AutoModel

    dispatched = AutoModel.from_pretrained(folder, device_map=on_disk, offload_folder=tmp_path / "offload2").eval()
    assert dispatched.encoder.layer[1].attention.self.query.weight.device.type == "meta"  # really on disk
    again = corpus_stats(dispatched, texts, bert_tokenizer, progress=False)
    assert (again[columns] - plain[columns]).abs().max().max() <= 1e-6


def test_cli_stats_writes_csv_and_parquet_and_refuses_bad_paths(tmp_path, capsys, bert_tokenizer):
    folder = tmp_path / "bert"
    attnviz.testing.tiny_model("bert", vocab_size=bert_tokenizer.vocab_size).save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nIt was tired.\n", encoding="utf-8")
    assert main(["stats", str(folder), str(corpus), "--out", str(tmp_path / "s.csv"), "--quiet"]) == 0
    assert "2 texts" in capsys.readouterr().err
    csv = pd.read_csv(tmp_path / "s.csv")
    assert len(csv) == 2 * 4 and {"first", "entropy", "induction", "texts", "tokens"} <= set(csv.columns)
    assert main(["stats", str(folder), str(corpus), "--out", str(tmp_path / "s.parquet"), "--quiet"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "s.parquet"), csv, check_dtype=False)
    assert main(["stats", str(folder), str(corpus), "--out", str(tmp_path / "s.xlsx")]) == 2
    assert ".parquet or .csv" in capsys.readouterr().err
    assert main(["stats", str(folder), str(tmp_path / "none.txt"), "--quiet"]) == 2
    assert "no corpus file" in capsys.readouterr().err
    # --statistics: those columns alone, as the whole table has them; the others and every *_moved NaN
    lean = tmp_path / "lean.csv"
    assert (
        main(["stats", str(folder), str(corpus), "--out", str(lean), "--statistics", "entropy, previous", "--quiet"])
        == 0
    )
    assert "wrote" in capsys.readouterr().err
    lean_csv = pd.read_csv(lean)
    np.testing.assert_allclose(lean_csv[["entropy", "previous"]], csv[["entropy", "previous"]], rtol=1e-6, atol=1e-9)
    from attnviz.analysis.batch_texts import STATISTIC_COLUMNS

    asked = {STATISTIC_COLUMNS["entropy"], STATISTIC_COLUMNS["previous"]}  # previous_token reads previous' sum
    others = [c for c in csv.columns if c in STATISTIC_COLUMNS and STATISTIC_COLUMNS[c] not in asked]
    assert [c for c in csv.columns if c in STATISTIC_COLUMNS and c not in others] == [
        "previous",
        "entropy",
        "previous_token",
    ]
    assert "first" in others and "first_moved" in others and lean_csv[others].isna().all().all()
    assert main(["stats", str(folder), str(corpus), "--statistics", "entropy,colour", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no statistic 'colour' to compute; choose from first, special" in err
    checkpoint = ["--checkpoint", str(tmp_path / "c.ckpt")]
    assert main(["stats", str(folder), str(corpus), "--statistics", "entropy", *checkpoint, "--quiet"]) == 2
    assert "(--statistics)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def minilm_corpus(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """50 short English texts and MiniLM's one-process table over them (``attnviz stats``)."""
    folder = tmp_path_factory.mktemp("corpus")
    corpus = folder / "c.jsonl"
    words = "the cat sat on a mat because it was tired and the dog ran to the park".split()
    g = torch.Generator().manual_seed(0)
    with corpus.open("w", encoding="utf-8") as f:
        for _ in range(50):
            n = int(torch.randint(3, 25, (1,), generator=g))
            picks = torch.randint(0, len(words), (n,), generator=g).tolist()
            f.write(json.dumps({"text": " ".join(words[i] for i in picks) + "."}) + "\n")
    _attnviz(["stats", "minilm", str(corpus), "--quiet", "--out", str(folder / "one.csv")])
    return corpus, pd.read_csv(folder / "one.csv")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_processes_give_the_one_process_numbers(launcher, minilm_corpus, tmp_path):
    """``torchrun --standalone --nproc_per_node 2`` and ``accelerate launch --multi_gpu
    --num_processes 2`` each start two gloo processes on this CPU machine; each captures its share
    (counted per process) and the reduced table equals the one-process table within 1e-6."""
    corpus, one = minilm_corpus
    two = _attnviz(["stats", "minilm", str(corpus), "--quiet", "--out", str(tmp_path / "two.csv")], 2, launcher)
    shares = [line for line in two.stderr.splitlines() if "texts per process" in line]
    assert len(shares) == 1  # printed by the main process only
    per_process = [int(x) for x in shares[0].split("texts per process: ")[1].split(";")[0].split(" + ")]
    assert len(per_process) == 2 and all(n > 0 for n in per_process) and sum(per_process) == 50
    assert (one - pd.read_csv(tmp_path / "two.csv")).abs().max().max() <= 1e-6


def test_an_interrupted_run_resumes_from_its_checkpoint_without_counting_a_text_twice(tmp_path):
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()
    texts = _texts(POOL * 2 * 3 + 7, seed=5)  # three whole pools of batch_size 2, and a bit
    whole = corpus_stats(model, texts, tok, batch_size=2, progress=False)
    checkpoint = tmp_path / "run.ckpt"

    def interrupted():
        for i, text in enumerate(texts):
            if i == POOL * 2 * 2 + 3:  # inside the third pool: two pools are in the checkpoint
                raise KeyboardInterrupt
            yield text

    with pytest.raises(KeyboardInterrupt):  # a crash, not a signal: the last periodic checkpoint is kept
        corpus_stats(
            model, interrupted(), tok, batch_size=2, checkpoint=checkpoint, checkpoint_every_texts=100, progress=False
        )
    resumed = corpus_stats(model, texts, tok, batch_size=2, checkpoint=checkpoint, resume=True, progress=False)
    # saved once 100 more texts were added (batches of at most 2 texts: 100 or 101), inside pools 1 and 2
    assert 200 <= resumed.attrs["resumed_after"] <= 202
    pd.testing.assert_frame_equal(resumed, whole, atol=1e-9, rtol=0)
    with pytest.raises(attnviz.InputError, match="batch_size=2"):
        corpus_stats(model, texts, tok, batch_size=4, checkpoint=checkpoint, resume=True, progress=False)


def test_texts_over_the_limit_are_cut_and_counted_or_refused():
    model, tok = attnviz.testing.tiny_model("gpt2"), IdsTokenizer()  # 64 positions
    texts = ["5 6 7 8", " ".join(["9"] * 100), "10 11 12"]
    df = corpus_stats(model, texts, tok, progress=False)
    assert df.attrs["truncated"] == 1 and set(df["tokens"]) == {4 + 64 + 3}
    with pytest.raises(attnviz.InputTooLongError, match="text 2 of the corpus has 100 tokens"):
        corpus_stats(model, texts, tok, truncate=False, progress=False)


@pytest.mark.slow
def test_probe_sets_spread_over_two_processes_score_as_one(tmp_path):
    probes = ["probes", "minilm", "en", "--csv"]
    _attnviz(probes + [str(tmp_path / "one.csv")])
    two = _attnviz(probes + [str(tmp_path / "two.csv")], processes=2)
    assert two.stdout.count("per-head accuracy written") == 1  # the main process reports
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "one.csv"), pd.read_csv(tmp_path / "two.csv"))


def _attnviz(arguments: list[str], processes: int = 1, launcher: str = "torchrun") -> subprocess.CompletedProcess:
    """``python -m attnviz …``, or with several processes under ``torchrun --standalone`` or
    ``accelerate launch --multi_gpu`` (on a CPU machine too: it starts them through torchrun's
    launcher; plain ``--num_processes N`` or ``--cpu`` would start one process, wanting MPI)."""
    bin_dir = Path(sys.executable).parent
    if processes == 1:
        command = [sys.executable]
    elif launcher == "torchrun":
        command = [str(bin_dir / "torchrun"), "--standalone", "--nproc_per_node", str(processes)]
    else:
        with socket.socket() as s:  # a free port: other test runs may hold accelerate's default one
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [str(bin_dir / "accelerate"), "launch", "--multi_gpu", "--num_processes", str(processes)]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["--main_process_port", str(port)]
    command += ["-m", "attnviz", *arguments]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done
