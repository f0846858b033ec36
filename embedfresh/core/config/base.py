"""The config base every job shares: pydantic models read from JSON/YAML, one error type.

Every job takes ``--config FILE`` and any number of ``--set key=value`` overrides
(the value parsed as JSON when it parses, else taken as a string), so the Airflow
operators and a person at a shell build the same objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.layout import safe_id
from embedfresh.core.settings import default_artifact_root


class JobConfig(BaseModel):
    """What every job shares: where artifacts live, which model, which run."""

    # The string literal under a field is its description (``--help`` lists them).
    model_config = ConfigDict(
        extra="forbid", protected_namespaces=(), frozen=True, use_attribute_docstrings=True
    )

    artifact_root: str = Field(default_factory=default_artifact_root)
    """Root URL of the artifact store: ``file:///...`` or ``s3://bucket/prefix``. Default:
    ``$EMBEDFRESH_ARTIFACT_ROOT``, else ``$AIRFLOW_HOME/embedfresh-artifacts``."""
    model: str = "tiny"
    """Model name, the key of its registry and versions: a preset (``tiny``, ``minilm``)
    or a team's own model published with ``python -m embedfresh.jobs.publish_model``."""
    run_id: str = "manual"
    """Stable across retries of one task, so a retry resumes instead of restarting."""
    backend: str = "cpu"
    """Accelerator backend: ``auto``, ``cpu``, ``cuda``, ``xla`` or ``neuron``."""

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_path_segment(cls, v: str) -> str:
        return safe_id(v, "run id")

    @field_validator("model")
    @classmethod
    def _model_is_a_path_segment(cls, v: str) -> str:
        return safe_id(v, "model name")


C = TypeVar("C", bound=BaseModel)


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise BadInputError(f"--set expects key=value, got {item!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def load_config(cls: type[C], path: str | None = None, overrides: list[str] = ()) -> C:
    """Build ``cls`` from a JSON/YAML file plus ``key=value`` overrides.

    :raises BadInputError: unreadable file, unknown keys, wrong types or values.
    """
    data: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise BadInputError(f"cannot read config {path}: {e}") from e
        try:
            loaded = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as e:
            raise BadInputError(f"config {path} is not valid JSON/YAML: {e}") from e
        if not isinstance(loaded, dict):
            raise BadInputError(f"config {path} must be a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    for item in overrides:
        key, value = parse_override(item)
        data[key] = value
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(config)'}: {err['msg']}"
            for err in e.errors()
        )
        raise BadInputError(f"invalid {cls.__name__}: {problems}") from None
