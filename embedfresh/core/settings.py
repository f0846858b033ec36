"""Names and defaults that the data plane and the control plane must agree on.

One source for each: the artifact-root variable and its default, the backend names,
the execution-mode (runner) names. Torch-free and Airflow-free, so DAG files, the web
UI and every job read the same values.
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

#: The environment variable every component reads the artifact root from: the Airflow
#: components (DAG Params, the web UI), the jobs they start, and remote containers.
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


class Backend(StrEnum):
    """Accelerator backends. Each name has an implementation registered in
    :mod:`embedfresh.ml.backends` (``auto`` picks one of them on the host)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    XLA = "xla"
    NEURON = "neuron"


BACKENDS: tuple[str, ...] = tuple(b.value for b in Backend)


class ExecutionMode(StrEnum):
    """Where a job runs (the runner). The operator says *what* to run; the mode says
    *where*. Each name has a runner registered in :mod:`embedfresh.operators.runners`."""

    LOCAL = "local"
    """A subprocess on the Airflow worker (embedded demo, tests, a single box)."""

    AWS_BATCH = "aws_batch"
    """An AWS Batch job, single-node or multi-node parallel (production trn1/p5 fleets)."""
