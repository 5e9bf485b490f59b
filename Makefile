# Two commands for a fresh machine: `make demo` and `make test` (and `make lint` for the checks).
# Each creates .venv (if missing) and installs the package from this checkout.
PYTHON ?= python3
# Extras to install: `test` pulls in `diffrax` and `plot` (what the tests and demo import), `lint`
# ruff and mypy; `make test EXTRAS=test,lint,mpi` adds mpi4py (needs an MPI library).
EXTRAS ?= test,lint
VENV   := .venv
PY     := $(VENV)/bin/python
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test test-all lint bench compat clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2

# ruff (lint rules and formatting) over the tree, mypy over src/ (configuration: pyproject.toml).
# mypy reads the installed dependencies' types, so the lint extra goes on top of EXTRAS (one
# install when EXTRAS already names it, as the default and .ci/run do).
LINT_EXTRAS := $(if $(filter lint,$(subst $(comma), ,$(EXTRAS))),$(EXTRAS),$(EXTRAS)$(comma)lint)
lint:
	$(MAKE) EXTRAS=$(LINT_EXTRAS) $(VENV)/.installed-$(subst $(comma),-,$(LINT_EXTRAS))
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy src/retrograde

# Everything, the slow tests included.
test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 -m ''

# Opt-in: JAX's and diffrax's own test suites with retrograde substituted (docs/drop-in.md).
# make compat JAX_SRC=path/to/jax DIFFRAX_SRC=path/to/diffrax (either or both; checkouts at the
# installed versions' tags). Long: about an hour per suite on 2 cores.
JAX_SRC ?=
DIFFRAX_SRC ?=
compat:
	$(MAKE) EXTRAS=test,compat $(VENV)/.installed-test-compat
	$(VENV)/bin/python compat/run.py $(if $(JAX_SRC),--jax-src $(JAX_SRC)) \
		$(if $(DIFFRAX_SRC),--diffrax-src $(DIFFRAX_SRC))

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache demo_schedule.png
