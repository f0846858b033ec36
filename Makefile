# Two commands do all set-up on a fresh machine:  make demo  and  make test.
# Both create (once) and reuse .venv from the pinned requirements.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PJRT_DEVICE ?= CPU
export PYTHONUNBUFFERED := 1

.PHONY: venv demo test lint lock clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

## The full pipeline end to end on the embedded default (CPU, local artifact folder).
demo: $(STAMP)
	$(PY) scripts/demo.py

## Lint, format check and the whole test suite.
test: lint
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## Re-resolve requirements.txt / requirements-dev.txt from the *.in files.
lock: $(STAMP)
	$(PY) scripts/lock.py

clean:
	rm -rf artifacts airflow-home .pytest_cache
