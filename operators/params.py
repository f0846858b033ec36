"""The Params every embedfresh DAG offers, with defaults that run the embedded demo on CPU.

DAG files build their ``params`` from these helpers so the Trigger form in the web UI
shows the same names, choices and descriptions everywhere, and works untouched on a
fresh checkout (local artifact store, ``tiny`` model, ``cpu``).
"""

from __future__ import annotations

from airflow.sdk import Param

from embedfresh.core.settings import BACKENDS, MODEL_PRESETS, default_artifact_root

MODELS = list(MODEL_PRESETS)
DEFAULT_MODEL = "tiny"

#: Task arguments every job operator takes from the Params above.
COMMON_JOB_ARGS = {
    "artifact_root": "{{ params.artifact_root }}",
    "model": "{{ params.model }}",
    "backend": "{{ params.backend }}",
}


def artifact_root_param() -> Param:
    """The store root; its default (:func:`~embedfresh.core.settings.default_artifact_root`)
    is read when the DAG file is parsed."""
    return Param(
        default_artifact_root(),
        type="string",
        description="Artifact store root URL: file:///... or s3://bucket/prefix",
    )


def model_param() -> Param:
    return Param(
        DEFAULT_MODEL,
        type="string",
        examples=MODELS,
        pattern=r"^[A-Za-z0-9._:+=-]{1,200}$",
        description="Model name: a preset (tiny, minilm) or your own model, published with "
        "python -m embedfresh.jobs.publish_model",
    )


def gate_metrics_param() -> Param:
    """The metrics that must all pass the quality gate; default: the gate job's own."""
    from embedfresh.core.config import GateConfig

    return Param(
        GateConfig.model_fields["metrics"].default_factory(),
        type="array",
        items={"type": "string"},
        minItems=1,
        description="Metrics that must all pass the quality gate (accuracy, auc, log_loss, "
        "recall_at_10): the ones your model is judged by",
    )


def backend_param(default: str = "cpu", description: str = "Accelerator backend") -> Param:
    return Param(default, enum=list(BACKENDS), description=description)


def common_params() -> dict[str, Param]:
    """``artifact_root``, ``model`` and ``backend``: what :data:`COMMON_JOB_ARGS` reads."""
    return {
        "artifact_root": artifact_root_param(),
        "model": model_param(),
        "backend": backend_param(),
    }
