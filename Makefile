# Three commands do all set-up on a fresh machine:  make demo,  make airflow  and  make test.
# All create (once) and reuse .venv from the pinned requirements.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PJRT_DEVICE ?= CPU
export PYTHONUNBUFFERED := 1

# The project-local Airflow that `make demo` and `make airflow` share (SQLite, no examples).
# Set only for those two targets: the test suite makes its own throw-away Airflows.
AIRFLOW_PORT ?= 8080
DEMO_ROOT := $(CURDIR)/artifacts/demo
LOCAL_AIRFLOW_HOME ?= $(CURDIR)/airflow-home
# The simple auth manager's generated passwords: Airflow opens the file with the process's
# umask (0644, readable by every local user), so `make airflow` creates it 0600 first.
PASSWORDS_FILE := $(LOCAL_AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated
LOCAL_AIRFLOW := AIRFLOW_HOME=$(LOCAL_AIRFLOW_HOME) \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$(LOCAL_AIRFLOW_HOME)/airflow.db \
	AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=$(PASSWORDS_FILE) \
	EMBEDFRESH_ARTIFACT_ROOT=file://$(DEMO_ROOT) \
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH"

.PHONY: venv demo airflow test lint lock clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

## embedding_model_refresh through Airflow (dag.test) for two days on the embedded default
## (CPU, tiny model, artifacts/demo, ./airflow-home), then a summary.
demo: $(STAMP)
	env $(LOCAL_AIRFLOW) $(PY) scripts/demo.py --root $(DEMO_ROOT) --airflow-home $(LOCAL_AIRFLOW_HOME)

## Airflow's web UI with the project's DAGs and plugins on http://127.0.0.1:$(AIRFLOW_PORT),
## same AIRFLOW_HOME and artifact root as `make demo` (its runs show up). Ctrl-C stops it.
## The API server listens on 127.0.0.1 only; the log servers of the scheduler and the
## triggerer (ports 8793, 8794) listen on every interface: Airflow 3.3 hard-codes their
## host (README "Local security").
airflow: $(STAMP)
	@mkdir -p $(LOCAL_AIRFLOW_HOME)
	@(umask 077 && touch $(PASSWORDS_FILE)) && chmod 600 $(PASSWORDS_FILE)
	@echo "Airflow web UI: http://127.0.0.1:$(AIRFLOW_PORT)  login: admin, password printed by standalone"
	@echo "  below and kept in $(PASSWORDS_FILE) (mode 0600)"
	@# The pool the DAGs' device steps take (operators/resources.py): Airflow schedules no
	@# task of a pool that does not exist.
	env $(LOCAL_AIRFLOW) $(VENV)/bin/airflow db migrate > /dev/null
	env $(LOCAL_AIRFLOW) $(VENV)/bin/airflow pools set embedfresh_accelerator 1 \
		"embedfresh: steps that hold an accelerator (health, compile, train, parity)" > /dev/null
	env $(LOCAL_AIRFLOW) \
	AIRFLOW__API__HOST=127.0.0.1 \
	AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$(AIRFLOW_PORT)/execution/ \
	AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin \
	AIRFLOW__CORE__PARALLELISM=4 \
	EMBEDFRESH_PARTITION_WAIT_SECONDS=$${EMBEDFRESH_PARTITION_WAIT_SECONDS:-120} \
	$(VENV)/bin/airflow standalone

## Lint, format check, import contracts and the whole test suite, in two pytest-xdist
## workers (a test file stays on one worker: module fixtures are built once). Most tests
## wait on subprocesses, servers and polls, so two workers overlap that waiting even on a
## 2-core box (docs/BENCHMARKS.md, "The test suite"). Files go out slowest first, and a
## test over 120 s fails unless listed (tests/suite_time.py). TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

## ruff, then the import contracts ([tool.importlinter] in pyproject.toml) with lint-imports
## on the tree laid out as it installs (scripts/lint_imports.py).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/lint_imports.py

## Re-resolve requirements.txt / requirements-dev.txt from the *.in files.
lock: $(STAMP)
	$(PY) scripts/lock.py

clean:
	rm -rf artifacts airflow-home .pytest_cache
