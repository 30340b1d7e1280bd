# nnatlas: `make generate` (sets up .venv when missing, validates specs, regenerates generated/)
# and `make test`. Everything else builds on the same environment.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.nnatlas-installed

.PHONY: all env generate check lint typecheck test docs bench clean

all: generate test

env: $(STAMP)

# torch first, from the CPU wheel on disk (a plain `torch` would pull a multi-GB CUDA build)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

generate: $(STAMP)
	$(BIN)/nnatlas generate

check: $(STAMP)
	$(BIN)/nnatlas generate --check
	$(BIN)/ruff check compiler runtime generated tests $(wildcard bench)
	$(BIN)/mypy compiler runtime generated/families

test: $(STAMP)
	$(BIN)/python -m pytest

docs: $(STAMP)
	$(BIN)/nnatlas docs --out site

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) site artifacts
