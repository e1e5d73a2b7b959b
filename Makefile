# Two commands for a fresh clone:  `make demo`  and  `make test`.
# Both create .venv on first use (torch==2.13.0 CPU build first, so pip never picks a CUDA build).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck unit bench bench-smoke pictures

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m wandb_modprof demo

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check wandb_modprof tests benchmarks tools examples
	$(VENV)/bin/ruff format --check wandb_modprof tests benchmarks tools examples

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

unit: $(VENV)/.installed
	$(PY) -m pytest -q

bench-smoke: $(VENV)/.installed
	$(PY) benchmarks/overhead.py --quick
	$(PY) benchmarks/structure.py --quick
	$(PY) benchmarks/layout.py --quick

test: lint typecheck unit bench-smoke

bench: $(VENV)/.installed
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/structure.py
	$(PY) benchmarks/layout.py

pictures: $(VENV)/.installed
	$(PY) tools/render_layout.py --out docs/images
