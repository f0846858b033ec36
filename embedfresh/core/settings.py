"""Names and defaults that the data plane and the control plane must agree on.

One source for each: the artifact-root variable and its default, the backend names and
their implementations (the backend registry), the execution-mode (runner) names.
Torch-free and Airflow-free, so DAG files, the web UI and every job read the same values.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

#: The environment variable every component reads the artifact root from: the Airflow
#: components (DAG Params, the web UI), the jobs they start, and remote containers.
MODEL_PRESETS: tuple[str, ...] = ("tiny", "minilm")
"""Built-in model names (:mod:`embedfresh.ml.model.presets`); any other model is a team's
own, published with ``python -m embedfresh.jobs.publish_model``."""

ARTIFACT_ROOT_ENV = "EMBEDFRESH_ARTIFACT_ROOT"

#: Folder of the embedded default store, under Airflow's home.
DEFAULT_STORE_DIR = "embedfresh-artifacts"


def default_artifact_root() -> str:
    """``$EMBEDFRESH_ARTIFACT_ROOT`` when set (``s3://bucket/prefix`` in production), else
    ``file://$AIRFLOW_HOME/embedfresh-artifacts`` (Airflow's own default home ``~/airflow``
    when ``AIRFLOW_HOME`` is unset).

    Airflow's home, not the checkout or the working directory: the same folder whether
    the package is installed or run from a clone, and the same for the scheduler, the
    web UI and a job the worker starts (they share ``AIRFLOW_HOME``). Read at call
    time, never cached.
    """
    root = os.environ.get(ARTIFACT_ROOT_ENV)
    if root:
        return root
    home = os.environ.get("AIRFLOW_HOME") or str(Path("~/airflow").expanduser())
    return f"file://{Path(home).resolve() / DEFAULT_STORE_DIR}"


#: The backend a job resolves on its host (:func:`embedfresh.ml.backends.detect`).
AUTO_BACKEND = "auto"

#: The backend registry: each accelerator backend's name and its implementation, as
#: ``"module:Class"`` (a subclass of :class:`embedfresh.ml.backends.Backend`). Strings,
#: so the control plane reads the names without importing torch; the ML library imports
#: a module only when a job builds its backend. A new backend is one module under
#: ``embedfresh/ml/backends/`` and one line here.
BACKEND_IMPLEMENTATIONS: Mapping[str, str] = MappingProxyType(
    {
        "cpu": "embedfresh.ml.backends.eager:EagerBackend",
        "cuda": "embedfresh.ml.backends.eager:EagerBackend",
        "xla": "embedfresh.ml.backends.xla:XlaBackend",
        "neuron": "embedfresh.ml.backends.xla:XlaBackend",
    }
)

#: The backend names a job accepts and the DAGs offer: ``auto`` and every registered one.
BACKENDS: tuple[str, ...] = (AUTO_BACKEND, *BACKEND_IMPLEMENTATIONS)


def load_implementation(spec: str) -> Any:
    """The object a ``"package.module:attribute"`` string names, its module imported now.

    :raises ValueError: ``spec`` is not of that form.
    :raises ImportError: the module does not import.
    :raises AttributeError: the module has no such attribute.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"implementation {spec!r} is not 'package.module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


class ExecutionMode(StrEnum):
    """Where a job runs (the runner). The operator says *what* to run; the mode says
    *where*. Each name has a runner registered in :mod:`embedfresh.operators.runners`."""

    LOCAL = "local"
    """A subprocess on the Airflow worker (embedded demo, tests, a single box)."""

    AWS_BATCH = "aws_batch"
    """An AWS Batch job, single-node or multi-node parallel (production trn1/p5 fleets)."""


#: The vector index a release is loaded into (:mod:`embedfresh.core.index`): a libpq
#: connection string of a PostgreSQL with pgvector (RDS, Aurora). Read from the
#: environment only, never from a config or a command line (``ps``, a Batch job's
#: command, a task's rendered fields would show it); the operators set it from an Airflow
#: connection, a Batch job definition from its secrets. Unset: the embedded server.
INDEX_DSN_ENV = "EMBEDFRESH_INDEX_DSN"

#: Where the embedded index server keeps its data; default ``.index/postgres`` under a
#: ``file://`` artifact root (an ``s3://`` root needs this or :data:`INDEX_DSN_ENV`).
INDEX_DIR_ENV = "EMBEDFRESH_INDEX_DIR"

#: How many releases a model keeps (the live one included): rollback reaches them, the
#: garbage collection keeps what they reference.
KEEP_RELEASES_ENV = "EMBEDFRESH_KEEP_RELEASES"
DEFAULT_KEEP_RELEASES = 3


def keep_releases() -> int:
    """``$EMBEDFRESH_KEEP_RELEASES`` (default 3): releases kept per model, at least 1.

    :raises ValueError: not a whole number >= 1.
    """
    raw = os.environ.get(KEEP_RELEASES_ENV, "").strip()
    try:
        value = int(raw) if raw else DEFAULT_KEEP_RELEASES
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{KEEP_RELEASES_ENV}={raw!r} is not a whole number >= 1")
    return value
