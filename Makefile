# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv (if missing) and install the package from this checkout.
PYTHON ?= python3
# Extras to install: `test` pulls in `diffrax` and `plot` (what the tests and demo import);
# `make test EXTRAS=test,mpi` adds mpi4py (needs an MPI library).
EXTRAS ?= test
VENV   := .venv
PY     := $(VENV)/bin/python
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test test-all bench compat clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

# Everything, the slow tests included.
test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

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
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis demo_schedule.png
