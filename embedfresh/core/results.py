"""Result records: what a job returned, kept in the artifact store for whoever started it.

A job that succeeds writes ``runs/{model}/{run_id}/results/{name}.json``
(:func:`embedfresh.core.layout.result`) just before it exits 0: the job's name, the
summary it prints on stdout (the same object), the config it ran with, the attempt id
it was given, when it started and finished, and where it ran. The operator that started
it reads the record back through the same store and returns the summary as the task's
XCom. The store is the one channel every runner shares: a job's stdout reaches the
Airflow worker under the local runner, but lands in a log stream under AWS Batch.

Two things make a record one execution's and nobody else's:

- its **name**, unique per task instance: the operator passes ``--result-name`` (built by
  :func:`result_name` from the DAG id, the task id and the map index), so the mapped
  tasks of one run (one ``embed`` per shard group, all with the same run id) and two
  tasks of the same job kind never write the same object. At a shell it defaults to
  the job's name;
- its **attempt id**, new for every execution (:func:`new_attempt_id`): the operator
  passes ``--attempt-id`` and the job copies it into the record. A record with another
  attempt id was left by an earlier execution, and :func:`read_result` refuses it
  (:class:`StaleResultError`), as it refuses a missing one (:class:`MissingResultError`):
  the job exited 0 without writing its own, so its outcome is unknown and the task is
  retried.

Torch- and Airflow-free: the jobs write records (through :mod:`embedfresh.core.cli`), the
control plane reads them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from embedfresh.core import layout
from embedfresh.core.config.base import JobConfig
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore

#: The job option naming the record (:func:`embedfresh.core.cli.run_job`).
RESULT_NAME_OPTION = "--result-name"
#: The job option carrying the attempt id the record must echo.
ATTEMPT_ID_OPTION = "--attempt-id"

#: Version of the record's shape; a reader refuses records of a newer one.
RECORD_FORMAT = 1

#: Variables AWS Batch sets in a job's container: kept in the record, so the record of a
#: Batch execution names the Batch job (and its attempt) that wrote it.
_EXECUTION_ENV = {
    "AWS_BATCH_JOB_ID": "aws_batch_job_id",
    "AWS_BATCH_JOB_ATTEMPT": "aws_batch_job_attempt",
    "AWS_BATCH_JQ_NAME": "aws_batch_job_queue",
}

#: What AWS Batch tells each child of an array job: its index, 0 to size - 1.
ARRAY_INDEX_ENV = "AWS_BATCH_JOB_ARRAY_INDEX"

_MAX_NAME = 200
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_:+=-]+")


class ResultError(Exception):
    """A job's result record cannot be used; :attr:`url` names the record.

    :param message: what is wrong and what happens next.
    :param url: full URL of the record.
    """

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class MissingResultError(ResultError):
    """The job exited 0 but its record does not exist."""


class StaleResultError(ResultError):
    """The record was written by another execution (another attempt id)."""


class InvalidResultError(ResultError):
    """The record is not a result record this code can read."""


@dataclass(frozen=True)
class ResultTicket:
    """What a job is told on its command line so its record can be found and trusted.

    :param name: the record's name (:func:`result_name`); one path segment.
    :param attempt_id: this execution's id (:func:`new_attempt_id`), echoed in the record.
    """

    name: str
    attempt_id: str

    def __post_init__(self) -> None:
        layout.safe_id(self.name, "result name")
        if not self.attempt_id:
            raise ValueError("a result ticket needs an attempt id")

    def job_args(self) -> list[str]:
        """``--result-name NAME --attempt-id ID``, appended to the job's command line."""
        return [RESULT_NAME_OPTION, self.name, ATTEMPT_ID_OPTION, self.attempt_id]

    def to_dict(self) -> dict[str, str]:
        """JSON-friendly form (what survives a deferral in the trigger's kwargs)."""
        return {"name": self.name, "attempt_id": self.attempt_id}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ResultTicket:
        return cls(name=str(values["name"]), attempt_id=str(values["attempt_id"]))


class ResultRecord(BaseModel):
    """One successful execution of a job, as written to ``results/{name}.json``."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    format: int = RECORD_FORMAT
    name: str
    """The record's name (unique per task instance)."""
    job: str
    """The job's name (``train``, ``embed``, ...)."""
    attempt_id: str | None
    """The attempt id the job was given; None when run without one (at a shell)."""
    summary: Any
    """What the job returned and printed as its last stdout line: the task's XCom."""
    config: dict[str, Any]
    """The validated config the job ran with (defaults filled in)."""
    started_at: dt.datetime
    finished_at: dt.datetime
    execution: dict[str, Any]
    """Where it ran: host, pid, and under AWS Batch the Batch job id and attempt."""


def result_name(task_id: str, *, dag_id: str | None = None, map_index: int | None = None) -> str:
    """The record name of one task instance: ``{dag_id}:{task_id}`` plus ``:{map_index}`` for
    a mapped task (``embedding_model_refresh:embed:3``).

    The DAG id is part of it because two DAGs can share a run id (scheduled runs at the
    same logical date) and a task id. ``:`` appears in neither id, so no two task
    instances share a name. An id with characters a path segment cannot hold, or a name
    over 200 characters, becomes a readable prefix plus a hash of the whole.
    """
    name = ":".join(part for part in (dag_id, task_id) if part)
    if map_index is not None and map_index >= 0:
        name = f"{name}:{map_index}"
    if not name:
        raise ValueError("a result name needs a task id")
    try:
        if len(name) <= _MAX_NAME:
            return layout.safe_id(name, "result name")
    except BadInputError:
        pass
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    readable = _NOT_IN_NAME.sub("-", name)[: _MAX_NAME - 20].strip("-_:+=")
    return f"{readable or 'task'}={digest}"


