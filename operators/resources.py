"""What a DAG's job task may hold, and where it runs: the accelerator pool, a time limit
and the runner, per step.

Both are deployment settings read when a DAG file is parsed, so every DAG gets them the
same way (``**task_resources("train")``):

- **The accelerator pool.** Steps that hold the worker's devices while they run (health,
  compile, train, parity) take a slot of the Airflow pool named by
  ``EMBEDFRESH_ACCELERATOR_POOL`` (default ``embedfresh_accelerator``, one slot), so two
  DAGs never train, compile or check on one device at once: a ``fleet_health`` run
  waits while a refresh trains. A deferred step (an AWS Batch job waited on by the
  triggerer) frees its slot: the pool counts deferred tasks only when made with
  ``--include-deferred``, which embedfresh never asks for. Airflow does not schedule a
  task whose pool does not exist: ``make demo``, ``make airflow``, docker-compose.yaml's
  init and the test Airflows create it (:func:`pool_command`). ``EMBEDFRESH_ACCELERATOR_POOL=default_pool``
  opts out (Airflow's own pool, 128 slots).
- **The runner** (:func:`step_runner`): ``EMBEDFRESH_EXECUTION_MODE`` (``local`` by
  default, ``aws_batch``) puts every DAG's job steps on one runner, with per-step AWS
  Batch queues and definitions (``EMBEDFRESH_BATCH_<STEP>_JOB_QUEUE``, ...).
- **A time limit per step** (``execution_timeout``): :data:`STEP_TIMEOUTS` by default,
  ``EMBEDFRESH_TIMEOUT_<STEP>_SECONDS`` (``EMBEDFRESH_TIMEOUT_TRAIN_SECONDS=28800``) to
  change one. A task past its limit fails and is retried per its policy (train resumes
  from its last checkpoint); a deferred Batch step defers with the same limit.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

#: Environment variable naming the accelerator pool.
POOL_ENV = "EMBEDFRESH_ACCELERATOR_POOL"
#: The pool's default name, and its slots when embedfresh creates it.
DEFAULT_POOL = "embedfresh_accelerator"
DEFAULT_POOL_SLOTS = 1
#: Steps that hold the worker's accelerator while they run.
ACCELERATOR_STEPS = frozenset({"health", "compile", "train", "parity", "parity_a", "parity_b"})

_H = 3600
#: Default time limits in seconds, by step: a bound on a stuck task, well inside the
#: refresh's 6-hour deadline for the short steps, the longest steps their own budget.
STEP_TIMEOUTS: dict[str, int] = {
    "health": 30 * 60,
    "compile": 2 * _H,
    "train": 6 * _H,
    "parity": 6 * _H,
    "parity_a": 6 * _H,
    "parity_b": 6 * _H,
    "parity_compare": 2 * _H,
    "evaluate": 2 * _H,
    "gate": 2 * _H,
    "embed": 6 * _H,
    "verify": 1 * _H,
    "load_index": 2 * _H,
    "search_check": 1 * _H,
    "release": 30 * 60,
    "rollback": 30 * 60,
    "garbage_collect": 1 * _H,
    "corpus_sync": 1 * _H,
}


def accelerator_pool() -> str:
    """The pool accelerator steps take a slot of (:data:`POOL_ENV`)."""
    name = os.environ.get(POOL_ENV, "").strip() or DEFAULT_POOL
    if len(name) > 256:
        raise ValueError(f"{POOL_ENV} must be an Airflow pool name, got {name!r}")
    return name


def env_seconds(var: str) -> dt.timedelta | None:
    """The duration in environment variable ``var`` (seconds), None when unset or empty:
    the one reader of every duration setting (time limits, the deadline, the wait).

    :raises ValueError: not a positive number of seconds, naming ``var``.
    """
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):  # also refuses nan
        raise ValueError(f"{var} must be a positive number of seconds, got {raw!r}")
    return dt.timedelta(seconds=seconds)


def step_timeout(step: str) -> dt.timedelta:
    """The time limit of ``step``: ``EMBEDFRESH_TIMEOUT_<STEP>_SECONDS`` or its default.

    :raises ValueError: a step without a default, or a setting that is not a positive
        number of seconds (named in the message), when the DAG file is parsed.
    """
    if step not in STEP_TIMEOUTS:
        raise ValueError(f"no time limit for step {step!r}: one of {sorted(STEP_TIMEOUTS)}")
    given = env_seconds(f"EMBEDFRESH_TIMEOUT_{step.upper()}_SECONDS")
    return given or dt.timedelta(seconds=STEP_TIMEOUTS[step])


#: Environment variable naming the runner every DAG's job steps run on: ``local``
#: (default), ``aws_batch`` or a registered runner's name.
EXECUTION_MODE_ENV = "EMBEDFRESH_EXECUTION_MODE"
#: The AWS Batch settings read from the environment, by field of
#: :class:`~embedfresh.operators.runners.BatchSettings`: ``EMBEDFRESH_BATCH_<FIELD>`` for
#: every step, ``EMBEDFRESH_BATCH_<STEP>_<FIELD>`` for one (``EMBEDFRESH_BATCH_TRAIN_JOB_QUEUE``).
BATCH_FIELDS: dict[str, type] = {
    "job_queue": str,
    "job_definition": str,
    "num_nodes": int,
    "share_identifier": str,
    "instance_type": str,
    "poll_interval": float,
}


def step_runner(step: str, execution_mode: str | None = None) -> dict[str, Any]:
    """Where a job step runs, one deployment setting for every DAG: ``{}`` for the local
    runner (the default), else ``execution_mode`` and the runner's settings.

    For ``aws_batch`` each :data:`BATCH_FIELDS` setting comes from
    ``EMBEDFRESH_BATCH_<STEP>_<FIELD>``, else ``EMBEDFRESH_BATCH_<FIELD>``: train on a
    trn1 multi-node queue (``EMBEDFRESH_BATCH_TRAIN_JOB_QUEUE``,
    ``EMBEDFRESH_BATCH_TRAIN_NUM_NODES=2``), embed on an inf2 or CPU queue, the rest on
    the default. Read when the DAG file is parsed.

    :param execution_mode: this step's runner whatever the deployment's default (an AWS
        Batch array job runs on ``aws_batch``); None: :data:`EXECUTION_MODE_ENV`.
    :raises ValueError: ``aws_batch`` without a job queue or definition for the step, or
        a setting that is not a number where one is needed, naming the variables.
    """
    mode = execution_mode or os.environ.get(EXECUTION_MODE_ENV, "").strip() or "local"
    if mode == "local":
        return {}
    settings: dict[str, Any] = {}
    for field, kind in BATCH_FIELDS.items():
        names = (
            f"EMBEDFRESH_BATCH_{step.upper()}_{field.upper()}",
            f"EMBEDFRESH_BATCH_{field.upper()}",
        )
        var, raw = next(
            ((n, os.environ[n]) for n in names if os.environ.get(n, "").strip()), (None, None)
        )
        if raw is None:
            continue
        try:
            settings[field] = kind(raw.strip())
        except ValueError:
            raise ValueError(f"{var} must be a {kind.__name__}, got {raw!r}") from None
    if mode == "aws_batch":
        missing = [f for f in ("job_queue", "job_definition") if f not in settings]
        if missing:
            wanted = " and ".join(f"EMBEDFRESH_BATCH_{f.upper()}" for f in missing)
            raise ValueError(
                f"{EXECUTION_MODE_ENV}=aws_batch needs {wanted} (or per step, "
                f"EMBEDFRESH_BATCH_{step.upper()}_<...>) for the {step} step"
            )
    return (
        {"execution_mode": mode, "runner_settings": settings}
        if settings
        else {"execution_mode": mode}
    )


#: Environment variable: how a corpus's embed step fans out (``mapped`` or ``array``).
FAN_OUT_ENV = "EMBEDFRESH_EMBED_FAN_OUT"
#: Environment variable: the most children of an embed array job.
MAX_CHILDREN_ENV = "EMBEDFRESH_EMBED_MAX_CHILDREN"


def embed_fan_out() -> str:
    """How the DAGs' embed step fans out over a corpus's shards, a deployment setting
    (:data:`FAN_OUT_ENV`, read when a DAG file is parsed: the graph differs): ``mapped``
    (default; one task per shard group, any runner) or ``array`` (one AWS Batch array
    job per corpus, ``BatchArrayEmbeddingOperator``, its children slices of the corpus).

    :raises ValueError: another value, naming the variable.
    """
    fan_out = os.environ.get(FAN_OUT_ENV, "").strip() or "mapped"
    if fan_out not in ("mapped", "array"):
        raise ValueError(f"{FAN_OUT_ENV} must be mapped or array, got {fan_out!r}")
    return fan_out


def embed_max_children() -> int:
    """The default most children of an embed array job (:data:`MAX_CHILDREN_ENV`, 1,000)."""
    raw = os.environ.get(MAX_CHILDREN_ENV, "").strip() or "1000"
    if not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise ValueError(f"{MAX_CHILDREN_ENV} must be a whole number 1-10000, got {raw!r}")
    return int(raw)


def task_resources(step: str, execution_mode: str | None = None) -> dict[str, Any]:
    """The task arguments of a job step: its ``execution_timeout``, the accelerator pool
    for :data:`ACCELERATOR_STEPS`, and the runner the deployment names, or
    ``execution_mode`` (:func:`step_runner`)."""
    args: dict[str, Any] = {
        "execution_timeout": step_timeout(step),
        **step_runner(step, execution_mode),
    }
    if step in ACCELERATOR_STEPS:
        args["pool"] = accelerator_pool()
    return args


def pool_command(slots: int = DEFAULT_POOL_SLOTS) -> list[str] | None:
    """The Airflow CLI command that creates (or updates) the accelerator pool; None when
    the setting names Airflow's ``default_pool`` (left as it is)."""
    if accelerator_pool() == "default_pool":
        return None
    return [
        "airflow", "pools", "set", accelerator_pool(), str(slots),
        "embedfresh: steps that hold an accelerator (health, compile, train, parity)",
    ]  # fmt: skip
