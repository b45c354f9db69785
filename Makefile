# `make test` and `make demo` work on a fresh clone: both create .venv and
# install everything (torch==2.13.0 first, so pip takes the local CPU wheel
# instead of pulling a multi-GB CUDA build).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ft-installed

.PHONY: setup test lint demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,lightning,megatron,recipes,report]'
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q -rs

demo: setup
	$(PY) examples/demo.py

bench: setup
	$(PY) benchmarks/ipc_overhead.py
	$(PY) benchmarks/detection_latency.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