def child_result_name(name: str, index: int) -> str:
    """The record name of child ``index`` of an array job started with record name ``name``:
    ``{name}+{index}`` (``corpus_embeddings:embed+7``).

    Every child of an AWS Batch array job runs the same command line, so each would
    write the same record; the job adds its own index (:func:`array_child_name`), and
    the operator reads ``+0`` to ``+{size - 1}``. ``+`` appears in no result name the
    operators build (:func:`result_name`), so no child's record is a task's. A name too
    long for the index keeps a prefix and a hash of the whole.
    """
    if index < 0:
        raise ValueError(f"an array index is >= 0, got {index}")
    return suffixed_result_name(name, str(index))


def suffixed_result_name(name: str, suffix: str) -> str:
    """``{name}+{suffix}``: the record of one part of a task's work (an array child, the
    planning step), within the 200 characters of a name (a long ``name`` keeps a prefix
    and a hash of the whole, so two names never meet)."""
    tail = f"+{suffix}"
    if len(name) + len(tail) > _MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = f"{name[: _MAX_NAME - len(tail) - 17]}={digest}"
    return layout.safe_id(f"{name}{tail}", "result name")


def array_child_name(name: str, env: Mapping[str, str] | None = None) -> str:
    """``name`` as this process's result record name: :func:`child_result_name` with
    ``$AWS_BATCH_JOB_ARRAY_INDEX`` in a child of an array job, ``name`` itself elsewhere.

    :raises BadInputError: the variable is set but not a whole number >= 0.
    """
    raw = (os.environ if env is None else env).get(ARRAY_INDEX_ENV, "").strip()
    if not raw:
        return name
    try:
        index = int(raw)
        return child_result_name(name, index)
    except ValueError:
        raise BadInputError(f"{ARRAY_INDEX_ENV} must be a whole number >= 0, got {raw!r}") from None


def new_attempt_id() -> str:
    """A fresh attempt id: random, so no earlier execution's record can carry it."""
    return uuid.uuid4().hex


def execution_facts() -> dict[str, Any]:
    """Where this process runs, for the record: host, pid, and Batch's own job id."""
    facts: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    for var, key in _EXECUTION_ENV.items():
        if os.environ.get(var):
            facts[key] = os.environ[var]
    return facts


def write_result(
    config: JobConfig,
    *,
    job: str,
    name: str,
    attempt_id: str | None,
    summary: Any,
    started_at: dt.datetime,
) -> str:
    """Write the record of a successful execution under the config's run; returns its URL.

    :raises BadInputError: ``name`` is not a valid path segment, or the store refuses it.
    :raises TransientError: the store is unreachable.
    """
    store = ArtifactStore(config.artifact_root)
    rel = layout.result(config.model, config.run_id, name)
    record = ResultRecord(
        name=name,
        job=job,
        attempt_id=attempt_id,
        summary=summary,
        config=config.model_dump(mode="json"),
        started_at=started_at,
        finished_at=dt.datetime.now(dt.UTC),
        execution=execution_facts(),
    )
    store.write_json(rel, record.model_dump(mode="json"))
    return store.url(rel)


def result_location(settings: Mapping[str, Any], name: str) -> tuple[ArtifactStore, str]:
    """The store and path of record ``name`` of a job started with config ``settings``.

    Resolved the way the job resolves its own config (:class:`JobConfig`'s defaults for
    what ``settings`` leaves out), so reader and writer agree.

    :raises BadInputError: the settings' root, model or run id is not valid.
    """
    shared = {k: settings[k] for k in ("artifact_root", "model", "run_id") if k in settings}
    try:
        config = JobConfig.model_validate(shared)
    except ValidationError as e:
        raise BadInputError(f"cannot locate the result record {name!r}: {e}") from None
    return ArtifactStore(config.artifact_root), layout.result(config.model, config.run_id, name)


def read_result(
    settings: Mapping[str, Any], ticket: ResultTicket, job: str
) -> tuple[ResultRecord, str]:
    """The record execution ``ticket`` of ``job`` (started with ``settings``) wrote, and its URL.

    :raises MissingResultError: no record under the ticket's name.
    :raises StaleResultError: the record carries another attempt id (or another job).
    :raises InvalidResultError: the object is not a result record this code reads.
    :raises TransientError: the store is unreachable.
    """
    store, rel = result_location(settings, ticket.name)
    url = store.url(rel)
    try:
        raw = store.read_json(rel)
    except FileNotFoundError:
        raise MissingResultError(
            f"{job} exited 0 but wrote no result record at {url}: it did not reach the end "
            "of embedfresh.core.cli.run_job, or the runner started something else. The "
            "task is retried; the job resumes or skips what is already done",
            url,
        ) from None
    except BadInputError as e:
        raise InvalidResultError(f"result record {url} cannot be read: {e}", url) from e
    try:
        record = ResultRecord.model_validate(raw)
    except ValidationError as e:
        raise InvalidResultError(f"{url} is not a result record: {e}", url) from None
    if record.format > RECORD_FORMAT:
        raise InvalidResultError(
            f"result record {url} has format {record.format}; this reader knows up to "
            f"{RECORD_FORMAT} (the job's image is newer than the operator's)",
            url,
        )
    if record.attempt_id != ticket.attempt_id or record.job != job:
        raise StaleResultError(
            f"result record {url} was left by another execution ({record.job}, attempt "
            f"{record.attempt_id}, finished {record.finished_at.isoformat()}), not by this "
            f"one ({job}, attempt {ticket.attempt_id}), which exited 0 without writing "
            "its own. The task is retried",
            url,
        )
    return record, url
