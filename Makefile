# ckpt-trace: `make demo` runs the main job on the built-in workload, `make test` the test suite.
# Both set everything up first; `make setup` alone is idempotent.

SYSTEM_PYTHON := $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

DEMO_DIR ?= $(CURDIR)/.scratch/demo
DEMO_TRACE ?= traces/demo-dcp.arrow
DEMO_RANKS ?= 4
DEMO_MODEL ?= gpt2-medium
PYTEST_ARGS ?=

.PHONY: setup system venv demo test test-fast bench clean

setup: system venv

system:
	@bash scripts/setup-system.sh

# --system-site-packages: bcc comes from Debian's python3-bpfcc, for Debian's own python3.
$(PY):
	$(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)

# The editable install compiles iolayer's io_uring loop (scripts/build_ring.py) and puts the
# stage folders on sys.path (a .pth file; ckpt_trace is a PEP 420 namespace over them).
$(VENV)/.installed: pyproject.toml scripts/build_ring.py iolayer/ckpt_trace/iolayer/_ring.c | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[torch,test]'
	touch $@

venv: $(VENV)/.installed

demo: setup
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR) traces
	ckpt-trace record --force -o $(DEMO_TRACE) --path-filter $(DEMO_DIR)/ckpt/ -- \
		ckpt-trace workload dcp --out $(DEMO_DIR)/ckpt --ranks $(DEMO_RANKS) --model $(DEMO_MODEL) --with-optimizer
	ckpt-trace summary $(DEMO_TRACE)
	ckpt-trace replay $(DEMO_TRACE) --strategy posix --target $(DEMO_DIR)/replay -o $(DEMO_DIR)/replay.json
	rm -rf $(DEMO_DIR)/ckpt $(DEMO_DIR)/replay
	@echo "trace: $(DEMO_TRACE)   results: $(DEMO_DIR)/replay.json"

test: setup
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

# The fast lane: every test not marked slow (no recordings, no process trees, no big I/O).
test-fast: setup
	$(PY) -m pytest -q -rs -m "not slow" $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/tracer_overhead.py

clean:
	rm -rf .scratch .pytest_cache
