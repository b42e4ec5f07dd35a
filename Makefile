# ckpt-trace: `make demo` runs the whole loop on the built-in workload (record, replay every strategy,
# emit the writer and time it against DCP's, report), `make test` the test suite.
# Both set everything up first; `make setup` alone is idempotent.

SYSTEM_PYTHON := $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

DEMO_DIR ?= $(CURDIR)/.scratch/demo
DEMO_TRACE ?= traces/demo-dcp.arrow
DEMO_RANKS ?= 4
# gpt2-small + Adam: 1.4 GiB from 4 ranks, 148 tensors and 3,279 writes per save; the loop runs in about
# two minutes on a 2-core VM (gpt2-medium: 4.3 GiB, about five).
DEMO_MODEL ?= gpt2-small
PYTEST_ARGS ?=

.PHONY: setup system venv demo lint test test-fast test-large test-engines bench clean

setup: system venv

system:
	@bash scripts/setup-system.sh

# --system-site-packages: bcc comes from Debian's python3-bpfcc, for Debian's own python3.
$(PY):
	$(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)

# The editable installs: the runtime's (runtime/pyproject.toml) compiles iolayer's io_uring loop
# (scripts/build_ring.py); the package's puts the stage folders on sys.path (a .pth file; ckpt_trace is a
# PEP 420 namespace over them) and depends on the runtime, satisfied by the first.
$(VENV)/.installed: pyproject.toml runtime/pyproject.toml scripts/build_ring.py iolayer/ckpt_trace/iolayer/ring_build.py iolayer/ckpt_trace/iolayer/_ring.c | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e ./runtime -e '.[torch,test,readers,lint]'
	touch $@

venv: $(VENV)/.installed

demo: setup
	$(PY) scripts/demo.py --dir $(DEMO_DIR) --trace $(DEMO_TRACE) --model $(DEMO_MODEL) --ranks $(DEMO_RANKS)

# The checks the project configures (pyproject.toml): ruff's rules, ruff's format and pyright on the package.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pyright

test: setup lint
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

# The fast lane: every test not marked slow (no recordings, no process trees, no big I/O).
test-fast: setup
	$(PY) -m pytest -q -rs -m "not slow" $(PYTEST_ARGS)

# The cases at the size an issue states, too big for every run (minutes each, gigabytes of disk).
test-large: setup
	CKPT_TRACE_LARGE=1 $(PY) -m pytest -q -rs -k "gpt2_medium" tests/test_rescale.py $(PYTEST_ARGS)

# The engine conformance suite (tests/engines): every engine recorded on both backends, compared with
# strace's (and perf's) own log, replayed under every strategy. Installs the engines first; minutes.
ENGINES_REPORT ?= $(CURDIR)/.scratch/engines.jsonl
test-engines: setup
	mkdir -p .scratch && printf 'torch==2.13.0\n' > .scratch/torch-pin.txt
	$(PY) -m pip install -q -c .scratch/torch-pin.txt -e '.[torch,test,readers,engines,engines-deepspeed]'
	mkdir -p $(dir $(ENGINES_REPORT)) && rm -f $(ENGINES_REPORT)
	CKPT_TRACE_ENGINES=1 CKPT_TRACE_ENGINES_REPORT=$(ENGINES_REPORT) $(PY) -m pytest -q -rs tests/engines $(PYTEST_ARGS)
	$(PY) scripts/engines_table.py $(ENGINES_REPORT)

bench: setup
	$(PY) benchmarks/tracer_overhead.py

clean:
	rm -rf .scratch .pytest_cache
