# `make demo` and `make test` do all of the set-up: they create .venv with
# Python 3.11 and install the package (with the test extra for `make test`).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEPS := setup.cfg pyproject.toml

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-demo: $(BIN)/python $(DEPS)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python $(DEPS)
	$(BIN)/python -m pip install --quiet -e ".[test,notebooks]"
	touch $@

demo: $(VENV)/.installed-demo
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m stopgrad_math

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

test: lint
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
