"""The exit-code contract shared by every job and mapped by every runner.

| code | meaning                                   | Airflow reaction                  |
|------|-------------------------------------------|-----------------------------------|
| 0    | done                                      | success                           |
| 2    | bad input or config                       | fail, no retry                    |
| 3    | quality gate refused the model            | fail, no retry, production intact |
| 4    | health check found a faulty device/link   | fail before training              |
| 75   | transient infrastructure fault            | retry (resume picks up the work)  |
| else | bug or crash                              | retry per the task's policy       |
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    BAD_INPUT = 2
    GATE_REFUSED = 3
    UNHEALTHY = 4
    TRANSIENT = 75


class JobError(Exception):
    """Base of the errors a job reports with a specific exit code."""

    exit_code: ExitCode = ExitCode.BAD_INPUT


class BadInputError(JobError):
    """Bad input or config: wrong params, malformed files, missing partitions."""

    exit_code = ExitCode.BAD_INPUT


class GateRefusedError(JobError):
    """The quality gate did not pass the candidate."""

    exit_code = ExitCode.GATE_REFUSED


class UnhealthyError(JobError):
    """A health check found a faulty device or link."""

    exit_code = ExitCode.UNHEALTHY


class TransientError(JobError):
    """An infrastructure fault worth retrying (storage unreachable, throttled)."""

    exit_code = ExitCode.TRANSIENT


class ConflictError(JobError):
    """A compare-and-swap lost against a concurrent writer; retrying will not help."""

    exit_code = ExitCode.BAD_INPUT
