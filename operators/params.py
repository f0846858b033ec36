"""The Params every embedfresh DAG offers, with defaults that run the embedded demo on CPU.

DAG files build their ``params`` from these helpers so the Trigger form in the web UI
shows the same names, choices and descriptions everywhere, and works untouched on a
fresh checkout (local artifact store, ``tiny`` model, ``cpu``).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import Param

from operators.constants import ARTIFACT_ROOT_ENV

#: The checkout's folder: the embedded default keeps its artifacts under it.
REPO = Path(__file__).resolve().parent.parent
MODELS = ["tiny", "minilm"]
BACKENDS = ["auto", "cpu", "cuda", "xla", "neuron"]
DEFAULT_MODEL = "tiny"

#: Task arguments every job operator takes from the Params above.
COMMON_JOB_ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "{{ params.backend }}",
}


def default_artifact_root() -> str:
    """``$EMBEDFRESH_ARTIFACT_ROOT`` when set (e.g. ``s3://bucket/prefix`` in production),
    else ``file://<checkout>/artifacts/airflow``. Read when the DAG file is parsed."""
    return os.environ.get(ARTIFACT_ROOT_ENV) or f"file://{REPO / 'artifacts' / 'airflow'}"


def artifact_root_param() -> Param:
    return Param(
        default_artifact_root(),
        type="string",
        description="Artifact store root URL: file:///... or s3://bucket/prefix",
    )


def model_param() -> Param:
    return Param(DEFAULT_MODEL, enum=MODELS, description="Model config name")


def backend_param(default: str = "cpu", description: str = "Accelerator backend") -> Param:
    return Param(default, enum=BACKENDS, description=description)


def common_params() -> dict[str, Param]:
    """``artifact_root``, ``model`` and ``backend``: what :data:`COMMON_JOB_ARGS` reads."""
    return {
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "backend": backend_param(),
    }
