# `make test` and `make bench` work on a fresh machine with only Python 3.11 and pip.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; any other torch request pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
TRITON_PIN ?= triton==3.9.0

.PHONY: venv test lint typecheck pytest bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)" "$(TRITON_PIN)"
	$(PY) -m pip install -q -e ".[test,xgrammar]" "$(TORCH_PIN)" "$(TRITON_PIN)"
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check graphsafe_sampler kernels tests perf
	$(VENV)/bin/ruff format --check graphsafe_sampler kernels tests perf

typecheck: venv
	$(VENV)/bin/mypy graphsafe_sampler kernels

# One pytest-xdist worker per logical CPU (tests/conftest.py gives each one thread; "auto"
# would count physical cores where psutil is installed: 1 on a 2-vCPU machine); worksteal,
# since a few compile-heavy tests take a minute and most take milliseconds.
PYTEST_WORKERS ?= logical
pytest: venv
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

test: lint typecheck pytest

# The decode benchmark with its defaults (see `graphsafe-sampler bench --help`); extra
# options through BENCH_ARGS, e.g. make bench BENCH_ARGS="--rows 8 64 --plot bench.png".
BENCH_ARGS ?=
bench: venv
	$(VENV)/bin/graphsafe-sampler bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
