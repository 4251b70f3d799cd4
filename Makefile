# The verbs a newcomer looks for. Each sets up .venv from the project's own files first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench chaos clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## the crash-resume demo on embedded SQLite
	$(VENV)/bin/ratchet demo

test: $(STAMP)  ## the whole suite, SQLite and PostgreSQL
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .ratchet .pytest_cache .mypy_cache .ruff_cache
