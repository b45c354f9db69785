# `make test` and `make demo` work on a fresh clone: both create .venv and
# install everything (torch==2.13.0 first, so pip takes the local CPU wheel
# instead of pulling a multi-GB CUDA build).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ft-installed

.PHONY: setup etcd-server test lint demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,lightning,megatron,recipes,etcd,report,metrics]'
	touch $(STAMP)

# The etcd tests need a real etcd server (Debian's etcd-server, v3.4: it serves the v2 API).
# Installed when missing and we are root; without it those tests are skipped, setup does not fail.
etcd-server:
	@command -v etcd >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -q >/dev/null 2>&1 && apt-get install -y -q etcd-server >/dev/null 2>&1; } || \
	  echo "note: no etcd binary and it cannot be installed here: the etcd tests will be skipped" \
	       "(apt-get install -y etcd-server)"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint etcd-server
	$(PY) -m pytest -q -rs

demo: setup
	$(PY) examples/demo.py

bench: setup
	$(PY) benchmarks/ipc_overhead.py
	$(PY) benchmarks/detection_latency.py
	$(PY) benchmarks/false_kills.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
