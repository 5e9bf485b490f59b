# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv (if missing) and install the package from this checkout.
PYTHON ?= python3
# Optional extras to install: `make test EXTRAS=test,mpi` adds mpi4py (needs an MPI library).
EXTRAS ?= test
VENV   := .venv
PY     := $(VENV)/bin/python
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: demo test test-all bench clean

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

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis demo_schedule.png
