# The verbs a newcomer looks for. Each sets up .venv from the project's own files first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run demo test lint typecheck-scripts bench chaos package-check docs docs-check clean

# The distribution was called ratchet before ratchet-engine: an older .venv drops that
# install and its metadata before installing under the new name.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip uninstall -q -y ratchet 2>/dev/null || true
	rm -rf src/ratchet.egg-info
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## ratchet server on embedded SQLite, the crash-resume demo through its API, then serving until Ctrl-C; PORT=N for another port
	$(VENV)/bin/ratchet demo --serve $(if $(PORT),--port $(PORT))

demo: $(STAMP)  ## the crash-resume demo in the terminal, on embedded SQLite
	$(VENV)/bin/ratchet demo

test: $(STAMP)  ## the whole suite, SQLite and PostgreSQL
	$(PY) -m pytest $(PYTEST_ARGS)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)  ## Ratchet beside DBOS, Absurd and LangGraph; QUICK=1 for a short run
	$(PY) -m bench.run $(if $(filter-out 0,$(QUICK)),--quick)

chaos: $(STAMP)  ## fault-injection campaigns on both backends; LONG=1 for the long one
	$(PY) -m chaos.run $(if $(filter-out 0,$(LONG)),--long)

package-check: $(STAMP)  ## build, install the wheel in a fresh venv, run the demo and PostgreSQL from it
	.ci/package-check $(PY)

# MkDocs' plugins print banners about MkDocs' future on every build; these turn them off.
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs

docs: $(STAMP)  ## the documentation site, served at http://127.0.0.1:8000 as you edit
	$(MKDOCS) serve

docs-check: $(STAMP)  ## build the site with warnings as errors (broken links, references)
	$(MKDOCS) build --strict

# The Python the linters read: the package, its tests, benchmarks, campaigns and examples.
LINTED := src tests examples bench chaos docs/scripts

lint: $(STAMP)  ## ruff (lint, format), mypy (strict on src; tests, bench, chaos checked), the layers
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory typecheck-scripts

typecheck-scripts: $(STAMP)  ## mypy over tests, bench and chaos (part of lint)
	$(VENV)/bin/mypy $(MYPY_SCRIPTS)

# tests, bench and chaos as mypy reads them (pyproject.toml's overrides say how strictly):
# each test module under its path (tests.test_x), the helpers and apps in tests/support
# under the flat names the tests and the worker scripts import them by (mypy_path).
MYPY_SCRIPTS := tests bench chaos

clean:
	rm -rf $(VENV) .ratchet .pytest_cache .mypy_cache .ruff_cache site
