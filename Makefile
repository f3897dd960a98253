# `make demo` and `make test` do all of the set-up: they create .venv with
# Python 3.11 and install the package (with the test extra for `make test`).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEPS := setup.cfg pyproject.toml

# pip installs without byte-compiling every module of every package (for TensorFlow, PyTorch and JAX most of an
# install's time from pip's cache: 189 s to 88 s for .venv); Python compiles a module when a process first imports
# it and keeps it for the next, so the bytecode cache is not turned off here, whatever the shell says.
PIP_INSTALL := -m pip install --quiet --no-compile
unexport PYTHONDONTWRITEBYTECODE

OLDEST := .venv-oldest
OLDEST_PINS := .ci/oldest.txt
NEWEST_TORCH := .venv-torch-newest

.PHONY: demo test test-oldest test-torch-newest test-mutants test-tfp-sweep lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP_INSTALL) --upgrade pip

# torch==2.13.0 first: pip finds the machine's CPU wheel of it, and the [torch] range then installs nothing
# more (asked for the range alone, pip would take PyPI's newest torch, with some 3 GB of CUDA).
$(VENV)/.installed-demo: $(BIN)/python $(DEPS)
	$(BIN)/python $(PIP_INSTALL) torch==2.13.0
	$(BIN)/python $(PIP_INSTALL) -e ".[tf,jax,torch]"
	touch $@

$(VENV)/.installed-test: $(BIN)/python $(DEPS)
	$(BIN)/python $(PIP_INSTALL) torch==2.13.0
	$(BIN)/python $(PIP_INSTALL) -e ".[tf,jax,torch,keras,pyro,test,notebooks,docs]"
	touch $@

demo: $(VENV)/.installed-demo
	TF_CPP_MIN_LOG_LEVEL=3 $(BIN)/python -m stopgrad_math

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/mypy

# The API reference, README and notebooks as a site in site/; strict: a broken link or cross-reference, or a
# public name without a docstring, fails the build (not --quiet, which hides the warnings that --strict counts).
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 TF_CPP_MIN_LOG_LEVEL=3 $(BIN)/mkdocs build --strict

# Two workers (pytest-xdist), one per core of the CI machine: the suite in about half the time; lint and docs side
# by side too (each is one process). The 25 slowest tests are listed at the end, to keep the CI run's time in view.
test: $(VENV)/.installed-test
	$(MAKE) --no-print-directory -j2 lint docs
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest -n 2 --durations=25

# Deliberately broken variants of the library (tests/project/mutants.py), each of which its tests must catch.
test-mutants: $(VENV)/.installed-test
	TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python tests/project/mutants.py

# Every TFP function that reaches its custom-gradient factory, on the library's decorator beside TFP as it is, in
# tf.function and XLA, with second derivatives of one entry per composition of custom gradients (make test runs
# the eager part, which this leaves out). STOPGRAD_TFP_SWEEP=every takes every entry's second derivative.
test-tfp-sweep: $(VENV)/.installed-test
	STOPGRAD_TFP_SWEEP=full TF_CPP_MIN_LOG_LEVEL=2 $(BIN)/python -m pytest -n 2 -ra tests/tensorflow/test_tfp_sweep.py

# The same suite in an environment of the oldest versions setup.cfg allows; pip's cache is shared with .venv.
$(OLDEST)/bin/python:
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python $(PIP_INSTALL) --upgrade pip

$(OLDEST)/.installed: $(OLDEST)/bin/python $(DEPS) $(OLDEST_PINS)
	$(OLDEST)/bin/python $(PIP_INSTALL) -e ".[tf,jax,torch,keras,pyro,test,notebooks,docs]" -c $(OLDEST_PINS)
	touch $@

# Left out, as make test runs them and an older framework does not change what they check: TFP's own functions
# through the decorator (the sweep and test_inside_tfp.py; both environments have TFP 0.25, and the TFP-style
# grad_fns, pipelines and compatibility tests run here), the notebooks but the one that runs only here (TFP's JAX
# substrate; the others' numbers are checked in make test, and their API by the unit tests), the wheel's build,
# the benchmark harnesses (their reports; every mode's exactness has tests of its own), and the program's banner.
OLDEST_LEFT_OUT := tensorflow/test_tfp_sweep tensorflow/test_inside_tfp project/test_packaging project/test_main \
	tensorflow/test_benchmarks torch/test_benchmarks jax/test_benchmarks
NOTEBOOKS_MAKE_TEST_RUNS := log1pexp known_gradients_in_tfp estimators log1pexp_on_torch \
	implicit_reparameterization
# Here and in test-torch-newest: every test file, half of its test functions, and a fifth of each one's
# parametrized cases (at least one) with 10 of hypothesis's 40 examples, each target from its own offset, so that
# every PyTorch test function runs on one of the two torch versions (STOPGRAD_CASE_SAMPLE, case_sample.py in
# tests/project); make test runs every case. (A tenth of the cases was measured no faster than a fifth: most tests
# have a case or two. Half the functions keeps CI's run within its hour.)
test-oldest: $(OLDEST)/.installed
	STOPGRAD_CASE_SAMPLE=5:0:2 TF_CPP_MIN_LOG_LEVEL=2 $(OLDEST)/bin/python -m pytest -n 2 --durations=25 \
		$(foreach name,$(OLDEST_LEFT_OUT),--ignore=tests/$(name).py) \
		$(foreach name,$(NOTEBOOKS_MAKE_TEST_RUNS),--deselect "tests/project/test_notebooks.py::test_notebook_runs[$(name)]")

# The PyTorch namespace's tests on the newest torch setup.cfg allows, 2.14.1 (make test runs 2.13, test-oldest
# 2.6): a CUDA build, which pip takes from the machine's wheels and which runs on the CPU (some 5 GB installed).
$(NEWEST_TORCH)/bin/python:
	$(PYTHON) -m venv $(NEWEST_TORCH)
	$(NEWEST_TORCH)/bin/python $(PIP_INSTALL) --upgrade pip

$(NEWEST_TORCH)/.installed: $(NEWEST_TORCH)/bin/python $(DEPS)
	$(NEWEST_TORCH)/bin/python $(PIP_INSTALL) torch==2.14.1
	$(NEWEST_TORCH)/bin/python $(PIP_INSTALL) -e ".[torch,pyro,test]"
	touch $@

# The benchmark harness's report is left out here too, as in test-oldest.
test-torch-newest: $(NEWEST_TORCH)/.installed
	STOPGRAD_CASE_SAMPLE=5:1:2 $(NEWEST_TORCH)/bin/python -m pytest -n 2 --durations=10 tests/torch \
		--ignore=tests/torch/test_benchmarks.py

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/python $(PIP_INSTALL) -e ".[bench]"
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py
	$(BIN)/python benchmarks/tf_real_code.py
	$(BIN)/python benchmarks/jax_run.py
	$(BIN)/python benchmarks/jax_real_code.py
	$(BIN)/python benchmarks/jax_implicit.py
	$(BIN)/python benchmarks/torch_run.py
	$(BIN)/python benchmarks/torch_real_code.py
	$(BIN)/python benchmarks/torch_implicit.py
	$(BIN)/python benchmarks/tfp_inside.py

clean:
	rm -rf $(VENV) $(OLDEST) $(NEWEST_TORCH) build site .cache .mypy_cache *.egg-info .pytest_cache .ruff_cache .hypothesis
