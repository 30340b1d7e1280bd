# nnatlas: `make generate` (sets up .venv when missing, validates specs, regenerates generated/)
# and `make test`. Everything else builds on the same environment.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nnatlas-installed

.PHONY: all env generate check lint typecheck test docs bench status draft-sweep clean

all: generate test

env: $(STAMP)

# torch first, from the CPU wheel on disk (a plain `torch` would pull a multi-GB CUDA build); every install under
# constraints.txt, the versions the tests ran against (pyproject.toml declares ranges)
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch
	$(PIP) -e '.[test,bench]'
	touch $(STAMP)

generate: $(STAMP)
	$(BIN)/nnatlas generate

# the type check runs over the package nnatlas laid out as installed (links under build/typecheck): mypy
# cannot follow the editable install's import hook, so checked as folders nnatlas.* would not resolve
check: $(STAMP)
	$(BIN)/nnatlas generate --check
	$(BIN)/ruff check compiler runtime generated tests $(wildcard bench)
	$(BIN)/python -m nnatlas.compiler.typecheck

# the browser tests drive Debian's Chromium (never `playwright install`, which downloads browsers)
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" -ne 0 ] && echo sudo)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq --no-install-recommends chromium

# one worker per core (at most 4), a test file per worker at a time (its module fixtures, such as a tiny model
# built once, stay with its tests), handed out in collection order, where tests/conftest.py puts the longest
# files first (xdist's own order, most tests first, started the browser walk last); each worker one thread
test: $(STAMP) $(CHROMIUM)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations=25

# every family's generated tests under each transformers version of pyproject.toml's [tool.nnatlas]
# status-transformers (one venv each under .venv-status/), folded into generated/docs/status.json (committed);
# then generate renders status.html and the index's status row from it. CI runs the pinned version only (make test).
# Then the tensor-parallel column: the TP oracle under torchrun (2 gloo processes) over every family, with .venv's
# own transformers (recorded in status.json)
status: $(STAMP)
	$(BIN)/nnatlas status
	$(BIN)/nnatlas status --tp

docs: $(STAMP)
	$(BIN)/nnatlas docs --out site

bench: $(STAMP)
	$(BIN)/python -m bench

# not in CI: the drafter on every decoder-only causal-LM model type (one process each, one thread, a
# timeout), a table in generated/docs/draft_sweep.md (kept by generate: it carries no generated-file mark)
draft-sweep: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m nnatlas.compiler.draft_sweep --fork --timeout 300

clean:
	rm -rf $(VENV) site artifacts build/typecheck
