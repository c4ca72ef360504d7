# make test: create .venv if absent, install pinned deps (torch first), run the tests.
# make demo: the quickstart on real weights (see README).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo install clean-venv gpu-check

$(STAMP): requirements.txt requirements-lock.txt pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q -r requirements-lock.txt -c requirements.txt
	$(BIN)/pip install -q --no-deps -e ".[dev,demo]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -x --durations=15 tests

# DEMO_ARGS passes options through, e.g. make demo DEMO_ARGS="--cache-dir /data/graft"
demo: $(STAMP)
	$(BIN)/python -m graft.quickstart $(DEMO_ARGS)

clean-venv:
	rm -rf $(VENV)

# make gpu-check: on a CUDA machine, Triton kernels + engine parity on the GPU, then the kernel
# and engine benchmarks (JSON in out/gpu). Uses $(PY) as is: no venv, no installs.
gpu-check:
	PY=$(PY) bash tests/gpu/run_checks.sh
