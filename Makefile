# `make demo` and `make test` each create .venv from pyproject.toml on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/jaxsal: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(BIN)/jaxsal

.PHONY: venv demo test test-slow
venv: $(BIN)/jaxsal

demo: venv
	$(BIN)/jaxsal demo

test: venv
	$(BIN)/python -m pytest -q -n 2

# the slow tests also need the dopamine extra (Dopamine's own replay buffer, tensorflow): installed
# here only, so `make test` keeps the base dependencies
$(VENV)/.dopamine-extra: $(BIN)/jaxsal
	$(BIN)/pip install --quiet -e ".[test,dopamine]"
	touch $@

test-slow: venv $(VENV)/.dopamine-extra
	$(BIN)/python -m pytest -q -m slow
