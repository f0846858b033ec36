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
    # No field of any job takes NaN or +-inf (``--set learning_rate=Infinity`` is JSON
    # for inf, YAML has ``.inf`` and ``.nan``; a bound like ``gt=0`` lets inf through):
    # every float, in dicts and lists too, must be a finite number.
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        frozen=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
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

    def lease_unit(self, job: str) -> str:
        """The unit of work a run of ``job`` with this config holds a lease on
        (:mod:`embedfresh.core.leases`): the job itself, once per run."""
        return job

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_path_segment(cls, v: str) -> str:
        return safe_id(v, "run id")

    @field_validator("model")
    @classmethod
    def _model_is_a_path_segment(cls, v: str) -> str:
        return safe_id(v, "model name")


C = TypeVar("C", bound=BaseModel)


def _position(mark: yaml.Mark | None) -> str:
    """``line L, column C`` of a YAML mark, both counted from 1 as editors do."""
    return "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error on one line: where, what, and what the parser was in the middle of
    (``line 3, column 1: expected ',' or ']', but got '<stream end>' (while parsing a
    flow sequence started at line 2, column 6)``). PyYAML's own text spans five lines
    and quotes the document."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())
    where = _position(error.problem_mark or error.context_mark)
    problem = " ".join(str(error.problem or error.context or "syntax error").split())
    text = f"{where}: {problem}" if where else problem
    if error.context and error.problem:
        started = _position(error.context_mark)
        if error.context_mark is not None and started != where:
            text += f" ({error.context} started at {started})"
        else:
            text += f" ({error.context})"
    return text


class _ConfigLoader(yaml.SafeLoader):
    """``yaml.safe_load``, but a key given twice is an error, not "the last one wins"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base`` may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given a second time (first at {_position(first.start_mark)})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


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
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise BadInputError(f"cannot read config {path}: {e}") from e
        except UnicodeDecodeError as e:
            raise BadInputError(
                f"config {path} is not UTF-8 text (byte {e.start}: {e.reason})"
            ) from None
        try:
            loaded = yaml.load(text, _ConfigLoader) if text.strip() else {}  # a SafeLoader
        except yaml.YAMLError as e:
            raise BadInputError(
                f"config {path} is not valid JSON/YAML: {yaml_problem(e)}"
            ) from None
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
